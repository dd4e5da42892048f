fn main() -> anyhow::Result<()> {
    sidecar::run_sidecar(sidecar::SidecarCli::parse_args())
}
