//! A reference CSI driver with every CSI-Addons service, so the whole system runs and is tested on
//! one machine without external storage.
//!
//! One binary serves CSI Identity, Controller and Node (as `--mode` says) on `--endpoint`; volumes
//! are sparse files under `--state-dir`, whose `state.json` survives restarts and crashes.

#![forbid(unsafe_code)]

pub mod addons;
pub mod attach;
pub mod cidr;
pub mod controller;
pub mod driver;
pub mod h2_authority;
pub mod identity;
pub mod mounts;
pub mod node;
pub mod paging;
pub mod profiles;
pub mod registrar;
pub mod server;
pub mod snapshots;
pub mod space;
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
    /// The CSI-Addons endpoint, `unix:///path/to/csi-addons.sock`.
    #[arg(long, env = "CSI_ADDONS_ENDPOINT", default_value = "unix:///csi/csi-addons.sock")]
    pub addons_endpoint: String,
    /// Plugin name, in reverse-domain form.
    #[arg(long, env = "DRIVER_NAME", default_value = "reference.csi-addons-rs.io")]
    pub driver_name: String,
    /// This node's ID.
    #[arg(long, env = "NODE_ID")]
    pub node_id: String,
    /// This node's IP address (the downward API's status.hostIP): registered as a fence client,
    /// and publishing is refused while it is fenced.
    #[arg(long, env = "NODE_IP")]
    pub node_ip: Option<std::net::IpAddr>,
    /// Where volumes and state are kept.
    #[arg(long, env = "STATE_DIR", default_value = "/csi-data-dir")]
    pub state_dir: PathBuf,
    /// Total capacity for volumes, in bytes.
    #[arg(long, env = "CAPACITY_BYTES", default_value_t = 100 << 30)]
    pub capacity_bytes: i64,
    /// Which services to run.
    #[arg(long, env = "MODE", value_enum, default_value_t = Mode::Both)]
    pub mode: Mode,
    /// How filesystem volumes are kept: `loop` (a sparse file, loop-attached and ext4-formatted),
    /// `directory` (a plain directory, bind-mounted), or `auto`: loop where the machine allows it
    /// (root, /dev/loop-control, mkfs.ext4), else directories.
    #[arg(long, env = "FILESYSTEM_BACKEND", value_enum, default_value_t = driver::FilesystemBackend::Auto)]
    pub filesystem_backend: driver::FilesystemBackend,
    /// Log as JSON lines instead of plain text.
    #[arg(long, env = "LOG_JSON")]
    pub log_json: bool,
    /// Also serve CSI Identity alone (GetPluginInfo with the storage profiles, Probe) on this TCP
    /// address, for the driver operator: read-only, and nothing else is reachable there.
    #[arg(long, env = "IDENTITY_ADDRESS")]
    pub identity_address: Option<std::net::SocketAddr>,
}

/// How long calls in flight may take to finish once a shutdown begins.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the driver until SIGINT or SIGTERM, then removes its sockets.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        runtime_support::shutdown::signal().await;
        let _ = stop.send(true);
    });
    serve(cli, stopped).await
}

