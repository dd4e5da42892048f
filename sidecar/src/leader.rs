//! Leader election among the sidecars of one driver, on Lease `<normalized driver>-csi-addons`
//! with the normalized Pod name as holder (what upstream's controller looks up). Losing the Lease
//! stops controller operations and the sidecar keeps competing; upstream exits instead.
use std::time::Duration;

use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;

/// Lease timings from upstream's flags.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
}

/// A running election. Once `stop` turns true and every other receiver of `holder` is dropped,
/// the Lease is released and `task` ends.
pub struct Election {
    pub lease: String,
    pub holder: watch::Receiver<bool>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts competing for the driver's Lease in `namespace`; retries until the Lease can be
/// created or read, or `stop` turns true (then `None`).
pub async fn start(
    client: kube::Client,
    namespace: &str,
    driver: &str,
    pod: &str,
    timings: Timings,
    mut stop: watch::Receiver<bool>,
) -> Option<Election> {
    let lease = api::lease::driver_lease_name(driver);
    let identity = api::lease::normalize_lease_name(pod);
    let duration = timings.lease_duration.as_secs().max(2);
    // Renew this long before expiry: the time left after upstream's renew deadline.
    let grace = duration.saturating_sub(timings.renew_deadline.as_secs()).clamp(1, duration - 1);
    let mut wait = Duration::from_secs(1);
    let manager = loop {
        let built = LeaseManagerBuilder::new(client.clone(), &lease)
            .with_namespace(namespace)
            .with_identity(&identity)
            .with_duration(duration)
            .with_grace(grace)
            .build();
        let result = tokio::select! {
            r = built => r,
            _ = stop.wait_for(|s| *s) => return None,
        };
        match result {
            Ok(manager) => break manager,
            Err(e) => {
                tracing::warn!(lease = %format!("{namespace}/{lease}"), error = %e, "cannot use the Lease yet; retrying");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = stop.wait_for(|s| *s) => return None,
                }
                wait = (wait * 2).min(Duration::from_secs(30));
            }
        }
    };
    let (holder, task) = manager.watch().await;
    let full_name = format!("{namespace}/{lease}");
    let mut changes = holder.clone();
    let logged_name = full_name.clone();
    let task = tokio::spawn(async move {
        // Log transitions; the manager's own task releases the Lease once all receivers are gone.
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let leading = *changes.borrow_and_update();
                    tracing::info!(lease = %logged_name, leading, "leadership changed");
                }
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        drop(changes);
        match task.await {
            Ok(Ok(_)) => tracing::info!(lease = %logged_name, "Lease released"),
            Ok(Err(e)) => tracing::warn!(lease = %logged_name, error = %e, "releasing the Lease failed"),
            Err(e) => tracing::warn!(error = %e, "the election task failed"),
        }
    });
    Some(Election { lease: full_name, holder, task })
}
