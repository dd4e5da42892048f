fn main() -> anyhow::Result<()> {
    cluster_client::tls::install_crypto_provider();
    Ok(sidecar::run_sidecar(sidecar::SidecarCli::parse_args())?)
}
