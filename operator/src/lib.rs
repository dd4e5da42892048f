//! `csi-addons-manager`: the controllers for the CSI-Addons custom resources.

#![forbid(unsafe_code)]

pub mod cache_ready;
pub mod claim;
pub mod compact;
pub mod config;
pub mod controllers;
pub mod core;
pub mod events;
pub mod flags;
pub mod future_sizes;
pub mod manager;
pub mod metrics;
pub mod names;
pub mod primitives;
pub mod pv_drivers;
pub mod schedule;
pub mod sidecars;

pub use flags::ManagerCli;

/// Runs the manager until SIGINT or SIGTERM.
pub fn run(cli: ManagerCli) -> anyhow::Result<()> {
    let Some(level) = cli.log_level() else {
        anyhow::bail!("--zap-log-level {:?}: use debug, info, error or a number", cli.zap_log_level);
    };
    runtime_support::logging::init(level, cli.json_logs(), None);
    // One thread: the manager waits on the network; a single thread keeps one allocator arena and
    // no cross-thread hand-offs (memory is what a cluster-wide controller costs its users).
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(manager::ManagerError::Runtime)?;
    Ok(runtime.block_on(manager::run(cli))?)
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
