#[tokio::main]
async fn main() -> anyhow::Result<()> {
    cluster_client::tls::install_crypto_provider();
    sidecar::cli::run(sidecar::cli::parse()).await
}
