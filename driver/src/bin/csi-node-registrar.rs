use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = reference_driver::registrar::Cli::parse();
    reference_driver::init_logging(cli.log_json);
    reference_driver::registrar::run(cli, runtime_support::shutdown::signal()).await?;
    Ok(())
}
