use clap::Parser;

fn main() -> anyhow::Result<()> {
    reference_driver::run(reference_driver::Cli::parse())
}
