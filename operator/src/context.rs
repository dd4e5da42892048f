//! What every reconciler shares: the client, the sidecar pool, the settings in force, metrics,
//! events, and the small helpers of the "write status" step (server-side apply with one field
//! manager, conditions that keep their transition time).
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::attachments::Attachments;
use crate::config::Settings;
use crate::events::{EventRecorder, Note};
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::sidecar_client::Security;

/// The one field manager of everything the manager writes.
pub const FIELD_MANAGER: &str = "csi-addons-manager";

/// Why a reconcile pass could not finish; retried with a backoff by `error_policy`. Problems a
/// user must fix are not errors: they end in the object's status and an event.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Transient(String),
}

/// A job's outcome not yet written (reclaimed bytes, or why it failed), and its attempts in all.
pub type UnrecordedResult = (Result<Option<i64>, String>, u32);

/// Shared by every reconciler.
pub struct Context {
    pub client: kube::Client,
    pub pool: Arc<Pool>,
    /// Where volumes are attached (kept while this manager leads).
    pub attachments: Attachments,
    pub security: Security,
    pub settings: watch::Receiver<Settings>,
    pub metrics: Metrics,
    pub recorder: EventRecorder,
    /// Failed attempts of jobs without a result yet: UID → (failures, when the last one failed).
    /// In memory only: after a restart a job retries at once, then backs off again.
    pub job_failures: Mutex<HashMap<String, (u32, i64)>>,
    /// Jobs this manager finished whose result the watch cache may not show yet: a pass on the
    /// stale copy must not run the operation again.
    pub finished_jobs: Mutex<HashSet<String>>,
    /// Jobs whose operation ran but whose result could not be written (the API server was away):
    /// UID → the outcome (reclaimed bytes, or the failure), written on the next pass instead of
    /// running the operation again; with the attempts made in all.
    pub unrecorded_results: Mutex<HashMap<String, UnrecordedResult>>,
    /// CSIAddonsNode UID → when its next connection attempt is due (seconds): our own status
    /// write triggers a pass at once, which must not cut the backoff short.
    pub node_retry_at: Mutex<HashMap<String, i64>>,
    /// Failed operations in a row of objects retried with a growing delay (fences), by UID.
    pub operation_failures: Mutex<HashMap<String, u32>>,
    /// CSIAddonsNodes whose spec cannot be used (state Failed), by UID.
    pub failed_nodes: Mutex<HashSet<String>>,
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

impl Context {
    pub fn new(
        client: kube::Client,
        security: Security,
        settings: watch::Receiver<Settings>,
        metrics: Metrics,
        instance: Option<String>,
        watch_namespace: Option<String>,
        caches: CacheSync,
    ) -> Self {
        let recorder = EventRecorder::new(client.clone(), FIELD_MANAGER, instance);
        Context {
            client,
            pool: Arc::new(Pool::default()),
            attachments: Attachments::default(),
            security,
            settings,
            metrics,
            recorder,
            job_failures: Mutex::new(HashMap::new()),
            finished_jobs: Mutex::new(HashSet::new()),
            unrecorded_results: Mutex::new(HashMap::new()),
            node_retry_at: Mutex::new(HashMap::new()),
            failed_nodes: Mutex::new(HashSet::new()),
            operation_failures: Mutex::new(HashMap::new()),
            watch_namespace,
            caches,
        }
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
        let resource = kube::api::ApiResource::erase::<K>(&());
        match object.namespace() {
            Some(namespace) => Api::namespaced_with(self.client.clone(), &namespace, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        }
    }

    /// Writes `status` of `object` by server-side apply, as the manager's one field manager.
    pub async fn apply_status<K>(&self, object: &K, status: serde_json::Value) -> Result<(), kube::Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let api = self.api_of(object);
        // Unset fields are left out (an explicit null is not a value to apply).
        let status = match status {
            serde_json::Value::Object(fields) => {
                serde_json::Value::Object(fields.into_iter().filter(|(_, v)| !v.is_null()).collect())
            }
            other => other,
        };
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        api.patch_status(&object.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
            .await
            .map(|_| ())
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

/// `conditions` with `next` set: its lastTransitionTime is kept when the status did not change.
pub fn set_condition(conditions: &[Condition], mut next: Condition) -> Vec<Condition> {
    let mut out: Vec<Condition> = conditions.iter().filter(|c| c.type_ != next.type_).cloned().collect();
    if let Some(previous) = conditions.iter().find(|c| c.type_ == next.type_)
        && previous.status == next.status
    {
        next.last_transition_time = previous.last_transition_time.clone();
    }
    out.push(next);
    out
}

/// A condition set now.
pub fn condition(type_: &str, status: bool, reason: &str, message: &str, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// Seconds since the epoch, now.
pub fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// Runs one reconcile pass of controller `name`, recording controller-runtime's series. How many
/// run at once is kube's own limit (`controllers::run_controller`).
///
/// A combinator rather than an async fn: an async fn would hold the pass twice (its argument and
/// the future it awaits each keep their room), some 2.5 KB more for each of a hundred passes.
pub fn record_pass<F>(
    ctx: Arc<Context>,
    name: &'static str,
    pass: F,
) -> impl Future<Output = Result<Action, ReconcileError>>
where
    F: Future<Output = Result<Action, ReconcileError>>,
{
    let active = ctx.metrics.active_workers.with_label_values(&[name]);
    active.inc();
    let started = Instant::now();
    pass.map(move |result| {
        active.dec();
        let metrics = &ctx.metrics;
        metrics.reconcile_time.with_label_values(&[name]).observe(started.elapsed().as_secs_f64());
        let label = match &result {
            Ok(action) if *action == Action::await_change() => "success",
            Ok(_) => "requeue_after",
            Err(_) => "error",
        };
        metrics.reconcile_total.with_label_values(&[name, label]).inc();
        if let Err(e) = &result {
            metrics.reconcile_errors.with_label_values(&[name]).inc();
            tracing::warn!(controller = name, error = %e, "reconcile failed; retrying");
        }
        result
    })
}

/// `name` as the API server's watch cache has it (resourceVersion "0", what an informer would
/// show): no etcd round trip, which per-job reads would otherwise cost at every job. A read a
/// moment stale is retried like any other transient state. None when it does not exist.
pub async fn read_cached<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.get_with(name, &kube::api::GetParams::any()).await {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// The locked value, even if a panic elsewhere poisoned the lock (the maps stay consistent:
/// every update is a single insert or remove).
pub fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let mut first = condition("Failed", true, "failed", "one", Some(1));
        first.last_transition_time = Time(k8s_openapi::jiff::Timestamp::from_second(1000).unwrap());
        let again = set_condition(std::slice::from_ref(&first), condition("Failed", true, "failed", "two", Some(1)));
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].message, "two");
        assert_eq!(again[0].last_transition_time, first.last_transition_time);
        let flipped = set_condition(&again, condition("Failed", false, "ok", "", Some(1)));
        assert_ne!(flipped[0].last_transition_time, first.last_transition_time);
    }

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("ééé".into(), 3), "é");
        assert_eq!(truncate("abc".into(), 10), "abc");
    }
}
