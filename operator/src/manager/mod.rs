//! The manager process: settings (flags, then the ConfigMap), leader election, the probe and
//! metrics servers, and the reconcilers while this manager leads, stopped by one shutdown signal.
//!
//! Its parts, which serve only the process around the controllers: `runner` starts every
//! controller, `config_watch` re-applies `csi-addons-config` live, `readiness` answers /readyz, and
//! `secure_metrics` puts /metrics behind TLS, TokenReview and SubjectAccessReview.
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use prometheus::IntGaugeVec;
use tokio::sync::watch;

pub mod config_watch;
pub mod readiness;
pub mod runner;
pub mod secure_metrics;

use self::readiness::{AddonsServed, NotReady, READY_CHECK, watch_readiness};
use self::secure_metrics::{MetricsAuth, TlsListener, authorize};
use crate::config::{CONFIG_MAP, ConfigError, Settings};
use crate::core::{CacheSync, Core};
use crate::flags::ManagerCli;
use crate::metrics::Metrics;
use crate::sidecars::client::{ClientError, Security};

/// upstream's Lease ID, so one of ours and one of upstream's never lead together.
pub const LEASE_NAME: &str = "e8cd140a.openshift.io";

/// Why the manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("no cluster access: {0}")]
    ApiClient(#[from] cluster_client::ClientError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("reading ConfigMap {namespace}/{CONFIG_MAP}: {source}")]
    ReadConfig {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("listening on {address}: {source}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("metrics TLS: {0}")]
    MetricsTls(#[from] server_tls::TlsError),
    #[error("the sidecar client: {0}")]
    Sidecar(#[from] ClientError),
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// API requests in flight at once: a burst of reconciles queues here rather than at the API
/// server's priority and fairness. Watches hold a slot only until their response starts. (64
/// connected ten thousand CSIAddonsNodes no sooner: the API server's CPU is what holds them.)
const API_IN_FLIGHT: usize = 16;

/// The Kubernetes client (`--kubeconfig`, KUBECONFIG, in-cluster or ~/.kube/config), with
/// requests in flight bounded, each request counted in `metrics`, and the CSI-Addons kinds'
/// served requests told to `served`.
async fn api_client(
    kubeconfig: Option<&std::path::Path>,
    metrics: &Metrics,
    served: &AddonsServed,
) -> Result<kube::Client, ManagerError> {
    let observer = served.observer(metrics.api_observer());
    let options = cluster_client::Options { in_flight: Some(API_IN_FLIGHT), observer: Some(observer) };
    let agent = cluster_client::user_agent("csi-addons-manager", env!("CARGO_PKG_VERSION"));
    Ok(cluster_client::client(&agent, kubeconfig, options).await?)
}

/// The settings at start: the flags with the ConfigMap over them; a bad value is a start-up
/// error, as upstream; a missing ConfigMap is fine.
pub async fn initial_settings(client: &kube::Client, cli: &ManagerCli) -> Result<Settings, ManagerError> {
    let base = Settings::from_flags(cli);
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), &cli.namespace)
        .get_opt(CONFIG_MAP)
        .await
        .map_err(|source| ManagerError::ReadConfig { namespace: cli.namespace.clone(), source })?;
    match config_map.and_then(|c| c.data) {
        Some(data) => Ok(Settings::with_config_map(&base, &data)?),
        None => Ok(base),
    }
}

#[derive(Clone)]
struct Probes {
    ready: watch::Receiver<Result<(), NotReady>>,
    metrics: Metrics,
}

async fn readyz(State(probes): State<Probes>) -> (StatusCode, String) {
    match &*probes.ready.borrow() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn serve_metrics(State(probes): State<Probes>) -> String {
    probes.metrics.render()
}

/// The metrics server's TLS: `--metrics-cert-dir`'s files or a self-signed certificate; HTTP/2
/// only with `--enable-http2` (as upstream, against HTTP/2 rapid-reset attacks).
fn metrics_tls(cli: &ManagerCli) -> Result<Arc<rustls::ServerConfig>, ManagerError> {
    let source = match cli.metrics_cert_dir.as_deref().filter(|d| !d.is_empty()) {
        Some(dir) => server_tls::CertSource::Files {
            cert: std::path::Path::new(dir).join("tls.crt"),
            key: std::path::Path::new(dir).join("tls.key"),
        },
        None => server_tls::CertSource::SelfSigned,
    };
    let config = server_tls::server_config(&source, &server_tls::TlsSettings::default())?;
    let mut config = (*config).clone();
    config.alpn_protocols =
        if cli.enable_http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    Ok(Arc::new(config))
}

async fn serve<L>(listener: L, router: Router, mut stop: watch::Receiver<bool>)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(shutdown).await {
        tracing::error!(error = %e, "an HTTP server failed");
    }
}

/// Competes for the manager's Lease until `release`; the gauge says whether this manager leads.
/// `release` comes once the reconcilers have stopped, so a standby never calls a sidecar while a
/// call of this manager is still out.
async fn elect(
    client: kube::Client,
    cli: ManagerCli,
    identity: String,
    gauge: prometheus::IntGauge,
    leading_tx: watch::Sender<bool>,
    release: watch::Receiver<bool>,
) {
    // The standby watches the Lease, so it leads the moment an evicted or stopped leader lets go.
    let lease = cluster_client::election::Lease {
        namespace: cli.namespace.clone(),
        name: LEASE_NAME.to_owned(),
        identity,
        watch_releases: true,
    };
    let timings = cluster_client::election::Timings {
        lease_duration: cli.leader_election_lease_duration,
        renew_deadline: cli.leader_election_renew_deadline,
        retry_period: cli.leader_election_retry_period,
    };
    let leading = move |now: bool| {
        gauge.set(i64::from(now));
        leading_tx.send_replace(now);
    };
    cluster_client::election::compete(client, lease, timings, leading, release).await;
}

/// The controllers, by the names controller-runtime gives upstream's (dashboards key on them).
pub const CONTROLLERS: [&str; 11] = [
    "csiaddonsnode",
    "reclaimspacejob",
    "reclaimspacecronjob",
    "encryptionkeyrotationjob",
    "encryptionkeyrotationcronjob",
    "persistentvolumeclaim",
    "networkfence",
    "networkfenceclass",
    "volumereplication",
    "volumegroupreplication",
    "volumegroupreplicationcontent",
];

/// Keeps `controller_runtime_max_concurrent_reconciles` equal to the settings in force.
async fn publish_workers(mut settings: watch::Receiver<Settings>, gauge: IntGaugeVec, mut stop: watch::Receiver<bool>) {
    loop {
        let workers = i64::try_from(settings.borrow_and_update().max_concurrent_reconciles).unwrap_or(i64::MAX);
        for controller in CONTROLLERS {
            gauge.with_label_values(&[controller]).set(workers);
        }
        tokio::select! {
            changed = settings.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Closes the sidecar connections nothing has called for `idle` (`idle_channel`), looking four
/// times per idle period.
async fn close_idle_connections(
    pool: Arc<crate::sidecars::pool::Pool>,
    idle: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let every = (idle / 4).max(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => pool.close_idle(idle),
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Runs the reconcilers while this manager leads; stops them when it stops leading.
async fn lead(
    ctx: Arc<Core>,
    volume_health_cleanup: bool,
    mut leading: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
) {
    loop {
        let mut stopping = stop.clone();
        // Stopping comes first: the Lease, and so `leading`, is kept until this returns.
        tokio::select! {
            biased;
            _ = stopping.wait_for(|s| *s) => return,
            found = leading.wait_for(|l| *l) => if found.is_err() { return },
        }
        // No sidecar is dialled before each driver's CA is known.
        let trust = ctx.security.trust();
        tokio::select! {
            () = trust.wait_synced() => {}
            _ = stopping.wait_for(|s| *s) => return,
        }
        let workers = ctx.settings().max_concurrent_reconciles;
        tracing::info!(workers, "leading: starting the reconcilers");
        let (child_tx, child) = watch::channel(false);
        let running = tokio::spawn(self::runner::run_all(ctx.clone(), volume_health_cleanup, child));
        let mut settings = ctx.settings.clone();
        tokio::select! {
            _ = leading.wait_for(|l| !*l) => tracing::info!("no longer leading: stopping the reconcilers"),
            _ = stopping.wait_for(|s| *s) => tracing::info!("stopping the reconcilers"),
            // Running reconciles finish; new work gets the new number of workers.
            () = async {
                // Settings that can no longer change never restart anything.
                if settings.wait_for(|s| s.max_concurrent_reconciles != workers).await.is_err() {
                    std::future::pending::<()>().await;
                }
            } => {
                tracing::info!("max-concurrent-reconciles changed: restarting the reconcilers");
            }
        }
        child_tx.send_replace(true);
        // Reconciles in flight get a moment to finish; then they are cut off. A manager on its
        // way out keeps the Lease meanwhile (see `run`), so they never overlap a new leader's
        // calls to the same sidecars.
        let mut running = running;
        if tokio::time::timeout(RECONCILES_GRACE, &mut running).await.is_err() {
            running.abort();
            let _ = running.await;
        }
        tracing::info!("the reconcilers stopped");
    }
}

/// How long the reconciles in flight get to finish when the manager stops or stops leading. A
/// manager told to stop keeps the Lease until they have ended (see `run`). [differs: leader-drain]
const RECONCILES_GRACE: Duration = Duration::from_secs(5);

/// Runs until SIGINT or SIGTERM.
pub async fn run(cli: ManagerCli) -> Result<(), ManagerError> {
    if cli.enable_admission_webhooks {
        tracing::warn!("--enable-admission-webhooks is deprecated and has no effect");
    }
    let metrics = Metrics::new()?;
    let served = AddonsServed::default();
    let client = api_client(cli.kubeconfig.as_deref(), &metrics, &served).await?;
    let security = if cli.enable_auth {
        if cli.sidecar_ca_file.is_none() {
            tracing::warn!(
                "no --sidecar-ca-file: sidecars of drivers whose CSIDriver names no CA are not verified \
                 (upstream's behaviour)"
            );
        }
        Security::tls(&cli.sidecar_token_file, cli.sidecar_ca_file.as_deref())?
    } else {
        Security::plain()
    };
    metrics.start_at_zero(&CONTROLLERS);
    let leader_gauge = metrics.leader.with_label_values(&[LEASE_NAME]);
    let max_workers = metrics.max_concurrent.clone();
    let (stop_tx, stop) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let (ready_tx, ready) = watch::channel(Err(NotReady::NotChecked));
    let probes = Probes { ready, metrics: metrics.clone() };

    // The probes come first, so a manager that cannot reach the API server says so on /readyz.
    let mut tasks = tokio::task::JoinSet::new();
    let health_address = go_flags::listen_address(&cli.health_probe_bind_address);
    let listener = tokio::net::TcpListener::bind(&health_address)
        .await
        .map_err(|source| ManagerError::Listen { address: health_address.clone(), source })?;
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(probes.clone());
    tasks.spawn(serve(listener, router, stop.clone()));
    if cli.metrics_bind_address != "0" {
        let address = go_flags::listen_address(&cli.metrics_bind_address);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .map_err(|source| ManagerError::Listen { address: address.clone(), source })?;
        let router = Router::new().route("/metrics", get(serve_metrics)).with_state(probes);
        if cli.metrics_secure {
            let config = metrics_tls(&cli)?;
            let listener = TlsListener::new(listener, config)
                .map_err(|source| ManagerError::Listen { address: address.clone(), source })?;
            let auth = MetricsAuth::new(client.clone());
            let router = router.layer(axum::middleware::from_fn_with_state(auth, authorize));
            tasks.spawn(serve(listener, router, stop.clone()));
        } else {
            tasks.spawn(serve(listener, router, stop.clone()));
        }
    }
    let caches = CacheSync::default();
    tasks.spawn(watch_readiness(client.clone(), served, caches.clone(), ready_tx, stop.clone()));

    // A ConfigMap with a bad value stops the start, as upstream; an unreachable API server is
    // waited for (and /readyz says so meanwhile).
    let settings = loop {
        match initial_settings(&client, &cli).await {
            Ok(settings) => break settings,
            Err(ManagerError::ReadConfig { namespace, source }) => {
                tracing::warn!(error = %source, "reading ConfigMap {namespace}/{CONFIG_MAP}; retrying");
                let mut stop = stop.clone();
                tokio::select! {
                    () = tokio::time::sleep(READY_CHECK) => {}
                    _ = runtime_support::shutdown::signal() => return Ok(()),
                    _ = stop.wait_for(|s| *s) => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        }
    };
    tracing::info!(?settings, "settings");
    let (settings_tx, settings_rx) = watch::channel(settings);
    let identity = cluster_client::election::identity("csi-addons-manager");
    tasks.spawn(crate::sidecars::driver_trust::follow(client.clone(), security.trust(), stop.clone()));
    let core = Arc::new(Core::new(
        client.clone(),
        security,
        settings_rx.clone(),
        metrics,
        Some(identity.clone()),
        cli.watch_namespace.clone().filter(|n| !n.is_empty()),
        caches,
    ));
    tasks.spawn(self::config_watch::follow(
        client.clone(),
        cli.namespace.clone(),
        Settings::from_flags(&cli),
        settings_tx,
        stop.clone(),
    ));
    tasks.spawn(publish_workers(settings_rx, max_workers, stop.clone()));
    let (leading_tx, leading) = watch::channel(false);
    // The Lease is given up only once `lead` has stopped the reconcilers: a standby that took it
    // at the signal would call the sidecars while this manager's calls are still out.
    let (release_tx, release) = watch::channel(false);
    if cli.leader_elect {
        tasks.spawn(elect(client.clone(), cli.clone(), identity, leader_gauge, leading_tx, release));
    } else {
        leader_gauge.set(1);
        leading_tx.send_replace(true);
        // Kept so `leading` stays open.
        let mut stopped = stop.clone();
        tasks.spawn(async move {
            let _ = stopped.wait_for(|s| *s).await;
            drop(leading_tx);
        });
    }
    if !cli.sidecar_idle_timeout.is_zero() {
        tasks.spawn(close_idle_connections(core.pool.clone(), cli.sidecar_idle_timeout, stop.clone()));
    }
    let (stopped, volume_health_cleanup) = (stop.clone(), cli.enable_volume_health_cleanup);
    tasks.spawn(async move {
        lead(core, volume_health_cleanup, leading, stopped).await;
        release_tx.send_replace(true);
    });

    let on_signal = stop_tx.clone();
    tokio::spawn(async move {
        runtime_support::shutdown::signal().await;
        tracing::info!("shutting down");
        on_signal.send_replace(true);
    });
    let mut stopped = stop.clone();
    let _ = stopped.wait_for(|s| *s).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await;
    Ok(())
}

#[cfg(test)]
mod tests {}
