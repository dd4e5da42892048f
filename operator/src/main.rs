use clap::Parser;

fn main() -> anyhow::Result<()> {
    operator::run(operator::Cli::parse())
}
