//! What every controller shares: the client, the sidecar pool, the settings in force, metrics,
//! events, which caches have synced, and the "write status" step (server-side apply with one
//! field manager). Each controller keeps its own retry and memo state in a context of its own
//! that derefs to this one (`core::backoff::Retrying` for most).
pub mod action;
pub mod backoff;
pub mod clock;
pub mod error;
pub mod fingerprints;
pub mod patch;
pub mod queue;
pub mod run;
pub mod slim;
pub mod slim_text;
pub mod status;
pub mod wakeups;
pub mod watch;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube::{Api, Resource, ResourceExt};
use tokio::sync::watch as channel;

use crate::config::Settings;
use crate::events::{EventRecorder, Note};
use crate::metrics::Metrics;
use crate::sidecars::client::Security;
use crate::sidecars::pool::Pool;

/// The one field manager of everything the manager writes.
pub const FIELD_MANAGER: &str = "csi-addons-manager";

/// Shared by every controller.
pub struct Core {
    pub client: kube::Client,
    pub pool: Arc<Pool>,
    pub security: Security,
    pub settings: channel::Receiver<Settings>,
    pub metrics: Metrics,
    pub recorder: EventRecorder,
    /// `--watch-namespace`: namespaced kinds are watched here only.
    pub watch_namespace: Option<String>,
    /// Which controllers' caches have synced (readiness waits for all while leading).
    pub caches: CacheSync,
}

/// Controller name → whether its watch cache has synced.
#[derive(Clone, Default)]
pub struct CacheSync(Arc<Mutex<BTreeMap<&'static str, bool>>>);

impl CacheSync {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<&'static str, bool>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Marks `name` unsynced, then synced once its cache has its first full list.
    pub fn follow(&self, name: &'static str, ready: crate::cache_ready::Ready) {
        self.with(|m| m.insert(name, false));
        let caches = self.clone();
        tokio::spawn(async move {
            if ready.wait().await.is_ok() {
                caches.with(|m| m.insert(name, true));
            }
        });
    }

    /// Marks `name` synced or not (caches kept by hand rather than by a reflector store).
    pub fn set(&self, name: &'static str, synced: bool) {
        self.with(|m| m.insert(name, synced));
    }

    /// Forgets every controller (they stopped: this manager stands by).
    pub fn clear(&self) {
        self.with(BTreeMap::clear);
    }

    /// Controllers whose cache has not synced yet.
    pub fn unsynced(&self) -> Vec<&'static str> {
        self.with(|m| m.iter().filter(|(_, synced)| !**synced).map(|(name, _)| *name).collect())
    }
}

impl Core {
    pub fn new(
        client: kube::Client,
        security: Security,
        settings: channel::Receiver<Settings>,
        metrics: Metrics,
        instance: Option<String>,
        watch_namespace: Option<String>,
        caches: CacheSync,
    ) -> Self {
        let recorder = EventRecorder::new(client.clone(), FIELD_MANAGER, instance);
        Core { client, pool: Arc::new(Pool::default()), security, settings, metrics, recorder, watch_namespace, caches }
    }

    /// The Api a namespaced kind is watched through: `--watch-namespace`'s, or every namespace.
    pub fn watched<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match &self.watch_namespace {
            Some(namespace) => Api::namespaced(self.client.clone(), namespace),
            None => Api::all(self.client.clone()),
        }
    }

    pub fn settings(&self) -> Settings {
        self.settings.borrow().clone()
    }

    /// Publishes an event on `object`; a failure to publish is logged, never fatal. Warnings are
    /// logged too: an operator's log should show what failed without `kubectl get events`.
    pub async fn event<K: Resource<DynamicType = ()>>(&self, object: &K, warning: bool, reason: &str, note: String) {
        if warning {
            let kind = K::kind(&());
            let namespace = object.meta().namespace.as_deref().unwrap_or_default();
            tracing::warn!(%kind, namespace, name = %object.name_any(), reason, message = %note, "warning event");
        }
        let note = Note { warning, reason, action: reason, text: truncate(note, 1000) };
        // Boxed: sending is some 3 KB of future state, which every reconcile future that may send
        // an event would otherwise carry inline for its whole life (a hundred run at once).
        if let Err(e) = Box::pin(self.recorder.publish(&object.object_ref(&()), note)).await {
            tracing::warn!(error = %e, object = %object.name_any(), reason, "recording an event failed");
        }
    }

    /// The API of `object`'s kind, in its namespace when it has one.
    pub fn api_of<K: Resource<DynamicType = ()>>(&self, object: &K) -> Api<kube::api::DynamicObject> {
        runtime_support::api_of(&self.client, object)
    }

    /// Writes `status` of `object` by server-side apply, as the manager's one field manager.
    pub async fn apply_status<K>(&self, object: &K, status: serde_json::Value) -> Result<(), kube::Error>
    where
        K: Resource<DynamicType = ()>,
    {
        runtime_support::status::apply_status(&self.client, object, FIELD_MANAGER, status).await
    }
}

/// Event notes are at most 1 kB.
fn truncate(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let cut = (0..=limit).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        text.truncate(cut);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("ééé".into(), 3), "é");
        assert_eq!(truncate("abc".into(), 10), "abc");
    }
}
