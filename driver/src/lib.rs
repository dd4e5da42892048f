//! A reference CSI driver with every CSI-Addons service, so the whole system runs and is tested on
//! one machine without external storage.
//!
//! One binary serves CSI Identity, Controller and Node (as `--mode` says) on `--endpoint`; volumes
//! are sparse files under `--state-dir`, whose `state.json` survives restarts and crashes.

#![forbid(unsafe_code)]

pub mod controller;
pub mod driver;
pub mod identity;
pub mod mounts;
pub mod node;
pub mod server;
pub mod state;
pub mod volumes;

use std::path::PathBuf;

use api::proto::csi::v1 as csi;
use clap::Parser;

use crate::driver::{Config, Driver, Mode};

/// Command line of `reference-driver`.
#[derive(Parser, Debug)]
#[command(name = "reference-driver", version = build_info::LONG_VERSION, about = "Reference CSI + CSI-Addons driver")]
pub struct Cli {
    /// The CSI endpoint, `unix:///path/to/csi.sock`.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,
    /// Plugin name, in reverse-domain form.
    #[arg(long, env = "DRIVER_NAME", default_value = "reference.csi-addons-rs.io")]
    pub driver_name: String,
    /// This node's ID.
    #[arg(long, env = "NODE_ID")]
    pub node_id: String,
    /// Where volumes and state are kept.
    #[arg(long, env = "STATE_DIR", default_value = "/csi-data-dir")]
    pub state_dir: PathBuf,
    /// Total capacity for volumes, in bytes.
    #[arg(long, env = "CAPACITY_BYTES", default_value_t = 100 << 30)]
    pub capacity_bytes: i64,
    /// Which services to run.
    #[arg(long, env = "MODE", value_enum, default_value_t = Mode::Both)]
    pub mode: Mode,
    /// Log as JSON lines instead of plain text.
    #[arg(long, env = "LOG_JSON")]
    pub log_json: bool,
}

/// Runs the driver until SIGINT or SIGTERM, then removes its socket.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let socket = server::socket_path(&cli.endpoint).map_err(anyhow::Error::msg)?;
    let driver = Driver::open(Config {
        name: cli.driver_name,
        node_id: cli.node_id,
        state_dir: cli.state_dir,
        capacity_bytes: cli.capacity_bytes,
        mode: cli.mode,
    })?;
    let incoming = server::bind(&socket)?;
    tracing::info!(endpoint = %socket.display(), mode = ?driver.config.mode, "serving CSI");
    let mut routes =
        tonic::service::Routes::new(csi::identity_server::IdentityServer::new(identity::Identity(driver.clone())));
    if driver.config.mode.controller() {
        routes =
            routes.add_service(csi::controller_server::ControllerServer::new(controller::Controller(driver.clone())));
    }
    if driver.config.mode.node() {
        routes = routes.add_service(csi::node_server::NodeServer::new(node::Node(driver.clone())));
    }
    let served = tonic::transport::Server::builder()
        .layer(server::LogFailuresLayer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown_signal())
        .await;
    let _ = std::fs::remove_file(&socket);
    served?;
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
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