/// Serves CSI and CSI-Addons until `stop` turns true.
pub async fn serve(cli: Cli, stop: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
    let csi_socket = server::socket_path(&cli.endpoint).map_err(anyhow::Error::msg)?;
    let addons_socket = server::socket_path(&cli.addons_endpoint).map_err(anyhow::Error::msg)?;
    let driver = Driver::open(Config {
        name: cli.driver_name,
        node_id: cli.node_id,
        node_ip: cli.node_ip,
        state_dir: cli.state_dir,
        capacity_bytes: cli.capacity_bytes,
        mode: cli.mode,
        directories: cli.filesystem_backend.directories(),
    })?;
    if driver.config.mode.node() {
        register_node(&driver).await?;
    }
    let mut csi_routes =
        tonic::service::Routes::new(csi::identity_server::IdentityServer::new(identity::Identity(driver.clone())));
    if driver.config.mode.controller() {
        csi_routes = csi_routes
            .add_service(csi::controller_server::ControllerServer::new(controller::Controller(driver.clone())));
    }
    if driver.config.mode.node() {
        csi_routes = csi_routes.add_service(csi::node_server::NodeServer::new(node::Node(driver.clone())));
    }
    let identity_server = identity_endpoint(cli.identity_address, &driver, stop.clone()).await?;
    let csi_incoming = server::bind(&csi_socket)?;
    let addons_incoming = server::bind(&addons_socket)?;
    tracing::info!(csi = %csi_socket.display(), addons = %addons_socket.display(), mode = ?driver.config.mode, "serving");
    let until_stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let csi_server = tonic::transport::Server::builder()
        .layer(server::LogFailuresLayer)
        .add_routes(csi_routes)
        .serve_with_incoming_shutdown(csi_incoming, until_stopped(stop.clone()));
    let addons_server = tonic::transport::Server::builder()
        .layer(server::LogFailuresLayer)
        .add_routes(addons::routes(&driver))
        .serve_with_incoming_shutdown(addons_incoming, until_stopped(stop.clone()));
    let stop_schedule = stop.clone();
    let mut stop_drain = stop;
    let schedule = async {
        if driver.config.mode.controller() {
            addons::replication::Replicator(driver.clone()).run_schedule(stop_schedule).await;
        }
    };
    let serving = async { tokio::join!(csi_server, addons_server, schedule, identity_server) };
    // Calls in flight get a grace period to finish; clients that merely keep their connections
    // open must not keep the driver from exiting.
    let drain_deadline = async {
        let _ = stop_drain.wait_for(|s| *s).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let (csi_result, addons_result) = tokio::select! {
        (csi, addons, (), ()) = serving => (csi, addons),
        () = drain_deadline => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "connections still open after the grace period; stopping anyway");
            (Ok(()), Ok(()))
        }
    };
    let _ = std::fs::remove_file(&csi_socket);
    let _ = std::fs::remove_file(&addons_socket);
    csi_result?;
    addons_result?;
    tracing::info!("stopped");
    Ok(())
}

/// Serves CSI Identity alone on `address` (TCP) until `stop`; nothing when no address is given.
async fn identity_endpoint(
    address: Option<std::net::SocketAddr>,
    driver: &std::sync::Arc<Driver>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let listener = match address {
        Some(address) => {
            Some(tokio::net::TcpListener::bind(address).await.map_err(|e| anyhow::anyhow!("binding {address}: {e}"))?)
        }
        None => None,
    };
    let identity = csi::identity_server::IdentityServer::new(identity::Identity(driver.clone()));
    Ok(async move {
        let Some(listener) = listener else { return };
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let served = tonic::transport::Server::builder()
            .layer(server::LogFailuresLayer)
            .add_service(identity)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the identity endpoint failed");
        }
    })
}

/// Records this node plugin: as a node volumes can be attached to, and, with its address, as a
/// storage client that GetFenceClients reports.
async fn register_node(driver: &std::sync::Arc<Driver>) -> anyhow::Result<()> {
    let address = driver.config.node_ip.map(|ip| cidr::Cidr::from(ip).to_string());
    let node_id = driver.config.node_id.clone();
    driver
        .update(|state| {
            state.nodes.insert(node_id.clone());
            if let Some(address) = address {
                state.clients.insert(node_id, vec![address]);
            }
            Ok(())
        })
        .await
        .map_err(|status| anyhow::anyhow!("registering the node plugin: {}", status.message()))
}

/// Logs to stderr, as JSON lines when `json`, at `info` unless `RUST_LOG` says otherwise, through
/// the shipped binaries' one set-up (`runtime_support::logging`). Both of the crate's binaries
/// start with it.
pub fn init_logging(json: bool) {
    runtime_support::logging::init(tracing_subscriber::filter::LevelFilter::INFO, json, None);
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
