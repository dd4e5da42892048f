use clap::Parser;

fn main() -> anyhow::Result<()> {
    sidecar::run_cli(sidecar::Cli::parse())
}
