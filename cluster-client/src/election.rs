//! Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it: the
//! manager competes for its Lease, each controller sidecar for its driver's. One loop for both,
//! so they retry, report and release the same way.
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::{WatchStreamExt, watcher};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;

/// Which Lease, and who competes for it.
#[derive(Debug, Clone)]
pub struct Lease {
    pub namespace: String,
    pub name: String,
    /// The holder identity written into the Lease.
    pub identity: String,
    /// How a standby learns that the holder released the Lease: by watching it (needs `list` and
    /// `watch` on leases; it takes over within moments), or by reading it every retry period.
    pub watch_releases: bool,
}

impl Lease {
    /// `namespace/name`, as logs name it.
    fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// client-go's three leader-election durations.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// How long a Lease stays held without renewal.
    pub lease_duration: Duration,
    /// How long the holder keeps trying to renew before it gives up leading.
    pub renew_deadline: Duration,
    /// The wait between attempts to create or read the Lease.
    pub retry_period: Duration,
}

impl Timings {
    /// The Lease's duration and how long before its expiry it is renewed, in whole seconds (what
    /// a Lease records). Renewal starts once the renew deadline has passed; both stay at least 1 s
    /// so a holder always renews before its Lease expires.
    fn seconds(self) -> (u64, u64) {
        let duration = self.lease_duration.as_secs().max(2);
        let grace = duration.saturating_sub(self.renew_deadline.as_secs()).clamp(1, duration - 1);
        (duration, grace)
    }
}

/// This process's name in a Lease: the Pod's name (POD_NAME, else the hostname, which a Pod's
/// is) and a random suffix, as controller-runtime names it. The suffix keeps two replicas, or a
/// container and its restarted self, from ever taking each other for the holder.
pub fn identity(fallback: &str) -> String {
    holder_identity(
        std::env::var("POD_NAME").ok(),
        std::fs::read_to_string("/proc/sys/kernel/hostname").ok(),
        std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap_or_else(|_| std::process::id().to_string()),
        fallback,
    )
}

fn holder_identity(pod_name: Option<String>, hostname: Option<String>, random: String, fallback: &str) -> String {
    let base = [pod_name, hostname]
        .into_iter()
        .flatten()
        .map(|s| s.trim().to_owned())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| fallback.to_owned());
    format!("{base}_{}", random.trim())
}

/// Competes for `lease` until `stop` turns true. Every change of leadership is handed to
/// `leading`, which is told `false` before the Lease is released on the way out. While the
/// Lease can be neither created nor read (the API server may be unreachable), this side does
/// not lead and tries again every retry period.
///
/// A standby also follows the Lease (see `Lease::watch_releases`): when its holder has released
/// it (a manager on its way out does), the standby takes it at once rather than at the end of the
/// holder's last term, so it leads before a replacement Pod can start. [differs: manager-replicas]
pub async fn compete(
    client: kube::Client,
    lease: Lease,
    timings: Timings,
    mut leading: impl FnMut(bool) + Send,
    mut stop: watch::Receiver<bool>,
) {
    let full_name = lease.full_name();
    // At least a second apart, whatever the flag says: a zero period would hammer an API server
    // that refuses.
    let retry = timings.retry_period.max(Duration::from_secs(1));
    // Followed only while standing by: a leader keeps no watch (nor its unread events) open.
    let mut releases = None;
    let mut told = None;
    let mut tell = |now: bool| {
        if told != Some(now) {
            told = Some(now);
            leading(now);
            tracing::info!(lease = %full_name, leading = now, "leadership");
        }
    };
    loop {
        let Some(manager) = lease_manager(&client, &lease, timings, retry, &mut stop).await else {
            tell(false);
            return;
        };
        let (mut holder, task) = manager.watch().await;
        let released = loop {
            let now = *holder.borrow_and_update();
            tell(now);
            if now {
                releases = None;
            } else if releases.is_none() {
                releases = Some(follow_releases(&client, &lease, retry));
            }
            tokio::select! {
                changed = holder.changed() => if changed.is_err() { break false },
                _ = stop.wait_for(|s| *s) => break false,
                Some(()) = next_release(&mut releases), if !now => break true,
            }
        };
        if released {
            // A standby holds nothing to release: its election task is cancelled, not told to
            // release (which could clear a Lease another has just taken), and a new one competes.
            task.abort();
            let _ = task.await;
            continue;
        }
        // Stop acting as the leader first; dropping the last receiver then releases the Lease.
        tell(false);
        drop(holder);
        match task.await {
            Ok(Ok(_)) => tracing::info!(lease = %full_name, "Lease released"),
            Ok(Err(e)) => tracing::warn!(lease = %full_name, error = %e, "releasing the Lease failed"),
            Err(e) => tracing::warn!(lease = %full_name, error = %e, "the election task failed"),
        }
        return;
    }
}

