fn main() -> anyhow::Result<()> {
    cluster_client::tls::install_crypto_provider();
    let cli = driver_operator::Cli::parse_args();
    let level = match cli.verbosity {
        0..=3 => tracing_subscriber::filter::LevelFilter::INFO,
        4..=5 => tracing_subscriber::filter::LevelFilter::DEBUG,
        _ => tracing_subscriber::filter::LevelFilter::TRACE,
    };
    runtime_support::logging::init(level, cli.log_json, None);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(driver_operator::run(cli))?;
    Ok(())
}
