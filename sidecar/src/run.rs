//! The sidecar's process: flags checked, then the driver connection, registration, leader
//! election, the controller-facing gRPC server and the optional HTTP server, all stopped by one
//! shutdown signal.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::driver::{DriverConnection, DriverInfo, DriverState, Probing};
use crate::flags::SidecarCli;
use crate::guard::{Authenticator, GuardLayer};
use crate::http;
use crate::metrics::Metrics;
use crate::registration::{self, Identity};
use crate::server::{Backend, Leadership};
use server_tls::{CertSource, TlsSettings};

/// How long calls in flight may take to finish once a shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the sidecar could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("--{flag} is required ({hint})")]
    MissingFlag { flag: &'static str, hint: &'static str },
    #[error("--controller-port {0:?} is not a port number")]
    BadPort(String),
    #[error("--controller-ip {0:?} is not an IP address")]
    BadIp(String),
    #[error("no cluster access (KUBECONFIG, in-cluster or ~/.kube/config): {0}")]
    Kube(#[source] cluster_client::ClientError),
    #[error("--csi-addons-address {address}: {source}")]
    DriverAddress {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error(transparent)]
    Tls(#[from] server_tls::TlsError),
    #[error("listening on {address}: {source}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("serving gRPC: {0}")]
    Serve(#[source] tonic::transport::Error),
    #[error("the driver connection was lost ({0}) and --exit-on-driver-loss is set")]
    DriverLost(crate::driver::Unusable),
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("opening --log_file {path}: {source}")]
    LogFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Recorder(#[from] crate::condition::UnknownRecorder),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Logs to stderr, plain or JSON, and to `--log_file` too when given; `-v` picks the level unless
/// RUST_LOG is set. A log file that cannot be opened stops the start, as upstream's does: a
/// rotation set up for a file that stays empty would hide the sidecar's log from whoever reads it.
pub fn init_logging(cli: &SidecarCli) -> Result<(), SidecarError> {
    let file = match &cli.log_file {
        Some(path) if !path.as_os_str().is_empty() => Some(
            runtime_support::logging::append_to(path)
                .map_err(|source| SidecarError::LogFile { path: path.display().to_string(), source })?,
        ),
        _ => None,
    };
    runtime_support::logging::init(cli.verbosity, cli.json_logs(), file);
    Ok(())
}

/// The listening address and the downward-API identity, checked before anything starts.
fn checked_flags(cli: &SidecarCli) -> Result<(SocketAddr, Identity), SidecarError> {
    for (value, flag, hint) in [
        (&cli.node_id, "node-id", "the node name, e.g. from spec.nodeName"),
        (&cli.controller_port, "controller-port", "the port the controller calls, e.g. 9070"),
        (&cli.pod, "pod", "this Pod's name, from metadata.name"),
        (&cli.namespace, "namespace", "this Pod's namespace, from metadata.namespace"),
        (&cli.pod_uid, "pod-uid", "this Pod's UID, from metadata.uid"),
    ] {
        if value.trim().is_empty() {
            return Err(SidecarError::MissingFlag { flag, hint });
        }
    }
    let port: u16 = cli.controller_port.parse().map_err(|_| SidecarError::BadPort(cli.controller_port.clone()))?;
    let ip = if cli.controller_ip.is_empty() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        cli.controller_ip.parse().map_err(|_| SidecarError::BadIp(cli.controller_ip.clone()))?
    };
    let identity = Identity {
        pod: cli.pod.clone(),
        namespace: cli.namespace.clone(),
        pod_uid: cli.pod_uid.clone(),
        node_id: cli.node_id.clone(),
        endpoint: registration::endpoint(&cli.controller_ip, &cli.pod, &cli.namespace, &cli.controller_port),
    };
    Ok((SocketAddr::new(ip, port), identity))
}

/// Runs until SIGINT or SIGTERM (or, with `--exit-on-driver-loss`, until the driver goes away).
pub async fn run(cli: SidecarCli) -> Result<(), SidecarError> {
    let (listen, identity) = checked_flags(&cli)?;
    // TLS problems (missing files, unknown ciphers) are start-up errors, before any waiting.
    let tls_config = if cli.enable_auth {
        let source = CertSource::from_flags(cli.tls_cert_file.as_deref(), cli.tls_key_file.as_deref())?;
        let settings = TlsSettings {
            min_version: cli.tls_min_version.clone(),
            cipher_suites: cli.tls_cipher_suites.clone(),
            curves: cli.tls_curve_preferences.clone(),
        };
        if matches!(source, CertSource::SelfSigned) {
            tracing::warn!(
                "serving a self-signed certificate made at start (as upstream does): the controller cannot verify \
                 it; give --tls-cert-file and --tls-key-file to serve a certificate it can"
            );
        }
        Some(server_tls::server_config(&source, &settings)?)
    } else {
        tracing::warn!("--enable-auth=false: serving plain TCP without authentication");
        None
    };
    let recorders = crate::condition::RecorderKind::parse_list(&cli.volume_condition_recorders)?;
    let metrics = Metrics::new()?;
    let client = cluster_client::client(
        &cluster_client::user_agent("csi-addons-sidecar", env!("CARGO_PKG_VERSION")),
        cli.kubeconfig.as_deref(),
        cluster_client::Options::default(),
    )
    .await
    .map_err(SidecarError::Kube)?;

    let (stop_tx, stop) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let on_signal = stop_tx.clone();
    tokio::spawn(async move {
        runtime_support::shutdown::signal().await;
        tracing::info!("shutting down");
        on_signal.send_replace(true);
    });

    let probing = Probing { timeout: cli.timeout, ..Probing::default() };
    let driver = DriverConnection::start(&cli.csi_addons_address, probing)
        .map_err(|source| SidecarError::DriverAddress { address: cli.csi_addons_address.clone(), source })?;
    let (registered_tx, registered) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    if !cli.http_address.is_empty() {
        let listener = tokio::net::TcpListener::bind(&cli.http_address)
            .await
            .map_err(|source| SidecarError::Listen { address: cli.http_address.clone(), source })?;
        let status = http::Status { driver: driver.state(), registered: registered.clone(), metrics: metrics.clone() };
        tracing::info!(address = %cli.http_address, "serving /healthz, /readyz and /metrics");
        let stop = stop.clone();
        tasks.spawn(async move {
            if let Err(e) = http::serve(listener, status, stop).await {
                tracing::error!(error = %e, "the HTTP server failed");
            }
        });
    }
    let lost = watch_driver_state(&driver, &metrics, cli.exit_on_driver_loss, &stop_tx);

    tracing::info!(address = %cli.csi_addons_address, "waiting for the driver");
    let info = tokio::select! {
        info = first_ready(&driver) => info,
        () = wait(stop.clone()) => return Ok(()),
    };
    tracing::info!(driver = %info.name, version = %info.vendor_version, capabilities = ?info.capabilities, "driver ready");

    watch_gauge(registered.clone(), metrics.registered.clone(), &mut tasks);
    tasks.spawn(registration::keep_registered(
        client.clone(),
        identity,
        info.name.clone(),
        registered_tx,
        stop.clone(),
    ));
    if cli.enable_volume_condition {
        // Upstream reads a fixed kubelet path; --csi-address names the socket wherever it is.
        // [differs: condition-csi-address]
        let csi_address = cli.csi_address.clone().unwrap_or_else(|| {
            format!("unix://{}/plugins/{}/csi.sock", cli.kubelet_dir.trim_end_matches('/'), info.name)
        });
        let reporter = crate::condition::Reporter {
            client: client.clone(),
            driver: info.name.clone(),
            node_id: cli.node_id.clone(),
            csi_address,
            kubelet_dir: cli.kubelet_dir.clone().into(),
            staging_root: cli.stagingpath.clone(),
            interval: cli.volume_condition_interval.max(Duration::from_secs(1)),
            recorders,
        };
        tasks.spawn(reporter.run(stop.clone()));
    }
    let leadership = if info.capabilities.iter().any(|c| c == "service.CONTROLLER_SERVICE") {
        let namespace =
            if cli.leader_election_namespace.is_empty() { &cli.namespace } else { &cli.leader_election_namespace };
        elect(client.clone(), namespace, &info.name, &cli, &metrics, &stop, &mut tasks)
    } else {
        Leadership::NotElecting
    };

    let backend = Arc::new(Backend::new(
        driver.channel(),
        client.clone(),
        cli.node_id.clone(),
        cli.stagingpath.clone(),
        cli.kubelet_dir.clone(),
        cli.csi_address.clone(),
        leadership,
        metrics.clone(),
    ));
    let auth = cli.enable_auth.then(|| Arc::new(Authenticator::new(client.clone(), &cli.allowed_identities)));
    if auth.is_some() {
        tracing::info!(allowed = ?cli.allowed_identities, "calls need a bearer token of an allowed identity");
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| SidecarError::Listen { address: listen.to_string(), source })?;
    tracing::info!(address = %listen, tls = tls_config.is_some(), "serving the controller");
    let server = tonic::transport::Server::builder()
        .layer(GuardLayer::new(auth, metrics.clone()))
        .add_routes(crate::server::routes(backend));
    let serving = async {
        match tls_config {
            Some(config) => {
                server.serve_with_incoming_shutdown(tls_incoming(listener, config), wait(stop.clone())).await
            }
            None => {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                server.serve_with_incoming_shutdown(incoming, wait(stop.clone())).await
            }
        }
    };
    // Calls in flight get a grace period; clients that merely keep connections open must not
    // keep the sidecar from exiting.
    let drain_deadline = async {
        wait(stop.clone()).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let served = tokio::select! {
        served = serving => served.map_err(SidecarError::Serve),
        () = drain_deadline => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "connections still open after the grace period; stopping anyway");
            Ok(())
        }
    };
    stop_tx.send_replace(true);
    // Registration, election (which releases the Lease) and the HTTP server end on `stop`.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while tasks.join_next().await.is_some() {} }).await;
    served?;
    if let Some(reason) = lost.borrow().clone() {
        return Err(SidecarError::DriverLost(reason));
    }
    tracing::info!("stopped");
    Ok(())
}

async fn wait(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn first_ready(driver: &DriverConnection) -> DriverInfo {
    let mut state = driver.state();
    loop {
        if let DriverState::Ready(info) = &*state.borrow_and_update() {
            return info.clone();
        }
        if state.changed().await.is_err() {
            // The watching task only ends when the connection is dropped, which it is not here.
            std::future::pending::<()>().await;
        }
    }
}

/// Keeps the driver-ready gauge current and logs transitions; with `exit_on_loss`, a lost
/// driver stops the sidecar and the returned receiver says why.
fn watch_driver_state(
    driver: &DriverConnection,
    metrics: &Metrics,
    exit_on_loss: bool,
    stop: &Arc<watch::Sender<bool>>,
) -> watch::Receiver<Option<crate::driver::Unusable>> {
    let (lost_tx, lost) = watch::channel(None);
    let mut state = driver.state();
    let gauge = metrics.driver_ready.clone();
    let stop = stop.clone();
    tokio::spawn(async move {
        loop {
            let current = state.borrow_and_update().clone();
            gauge.set(i64::from(current.is_ready()));
            if let DriverState::Lost { reason } = &current {
                tracing::warn!(%reason, "the driver connection was lost; reconnecting");
                if exit_on_loss {
                    lost_tx.send_replace(Some(reason.clone()));
                    stop.send_replace(true);
                    return;
                }
            }
            if state.changed().await.is_err() {
                return;
            }
            if state.borrow().is_ready() {
                tracing::info!("the driver is ready");
            }
        }
    });
    lost
}

fn watch_gauge(mut source: watch::Receiver<bool>, gauge: prometheus::IntGauge, tasks: &mut tokio::task::JoinSet<()>) {
    tasks.spawn(async move {
        loop {
            gauge.set(i64::from(*source.borrow_and_update()));
            if source.changed().await.is_err() {
                return;
            }
        }
    });
}

/// Competes for the driver's Lease (`<normalized driver>-csi-addons`, held under the normalized
/// Pod name, which is what upstream's controller looks up) in the background; until the election
/// has started (the API server may be unreachable) this sidecar is not the holder. Losing the
/// Lease stops controller operations while the sidecar keeps competing; upstream exits instead.
/// [differs: sidecar-keeps-running]
fn elect(
    client: kube::Client,
    namespace: &str,
    driver: &str,
    cli: &SidecarCli,
    metrics: &Metrics,
    stop: &watch::Receiver<bool>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Leadership {
    let lease = cluster_client::election::Lease {
        namespace: namespace.to_owned(),
        name: api::lease::driver_lease_name(driver),
        identity: api::lease::normalize_lease_name(&cli.pod),
        // Drivers' RBAC, upstream's included, grants no watch on leases: a standby reads it.
        watch_releases: false,
    };
    let timings = cluster_client::election::Timings {
        lease_duration: cli.leader_election_lease_duration,
        renew_deadline: cli.leader_election_renew_deadline,
        retry_period: cli.leader_election_retry_period,
    };
    let full_name = format!("{}/{}", lease.namespace, lease.name);
    let (holder_tx, holder) = watch::channel(false);
    let gauge = metrics.leader.clone();
    let leading = move |now: bool| {
        gauge.set(i64::from(now));
        holder_tx.send_replace(now);
    };
    tasks.spawn(cluster_client::election::compete(client, lease, timings, leading, stop.clone()));
    Leadership::Elected { lease: full_name, holder }
}

/// TLS connections (`server_tls::accept`), as tonic's server takes them.
fn tls_incoming(
    listener: tokio::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> impl futures::Stream<Item = Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>, std::io::Error>> {
    use futures::StreamExt;
    tokio_stream::wrappers::ReceiverStream::new(server_tls::accept::accept(listener, config)).map(|(tls, _)| Ok(tls))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn cli(args: &[&str]) -> SidecarCli {
        SidecarCli::try_parse_from(std::iter::once("csi-addons-sidecar").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn missing_identity_flags_are_named_with_a_hint() {
        let err = checked_flags(&cli(&["--node-id=n", "--pod=p", "--namespace=ns", "--pod-uid=u"])).unwrap_err();
        assert!(err.to_string().contains("--controller-port is required"), "{err}");
        let err =
            checked_flags(&cli(&["--controller-port=9070", "--pod=p", "--namespace=ns", "--pod-uid=u"])).unwrap_err();
        assert!(err.to_string().contains("--node-id"), "{err}");
    }

    #[test]
    fn listen_address_and_endpoint_follow_controller_ip() {
        let base = ["--node-id=n", "--pod=p", "--namespace=ns", "--pod-uid=u", "--controller-port=9070"];
        let (addr, identity) = checked_flags(&cli(&base)).unwrap();
        assert_eq!(addr.to_string(), "0.0.0.0:9070");
        assert_eq!(identity.endpoint, "pod://p.ns:9070");
        let mut args = base.to_vec();
        args.push("--controller-ip=fd00::7");
        let (addr, identity) = checked_flags(&cli(&args)).unwrap();
        assert_eq!(addr.to_string(), "[fd00::7]:9070");
        assert_eq!(identity.endpoint, "[fd00::7]:9070");
        args[5] = "--controller-ip=node-1.example";
        assert!(checked_flags(&cli(&args)).unwrap_err().to_string().contains("not an IP address"));
        let mut args = base.to_vec();
        args[4] = "--controller-port=http";
        assert!(checked_flags(&cli(&args)).unwrap_err().to_string().contains("not a port number"));
    }
}
