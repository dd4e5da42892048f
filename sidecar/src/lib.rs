//! `csi-addons-sidecar`, the container beside every CSI driver, and `csi-addons`, the CLI that
//! calls a driver's CSI-Addons socket directly.

#![forbid(unsafe_code)]

pub mod cli;
pub mod condition;
pub mod connect;
pub mod csi_pv;
pub mod driver;
pub mod flags;
pub mod guard;
pub mod http;
pub mod metrics;
pub mod registration;
pub mod resolve;
pub mod run;
pub mod server;

pub use flags::SidecarCli;

/// Runs the sidecar on one thread: it relays calls and waits on the network, so more threads
/// would buy nothing but memory (each thread that allocates gets its own malloc arena).
pub fn run_sidecar(cli: SidecarCli) -> Result<(), run::SidecarError> {
    run::init_logging(&cli)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(2)
        .enable_all()
        .build()
        .map_err(run::SidecarError::Runtime)?;
    runtime.block_on(run::run(cli))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn versions_name_the_workspace_version_and_commit() {
        for (name, version) in [
            ("csi-addons-sidecar", super::SidecarCli::command().render_version()),
            ("csi-addons", super::cli::Cli::command().render_version()),
        ] {
            assert!(version.starts_with(&format!("{name} {} (commit ", build_info::VERSION)), "{version}");
        }
    }
}
