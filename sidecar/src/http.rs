//! `/healthz`, `/readyz` and `/metrics` on `--http-address` (off by default, so host-network
//! Pods that replace upstream's sidecar gain no port).
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

use crate::driver::{DriverState, Unusable};
use crate::metrics::Metrics;

/// What readiness is made of.
#[derive(Clone)]
pub struct Status {
    pub driver: watch::Receiver<DriverState>,
    pub registered: watch::Receiver<bool>,
    pub metrics: Metrics,
}

/// What keeps the sidecar from being ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    /// The driver, when it is not ready: None while it has not answered yet.
    driver: Option<Option<Unusable>>,
    registered: bool,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut missing = Vec::new();
        match &self.driver {
            Some(None) => missing.push("the driver has not answered yet".to_owned()),
            Some(Some(reason)) => missing.push(format!("the driver is unreachable: {reason}")),
            None => {}
        }
        if !self.registered {
            missing.push("the CSIAddonsNode is not registered".to_owned());
        }
        f.write_str(&missing.join("; "))
    }
}

impl std::error::Error for NotReady {}

/// Ready when the driver answers and the CSIAddonsNode exists; otherwise says which is missing.
pub fn readiness(driver: &DriverState, registered: bool) -> Result<(), NotReady> {
    let driver = match driver {
        DriverState::Ready(_) => None,
        DriverState::Connecting => Some(None),
        DriverState::Lost { reason } => Some(Some(reason.clone())),
    };
    if driver.is_none() && registered { Ok(()) } else { Err(NotReady { driver, registered }) }
}

async fn readyz(State(status): State<Status>) -> (StatusCode, String) {
    match readiness(&status.driver.borrow(), *status.registered.borrow()) {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn metrics(State(status): State<Status>) -> String {
    status.metrics.render()
}

pub fn router(status: Status) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(status)
}

/// Serves until `stop` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    status: Status,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router(status))
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DriverInfo;

    #[test]
    fn readiness_names_what_is_missing() {
        let ready =
            DriverState::Ready(DriverInfo { name: "d".into(), vendor_version: "1".into(), capabilities: vec![] });
        assert_eq!(readiness(&ready, true), Ok(()));
        let lost = DriverState::Lost { reason: Unusable::Call { call: "Probe", message: "socket gone".into() } };
        let err = readiness(&lost, false).unwrap_err().to_string();
        assert!(err.contains("socket gone") && err.contains("CSIAddonsNode"), "{err}");
        assert!(readiness(&DriverState::Connecting, true).unwrap_err().to_string().contains("not answered"));
    }
}
