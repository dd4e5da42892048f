fn main() -> anyhow::Result<()> {
    Ok(sidecar::run_sidecar(sidecar::SidecarCli::parse_args())?)
}
