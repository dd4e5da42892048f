//! `csi-addons-manager`: the controllers for the CSI-Addons custom resources.

#![forbid(unsafe_code)]

use clap::Parser;

/// Command line of `csi-addons-manager`.
#[derive(Parser, Debug)]
#[command(name = "csi-addons-manager", version = build_info::LONG_VERSION, about = "CSI-Addons controller manager")]
pub struct Cli {}

/// Runs the manager.
pub fn run(_cli: Cli) -> anyhow::Result<()> {
    anyhow::bail!("the controllers are not implemented yet (issue: Operator core)")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn version_names_the_workspace_version_and_commit() {
        let version = super::Cli::command().render_version();
        assert!(version.starts_with(&format!("csi-addons-manager {} (commit ", build_info::VERSION)), "{version}");
    }
}
