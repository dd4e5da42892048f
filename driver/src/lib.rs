//! A reference CSI driver with every CSI-Addons service, so the whole system runs and is tested on
//! one machine without external storage.

#![forbid(unsafe_code)]

use clap::Parser;

/// Command line of `reference-driver`.
#[derive(Parser, Debug)]
#[command(name = "reference-driver", version = build_info::LONG_VERSION, about = "Reference CSI + CSI-Addons driver")]
pub struct Cli {}

/// Runs the driver.
pub fn run(_cli: Cli) -> anyhow::Result<()> {
    anyhow::bail!("the driver is not implemented yet (issue: Reference driver)")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn version_names_the_workspace_version_and_commit() {
        let version = super::Cli::command().render_version();
        assert!(version.starts_with(&format!("reference-driver {} (commit ", build_info::VERSION)), "{version}");
    }
}
