fn main() -> anyhow::Result<()> {
    cluster_client::tls::install_crypto_provider();
    operator::run(operator::ManagerCli::parse_args())
}
