//! `/readyz`'s answer: ready while the API server serves the CSI-Addons kinds and, while leading,
//! every reconciler's cache has synced.
//!
//! That the API server serves the kinds is known from the manager's own requests when it can be:
//! any request for a CSI-Addons kind that the API server answered with success (a status write, a
//! watch starting) says so as well as a list would. Only when none came for READY_RECHECK does the
//! manager list one CSIAddonsNode to ask, so a busy manager adds no request of its own, and an idle
//! one at most one per READY_RECHECK.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::csiaddons::CSIAddonsNode;
use kube::Api;
use kube::api::ListParams;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::core::CacheSync;

/// How often readiness looks again at what it knows (no request).
pub const READY_CHECK: Duration = Duration::from_secs(2);
/// How long a served request counts as the API server serving the CSI-Addons kinds: asking every
/// READY_CHECK for ever would be most of an idle manager's requests (a kubelet probes every 10 s
/// by default).
const READY_RECHECK: Duration = Duration::from_secs(30);

/// Why `/readyz` says not ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("not checked yet")]
    NotChecked,
    /// The API server's answer, as text (it is compared with the last one).
    #[error("the API server does not serve CSIAddonsNodes: {0}")]
    ApiServer(String),
    #[error("caches not synced yet: {}", .0.join(", "))]
    Caches(Vec<&'static str>),
}

/// When the API server last answered a request for a CSI-Addons kind with success, as the API
/// client's observer tells it.
#[derive(Clone, Default)]
pub struct AddonsServed(Arc<Mutex<Option<Instant>>>);

impl AddonsServed {
    /// The observer to give the API client; `then` is told of every attempt too.
    pub fn observer(&self, then: cluster_client::observe::Observer) -> cluster_client::observe::Observer {
        let served = self.0.clone();
        let prefix = format!("/apis/{}/", <CSIAddonsNode as kube::Resource>::group(&()));
        Arc::new(move |attempt| {
            if attempt.status.is_some_and(|s| s.is_success()) && attempt.path.starts_with(&prefix) {
                // Poisoned only by a panic while storing an Instant, which cannot panic.
                if let Ok(mut last) = served.lock() {
                    *last = Some(Instant::now());
                }
            }
            then(attempt);
        })
    }

    fn last(&self) -> Option<Instant> {
        self.0.lock().ok().and_then(|last| *last)
    }
}

/// What readiness knows of the API server: its last answer (a served request, or the list's
/// answer) and when it came.
#[derive(Debug, Default)]
struct ApiAnswer(Option<(Result<(), String>, Instant)>);

impl ApiAnswer {
    /// A served request at `at` stands for the API server's answer if it is newer than the last.
    fn heard(&mut self, at: Option<Instant>) {
        if let Some(at) = at
            && self.0.as_ref().is_none_or(|(_, last)| at > *last)
        {
            self.0 = Some((Ok(()), at));
        }
    }

    /// Whether the API server must be asked: never asked, it failed, or its answer is old.
    fn due(&self, now: Instant) -> bool {
        self.0.as_ref().is_none_or(|(answer, at)| answer.is_err() || now.duration_since(*at) >= READY_RECHECK)
    }

    fn error(&self) -> Option<&str> {
        self.0.as_ref().and_then(|(answer, _)| answer.as_ref().err()).map(String::as_str)
    }
}

/// Keeps `ready` current until `stop`.
pub async fn watch_readiness(
    client: kube::Client,
    served: AddonsServed,
    caches: CacheSync,
    ready: watch::Sender<Result<(), NotReady>>,
    mut stop: watch::Receiver<bool>,
) {
    let nodes = Api::<CSIAddonsNode>::all(client);
    let mut answer = ApiAnswer::default();
    loop {
        answer.heard(served.last());
        if answer.due(Instant::now()) {
            let listed = nodes.list_metadata(&ListParams::default().limit(1)).await;
            answer.0 = Some((listed.map(|_| ()).map_err(|e| e.to_string()), Instant::now()));
        }
        let unsynced = caches.unsynced();
        let state = match answer.error() {
            Some(e) => Err(NotReady::ApiServer(e.to_owned())),
            None if !unsynced.is_empty() => Err(NotReady::Caches(unsynced)),
            None => Ok(()),
        };
        ready.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        });
        tokio::select! {
            () = tokio::time::sleep(READY_CHECK) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recently_served_request_stands_for_the_list() {
        let start = Instant::now();
        let mut answer = ApiAnswer::default();
        assert!(answer.due(start), "never asked");
        answer.heard(Some(start));
        assert!(!answer.due(start + READY_RECHECK - Duration::from_secs(1)));
        assert!(answer.due(start + READY_RECHECK), "nothing served for READY_RECHECK");
        answer.heard(Some(start + Duration::from_secs(20)));
        assert!(!answer.due(start + READY_RECHECK), "a later request renews it");
        answer.heard(None);
        assert!(!answer.due(start + READY_RECHECK));
    }

    #[test]
    fn a_failed_list_stands_until_a_later_request_is_served() {
        let start = Instant::now();
        let mut answer = ApiAnswer(Some((Err("connection refused".into()), start + Duration::from_secs(5))));
        answer.heard(Some(start));
        assert_eq!(answer.error(), Some("connection refused"), "a request served before the failure");
        assert!(answer.due(start + Duration::from_secs(6)), "a failure is asked again at once");
        answer.heard(Some(start + Duration::from_secs(6)));
        assert_eq!(answer.error(), None);
        assert!(!answer.due(start + Duration::from_secs(7)));
    }

    #[tokio::test]
    async fn only_successes_for_the_csi_addons_group_count() {
        let served = AddonsServed::default();
        let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = told.clone();
        let observer = served.observer(Arc::new(move |_| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }));
        let attempt = |path, status: Option<u16>| {
            let status = status.map(|s| axum::http::StatusCode::from_u16(s).unwrap());
            observer(&cluster_client::observe::Attempt {
                method: &axum::http::Method::GET,
                host: "h:6443",
                path,
                status,
            });
        };
        attempt("/apis/csiaddons.openshift.io/v1alpha1/csiaddonsnodes", Some(500));
        attempt("/apis/csiaddons.openshift.io/v1alpha1/csiaddonsnodes", None);
        attempt("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", Some(200));
        attempt("/api/v1/persistentvolumes", Some(200));
        assert_eq!(served.last(), None);
        attempt("/apis/csiaddons.openshift.io/v1alpha1/namespaces/ns/reclaimspacejobs/j/status", Some(200));
        assert!(served.last().is_some());
        assert_eq!(told.load(std::sync::atomic::Ordering::Relaxed), 5, "every attempt is passed on");
    }
}
