//! `csi-addons-manager`: the controllers for the CSI-Addons custom resources.

#![forbid(unsafe_code)]

pub mod annotations;
pub mod config;
pub mod cronjob;
pub mod flags;
pub mod job;
pub mod pool;
pub mod schedule;
pub mod sidecar_client;
pub mod volume_health;

pub use flags::ManagerCli;

/// Runs the manager.
pub fn run(cli: ManagerCli) -> anyhow::Result<()> {
    let _settings = config::Settings::from_flags(&cli);
    anyhow::bail!("the controllers are not implemented yet (issue: Operator core)")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn version_names_the_workspace_version_and_commit() {
        let version = super::ManagerCli::command().render_version();
        assert!(version.starts_with(&format!("csi-addons-manager {} (commit ", build_info::VERSION)), "{version}");
    }
}
