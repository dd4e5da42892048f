use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = reference_driver::Cli::parse();
    reference_driver::init_logging(cli.log_json);
    reference_driver::run(cli).await
}
