//! `csi-addons-sidecar`, the container beside every CSI driver, and `csi-addons`, the CLI that
//! calls a driver's CSI-Addons socket directly.

#![forbid(unsafe_code)]

use clap::Parser;

/// Command line of `csi-addons-sidecar`.
#[derive(Parser, Debug)]
#[command(name = "csi-addons-sidecar", version = build_info::LONG_VERSION, about = "CSI-Addons sidecar")]
pub struct SidecarCli {}

/// Command line of `csi-addons`.
#[derive(Parser, Debug)]
#[command(name = "csi-addons", version = build_info::LONG_VERSION, about = "Call a CSI-Addons driver directly")]
pub struct Cli {}

/// Runs the sidecar.
pub fn run_sidecar(_cli: SidecarCli) -> anyhow::Result<()> {
    anyhow::bail!("the sidecar is not implemented yet (issue: Sidecar)")
}

/// Runs one CLI operation.
pub fn run_cli(_cli: Cli) -> anyhow::Result<()> {
    anyhow::bail!("the CLI is not implemented yet (issue: Sidecar)")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn versions_name_the_workspace_version_and_commit() {
        for (name, version) in [
            ("csi-addons-sidecar", super::SidecarCli::command().render_version()),
            ("csi-addons", super::Cli::command().render_version()),
        ] {
            assert!(version.starts_with(&format!("{name} {} (commit ", build_info::VERSION)), "{version}");
        }
    }
}
