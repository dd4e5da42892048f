use clap::Parser;

fn main() -> anyhow::Result<()> {
    sidecar::run_sidecar(sidecar::SidecarCli::parse())
}