/// The Lease's manager, once the Lease can be created or read; `None` when `stop` comes first.
async fn lease_manager(
    client: &kube::Client,
    lease: &Lease,
    timings: Timings,
    retry: Duration,
    stop: &mut watch::Receiver<bool>,
) -> Option<kube_lease_manager::LeaseManager> {
    let (duration, grace) = timings.seconds();
    loop {
        let built = LeaseManagerBuilder::new(client.clone(), &lease.name)
            .with_namespace(&lease.namespace)
            .with_identity(&lease.identity)
            .with_duration(duration)
            .with_grace(grace)
            .build();
        tokio::select! {
            built = built => match built {
                Ok(manager) => return Some(manager),
                Err(e) => tracing::warn!(lease = %lease.full_name(), error = %e, "cannot use the Lease yet; retrying"),
            },
            _ = stop.wait_for(|s| *s) => return None,
        }
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            _ = stop.wait_for(|s| *s) => return None,
        }
    }
}

async fn next_release(releases: &mut Option<BoxStream<'static, ()>>) -> Option<()> {
    releases.as_mut()?.next().await
}

/// A stream that yields each time the Lease is seen without a holder: its last holder gave it up.
/// Errors are retried by the stream itself (a watch with backoff, or the next read).
fn follow_releases(client: &kube::Client, lease: &Lease, retry: Duration) -> BoxStream<'static, ()> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), &lease.namespace);
    if lease.watch_releases {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", lease.name));
        watcher::watcher(leases, config)
            .default_backoff()
            .applied_objects()
            .filter_map(|found| futures::future::ready(found.ok().filter(is_released).map(|_| ())))
            .boxed()
    } else {
        let name = lease.name.clone();
        futures::stream::unfold((), move |()| {
            let (leases, name) = (leases.clone(), name.clone());
            async move {
                loop {
                    tokio::time::sleep(retry).await;
                    if let Ok(Some(found)) = leases.get_opt(&name).await
                        && is_released(&found)
                    {
                        return Some(((), ()));
                    }
                }
            }
        })
        .boxed()
    }
}

fn is_released(lease: &k8s_openapi::api::coordination::v1::Lease) -> bool {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).is_none_or(str::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings(lease: u64, renew: u64) -> Timings {
        Timings {
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(1),
        }
    }

    #[test]
    fn two_processes_of_one_pod_or_host_never_share_an_identity() {
        let a = holder_identity(None, Some("manager-7d9\n".into()), "1f0e\n".into(), "m");
        let b = holder_identity(None, Some("manager-7d9\n".into()), "9c2a\n".into(), "m");
        assert_eq!(a, "manager-7d9_1f0e");
        assert_ne!(a, b);
        assert_eq!(holder_identity(Some("pod-x".into()), Some("host".into()), "u".into(), "m"), "pod-x_u");
        assert_eq!(
            holder_identity(Some(String::new()), None, "u".into(), "csi-addons-manager"),
            "csi-addons-manager_u"
        );
    }

    #[test]
    fn renewal_starts_after_the_renew_deadline_and_before_expiry() {
        // client-go's defaults: 137 s Lease, 107 s renew deadline → renew 30 s before expiry.
        assert_eq!(timings(137, 107).seconds(), (137, 30));
        // A renew deadline at or past the Lease's duration still renews a second early.
        assert_eq!(timings(10, 10).seconds(), (10, 1));
        assert_eq!(timings(10, 60).seconds(), (10, 1));
        // A zero deadline renews as early as the Lease allows without renewing constantly.
        assert_eq!(timings(10, 0).seconds(), (10, 9));
        // Sub-two-second Leases are lengthened so there is room to renew.
        assert_eq!(timings(0, 0).seconds(), (2, 1));
    }
}
