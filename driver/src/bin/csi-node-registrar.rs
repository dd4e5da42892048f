use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = reference_driver::registrar::Cli::parse();
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    );
    if cli.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    reference_driver::registrar::run(cli, api::shutdown::signal()).await?;
    Ok(())
}
