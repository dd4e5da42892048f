//! A node registrar: tells the kubelet where a CSI driver's node socket is, through the kubelet's
//! plugin registration API, as Kubernetes' node-driver-registrar does, and with its flags. The
//! cluster suite runs it beside the reference driver in the node Pods: no node-driver-registrar
//! version is served by the Go module proxy, so none can be built here. Users run the upstream
//! image; the shipped manifests name it.
//!
//! The kubelet watches its `plugins_registry` directory. For a new socket there it calls
//! `GetInfo` (the driver's name, the socket path the kubelet dials, the CSI versions), then tells
//! the outcome with `NotifyRegistrationStatus`. A refused registration ends the process, so the
//! container restarts and tries again, as node-driver-registrar does.
use std::path::{Path, PathBuf};
use std::time::Duration;

use api::proto::csi::v1 as csi;
use api::proto::pluginregistration as reg;
use clap::Parser;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

/// Command line of `csi-node-registrar` (node-driver-registrar's flags).
#[derive(Parser, Debug)]
#[command(name = "csi-node-registrar", version = build_info::LONG_VERSION, about = "Registers a CSI node plugin with the kubelet")]
pub struct Cli {
    /// The driver's CSI socket as this container sees it (a path or `unix:///path`).
    #[arg(long = "csi-address", alias = "csi_address", env = "CSI_ADDRESS", default_value = "/run/csi/socket")]
    pub csi_address: String,
    /// The driver's CSI socket as the kubelet sees it on the node.
    #[arg(long = "kubelet-registration-path", env = "KUBELET_REGISTRATION_PATH")]
    pub kubelet_registration_path: String,
    /// The kubelet's plugin registration directory, as this container sees it.
    #[arg(long = "plugin-registration-path", env = "PLUGIN_REGISTRATION_PATH", default_value = "/registration")]
    pub plugin_registration_path: PathBuf,
    /// How long to wait for the driver's GetPluginInfo before trying again.
    #[arg(long, env = "TIMEOUT", default_value = "15s", value_parser = go_flags::parse_go_duration)]
    pub timeout: Duration,
    /// Log as JSON lines.
    #[arg(long, env = "LOG_JSON")]
    pub log_json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    #[error("{0:?} is not a Unix socket path")]
    Address(String),
    #[error("serving the registration socket {path}: {source}")]
    Serve { path: PathBuf, source: std::io::Error },
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("the kubelet refused to register {driver}: {message}")]
    Refused { driver: String, message: String },
}

/// The socket file the kubelet finds in its registration directory.
pub fn registration_socket(dir: &Path, driver: &str) -> PathBuf {
    dir.join(format!("{driver}-reg.sock"))
}

/// What `GetInfo` answers.
pub fn plugin_info(driver: &str, endpoint: &str) -> reg::PluginInfo {
    reg::PluginInfo {
        r#type: "CSIPlugin".into(),
        name: driver.into(),
        endpoint: endpoint.into(),
        supported_versions: vec!["1.0.0".into()],
    }
}

struct Registration {
    info: reg::PluginInfo,
    outcome: mpsc::UnboundedSender<Result<(), String>>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(&self, _: Request<reg::InfoRequest>) -> Result<Response<reg::PluginInfo>, Status> {
        tracing::info!(driver = %self.info.name, endpoint = %self.info.endpoint, "the kubelet asked for the plugin's info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let outcome = if status.plugin_registered { Ok(()) } else { Err(status.error) };
        let _ = self.outcome.send(outcome);
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// The driver's name from its GetPluginInfo, retried until the driver answers.
async fn driver_name(address: &str, timeout: Duration) -> String {
    let uri = if address.starts_with("unix:") { address.to_owned() } else { format!("unix://{address}") };
    loop {
        let answer = async {
            let channel = tonic::transport::Endpoint::from_shared(uri.clone())?.connect().await?;
            let mut identity = csi::identity_client::IdentityClient::new(channel);
            let info = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(info.into_inner().name)
        };
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(name)) if !name.is_empty() => return name,
            Ok(Ok(_)) => tracing::warn!(address, "the driver's GetPluginInfo named no driver; asking again"),
            Ok(Err(e)) => tracing::warn!(address, error = %e, "the driver did not answer GetPluginInfo yet"),
            Err(_) => tracing::warn!(address, ?timeout, "GetPluginInfo timed out"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The connections `listener` accepts, each through [`crate::h2_authority::relay`], which makes
/// the kubelet's `:authority` one the gRPC server takes.
fn relayed(
    mut listener: tokio_stream::wrappers::UnixListenerStream,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<tokio::io::DuplexStream>> {
    use tokio_stream::StreamExt;
    let (connections, incoming) = mpsc::channel(4);
    tokio::spawn(async move {
        while let Some(accepted) = listener.next().await {
            let socket = match accepted {
                Ok(socket) => socket,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection on the registration socket");
                    // Out of file descriptors, say: try again later, not in a busy loop.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let (relay_end, server_end) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                if let Err(e) = crate::h2_authority::relay(socket, relay_end).await {
                    tracing::warn!(error = %e, "a registration connection ended");
                }
            });
            if connections.send(Ok(server_end)).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(incoming)
}

/// Registers the driver and serves the registration socket until `stop`, or until the kubelet
/// refuses the registration.
pub async fn run(cli: Cli, stop: impl Future<Output = ()> + Send + 'static) -> Result<(), RegistrarError> {
    if !Path::new(cli.kubelet_registration_path.trim_start_matches("unix://")).is_absolute() {
        return Err(RegistrarError::Address(cli.kubelet_registration_path));
    }
    let driver = driver_name(&cli.csi_address, cli.timeout).await;
    let path = registration_socket(&cli.plugin_registration_path, &driver);
    let listener = crate::server::bind(&path).map_err(|source| RegistrarError::Serve { path: path.clone(), source })?;
    let (outcome, mut outcomes) = mpsc::unbounded_channel();
    let registration = Registration { info: plugin_info(&driver, &cli.kubelet_registration_path), outcome };
    tracing::info!(driver, socket = %path.display(), "waiting for the kubelet");
    let (refused_tx, refused_rx) = tokio::sync::oneshot::channel::<RegistrarError>();
    let watch_outcomes = {
        let driver = driver.clone();
        async move {
            while let Some(outcome) = outcomes.recv().await {
                match outcome {
                    Ok(()) => tracing::info!(driver, "registered with the kubelet"),
                    Err(message) => {
                        let _ = refused_tx.send(RegistrarError::Refused { driver: driver.clone(), message });
                        return;
                    }
                }
            }
        }
    };
    tokio::spawn(watch_outcomes);
    let refused = async move {
        match refused_rx.await {
            Ok(error) => Some(error),
            Err(_) => std::future::pending().await,
        }
    };
    let server = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(registration))
        .serve_with_incoming_shutdown(relayed(listener), stop);
    let result = tokio::select! {
        served = server => served.map_err(RegistrarError::from),
        Some(error) = refused => Err(error),
    };
    // The kubelet forgets a plugin whose socket goes.
    let _ = std::fs::remove_file(&path);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_is_told_the_socket_it_dials() {
        let info =
            plugin_info("reference.csi-addons-rs.io", "/var/lib/kubelet/plugins/reference.csi-addons-rs.io/csi.sock");
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.supported_versions, ["1.0.0"]);
        assert_eq!(
            registration_socket(Path::new("/registration"), &info.name),
            Path::new("/registration/reference.csi-addons-rs.io-reg.sock")
        );
    }
}
