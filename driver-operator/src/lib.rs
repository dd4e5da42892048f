//! The reference driver's lifecycle operator, modelled on the Manila CSI driver operator: one
//! cluster-scoped `ReferenceCSIDriver` (api::driver) says how the driver runs, and controllers side
//! by side keep the driver's workloads (and, next, the backend's profiles, StorageClasses,
//! CSI-Addons classes and credentials) in line with it.
//!
//! `run` is the process: the probe and metrics servers, leader election, and the controllers while
//! this replica leads, all stopped by one shutdown signal.
use std::sync::Arc;
use std::time::Duration;

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
pub mod rollout;
pub mod status;

pub use flags::Cli;

/// The operator's Lease, in its namespace.
pub const LEASE_NAME: &str = "reference-driver-operator.driver.csi-addons-rs.io";
/// API requests in flight at once.
const API_IN_FLIGHT: usize = 8;

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

/// Runs until SIGINT or SIGTERM.
pub async fn run(cli: Cli) -> Result<(), OperatorError> {
    let client = cluster_client::client(cli.kubeconfig.as_deref(), Some(API_IN_FLIGHT)).await?;
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
    api::shutdown::signal().await;
    tracing::info!("shutting down");
    stop_tx.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await;
    Ok(())
}
