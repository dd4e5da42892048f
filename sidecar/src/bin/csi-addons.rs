#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sidecar::cli::run(sidecar::cli::parse()).await
}
