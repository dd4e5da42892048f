//! The reference driver's lifecycle operator, modelled on the Manila CSI driver operator: one
//! cluster-scoped `ReferenceCSIDriver` (api::driver) says how the driver runs, and controllers side
//! by side keep the driver's workloads (and, next, the backend's profiles, StorageClasses,
//! CSI-Addons classes and credentials) in line with it.
//!
//! `run` is the process: the probe and metrics servers, leader election, and the controllers while
//! this replica leads, all stopped by one shutdown signal.
use std::sync::Arc;
use std::time::Duration;

use api::driver::DRIVER_NAME;
use axum::Router;
use axum::routing::get;
use tokio::sync::watch;

pub mod assets;
pub mod backend;
pub mod certificates;
pub mod classes;
pub mod credentials;
pub mod decide;
pub mod driver_set;
pub mod flags;
pub mod metrics;
pub mod names;
pub mod rollout;
pub mod status;

pub use flags::Cli;

/// The operator's Lease, in its namespace.
pub const LEASE_NAME: &str = "reference-driver-operator.driver.csi-addons-rs.io";
/// API requests in flight at once.
const API_IN_FLIGHT: usize = 8;
/// Who writes the CSIDriver's CA annotation in a hand install.
const CERTIFICATES_FIELD_MANAGER: &str = "reference-driver-certificates";

/// Why the operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("no cluster access: {0}")]
    ApiClient(#[from] cluster_client::ClientError),
    #[error("listening on {address}: {source}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Certificates(#[from] driver_set::DriverSetError),
    #[error(
        "publishing the sidecars' CA on the CSIDriver {DRIVER_NAME} (is deploy/reference-driver/csidriver.yaml applied?): {0}"
    )]
    PublishCa(#[source] kube::Error),
}

/// One pass of the sidecars' certificates for a driver installed by hand (deploy/reference-driver/
/// runs it as a Job, and daily as a CronJob): the CA and serving certificate in `namespace`, issued
/// or renewed when due exactly as the operator keeps them, and the CA bundle on the CSIDriver. A
/// merge patch, not an apply: a missing CSIDriver is an error to retry, never made here with
/// defaults that its immutable fields would then keep.
async fn issue_sidecar_certificates(client: kube::Client, namespace: &str) -> Result<(), OperatorError> {
    use api::driver::SIDECAR_CA_ANNOTATION;
    let bundle = driver_set::keep_certificates(&client, namespace).await?;
    let patch = serde_json::json!({ "metadata": { "annotations": { SIDECAR_CA_ANNOTATION: bundle } } });
    let params =
        kube::api::PatchParams { field_manager: Some(CERTIFICATES_FIELD_MANAGER.to_owned()), ..Default::default() };
    kube::Api::<k8s_openapi::api::storage::v1::CSIDriver>::all(client)
        .patch(DRIVER_NAME, &params, &kube::api::Patch::Merge(&patch))
        .await
        .map_err(OperatorError::PublishCa)?;
    tracing::info!(
        namespace,
        driver = DRIVER_NAME,
        "the sidecars' certificates are current and their CA is on the CSIDriver"
    );
    Ok(())
}

async fn serve(address: String, router: Router, mut stop: watch::Receiver<bool>) -> Result<(), OperatorError> {
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .map_err(|source| OperatorError::Listen { address: address.clone(), source })?;
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(shutdown).await {
            tracing::error!(error = %e, "an HTTP server failed");
        }
    });
    Ok(())
}

/// Runs the controllers while this replica leads, and stops them when it no longer does.
async fn lead(ctx: Arc<driver_set::Context>, mut leading: watch::Receiver<bool>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            found = leading.wait_for(|l| *l) => if found.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        tracing::info!("leading: starting the controllers");
        let (child_tx, mut child) = watch::channel(false);
        let running = tokio::spawn(driver_set::run(ctx.clone(), async move {
            let _ = child.wait_for(|s| *s).await;
        }));
        tokio::select! {
            _ = leading.wait_for(|l| !*l) => tracing::info!("no longer leading: stopping the controllers"),
            _ = stop.wait_for(|s| *s) => {}
        }
        child_tx.send_replace(true);
        let mut running = running;
        if tokio::time::timeout(Duration::from_secs(5), &mut running).await.is_err() {
            running.abort();
        }
    }
}

/// Runs until SIGINT or SIGTERM (with `--issue-sidecar-certificates`, once).
pub async fn run(cli: Cli) -> Result<(), OperatorError> {
    let client = cluster_client::client(
        &cluster_client::user_agent("reference-driver-operator", env!("CARGO_PKG_VERSION")),
        cli.kubeconfig.as_deref(),
        cluster_client::Options { in_flight: Some(API_IN_FLIGHT), observer: None },
    )
    .await?;
    if cli.issue_sidecar_certificates {
        return issue_sidecar_certificates(client, &cli.driver_namespace).await;
    }
    let metrics = metrics::Metrics::new()?;
    let (stop_tx, stop) = watch::channel(false);
    let health = Router::new().route("/healthz", get(|| async { "ok\n" })).route("/readyz", get(|| async { "ok\n" }));
    serve(go_flags::listen_address(&cli.health_probe_bind_address), health, stop.clone()).await?;
    if cli.metrics_bind_address != "0" {
        let served = metrics.clone();
        let router = Router::new().route("/metrics", get(move || std::future::ready(served.render())));
        serve(go_flags::listen_address(&cli.metrics_bind_address), router, stop.clone()).await?;
    }
    let placement = assets::Placement {
        namespace: cli.driver_namespace.clone(),
        operator_namespace: cli.namespace.clone(),
        manager_identity: cli.manager_identity.clone(),
        images: cli.images(),
    };
    let ctx = Arc::new(driver_set::Context::new(client.clone(), placement, metrics.clone()));
    let (leading_tx, leading) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    if cli.leader_elect {
        let lease = cluster_client::election::Lease {
            namespace: cli.namespace.clone(),
            name: LEASE_NAME.to_owned(),
            identity: cluster_client::election::identity("reference-driver-operator"),
            // One replica: a standby, when there is one, reads the Lease every retry period.
            watch_releases: false,
        };
        let timings = cluster_client::election::Timings {
            lease_duration: cli.leader_election_lease_duration,
            renew_deadline: cli.leader_election_renew_deadline,
            retry_period: cli.leader_election_retry_period,
        };
        let gauge = metrics.leader.clone();
        let on_change = move |now: bool| {
            gauge.set(i64::from(now));
            leading_tx.send_replace(now);
        };
        tasks.spawn(cluster_client::election::compete(client, lease, timings, on_change, stop.clone()));
    } else {
        metrics.leader.set(1);
        leading_tx.send_replace(true);
        // Kept open until the end, so `lead` does not take a closed channel for lost leadership.
        let mut stopped = stop.clone();
        tasks.spawn(async move {
            let _ = stopped.wait_for(|s| *s).await;
            drop(leading_tx);
        });
    }
    tasks.spawn(lead(ctx, leading, stop.clone()));
    runtime_support::shutdown::signal().await;
    tracing::info!("shutting down");
    stop_tx.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await;
    Ok(())
}
