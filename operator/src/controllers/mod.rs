//! The reconcilers, one module each, and how they are started: only while this manager leads,
//! with as many workers each as `max-concurrent-reconciles` says when they start.
use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::{EncryptionKeyRotationCronJob, ReclaimSpaceCronJob};
use futures::{Future, StreamExt};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::cache_ready::{self, Ready};
use crate::context::{Context, ReconcileError, record_pass};
use crate::wakeups::Wakeups;

pub mod cronjobs;
pub mod fence;
pub mod fence_class;
pub mod fence_clients;
pub mod group_content;
pub mod group_replication;
pub mod job_kinds;
pub mod jobs;
pub mod node;
pub mod pvc;
pub mod replication_source;
pub mod volume_health;
pub mod volume_replication;

/// How long after a failed pass an object is looked at again.
const ERROR_RETRY: Duration = Duration::from_secs(5);

/// Retries a failed pass after a short wait (the reconcilers back off themselves where it matters).
pub fn error_policy<K>(_object: Arc<K>, _error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    Action::requeue(ERROR_RETRY)
}

/// The namespaced CSI-Addons kinds the generic reconcilers (jobs, cron jobs) work on.
pub trait NamespacedKind:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> NamespacedKind for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// Runs `controller` (its watches already attached) until `stop`: at most
/// `max-concurrent-reconciles` passes at once, by kube's own limit (objects beyond it wait in
/// kube's queue as small entries; a change of the setting restarts the reconcilers), each pass
/// recorded in controller-runtime's series under `name`.
pub async fn run_controller<K, F, Fut>(
    controller: Controller<K>,
    ctx: Arc<Context>,
    name: &'static str,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
    reconcile: F,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    // kube-runtime does not expose its queue: the series is served (dashboards key on it) at 0.
    ctx.metrics.workqueue_depth.with_label_values(&[name, name]).set(0);
    let workers = ctx.settings().max_concurrent_reconciles;
    let config = kube::runtime::Config::default().concurrency(u16::try_from(workers).unwrap_or(u16::MAX).max(1));
    controller
        .with_config(config)
        .graceful_shutdown_on(stop)
        .run(
            // No async block around the pass: one would keep a second copy of its state (a
            // moved-from capture keeps its room), and a hundred of them run at once.
            move |object, ctx: Arc<Context>| record_pass(Arc::clone(&ctx), name, reconcile(object, ctx)),
            error_policy,
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// How every watch lists: from the API server's cache, in pages of 100 (a page is decoded whole
/// before its objects are trimmed; small pages keep that transient peak small).
pub fn list_config() -> watcher::Config {
    watcher::Config::default().any_semantic().page_size(100)
}

/// A watch of `api` cached without managedFields (most of an object's bytes, never read here):
/// the store and the stream of changed objects a controller is driven by.
pub fn trimmed_watch<K>(
    api: Api<K>,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    trimmed_watch_with(api, |_| {})
}

/// A trimmed watch (see `trimmed_watch`) that also applies `trim` to each object before it is
/// cached: what a controller never reads need not be kept.
pub fn trimmed_watch_with<K>(
    api: Api<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, ready, events) = cached_watch(api, trim);
    (store, ready, events.applied_objects())
}

/// Every watch cache of the manager: `api` listed and watched (`list_config`), each object
/// without managedFields and trimmed by `trim` before the store keeps it; the store, when it has
/// its first full list, and the stream of watch events (already applied to the store).
pub fn cached_watch<K>(
    api: Api<K>,
    mut trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let (ready, events) = cache_ready::track(
        watcher(api, list_config())
            .default_backoff()
            .modify(move |object| {
                object.meta_mut().managed_fields = None;
                trim(object);
            })
            .reflect(writer),
    );
    (store, ready, events)
}

/// A trimmed watch (see `trimmed_watch`) whose stream of changed objects keeps only those whose
/// `predicate` value changed: passes for spec changes, not for our own status writes.
pub fn spec_watch<K>(
    api: Api<K>,
    predicate: fn(&K) -> Option<u64>,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, ready, stream) = trimmed_watch(api);
    (store, ready, stream.predicate_filter(predicate, Default::default()))
}

/// Runs every reconciler until `stop`.
pub async fn run_all(ctx: Arc<Context>, volume_health_cleanup: bool, stop: watch::Receiver<bool>) {
    let stopped = |mut stop: watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(crate::attachments::Attachments::follow(ctx.clone(), stopped(stop.clone())));
    let (roster, node_changes, connected) = node::watch(&ctx);
    tasks.spawn(node::run(ctx.clone(), roster.clone(), node_changes, stopped(stop.clone())));
    tasks.spawn(fence::run(ctx.clone(), stopped(stop.clone())));
    tasks.spawn(fence_class::run(ctx.clone(), stopped(stop.clone())));
    tasks.spawn(volume_replication::run(ctx.clone(), stopped(stop.clone())));
    tasks.spawn(group_replication::run(ctx.clone(), stopped(stop.clone())));
    tasks.spawn(group_content::run(ctx.clone(), stopped(stop.clone())));
    tasks.spawn(jobs::run::<api::csiaddons::ReclaimSpaceJob>(ctx.clone(), stopped(stop.clone())));
    tasks.spawn(jobs::run::<api::csiaddons::EncryptionKeyRotationJob>(ctx.clone(), stopped(stop.clone())));
    let (owners, owner_events) = tokio::sync::mpsc::unbounded_channel();
    let managed = cronjobs::ManagedCrons::default();
    let (reclaim_wakeups, rotation_wakeups) = (Wakeups::default(), Wakeups::default());
    let (reclaim, reclaim_ready, reclaim_changes) =
        cronjobs::watch::<ReclaimSpaceCronJob>(&ctx, owners.clone(), managed.clone(), reclaim_wakeups.clone());
    let (rotation, rotation_ready, rotation_changes) =
        cronjobs::watch::<EncryptionKeyRotationCronJob>(&ctx, owners, managed.clone(), rotation_wakeups.clone());
    let crons = pvc::CronCaches {
        reclaim: reclaim.clone(),
        rotation: rotation.clone(),
        ready: [reclaim_ready.clone(), rotation_ready.clone()],
        managed,
    };
    let (stopped_reclaim, stopped_rotation) = (stopped(stop.clone()), stopped(stop.clone()));
    tasks.spawn(cronjobs::run(ctx.clone(), reclaim, reclaim_ready, reclaim_changes, reclaim_wakeups, stopped_reclaim));
    tasks.spawn(cronjobs::run(
        ctx.clone(),
        rotation,
        rotation_ready,
        rotation_changes,
        rotation_wakeups,
        stopped_rotation,
    ));
    tasks.spawn(pvc::run(ctx.clone(), crons, owner_events, (roster, connected), stopped(stop.clone())));
    tasks.spawn(volume_health::run(ctx.clone(), volume_health_cleanup, stop.clone()));
    while tasks.join_next().await.is_some() {}
    ctx.caches.clear();
}

/// Adds or removes `finalizer` on `object` (a no-op when already so), as a compare-and-swap: a
/// concurrent change fails the patch and the pass is retried.
pub async fn set_finalizer<K>(ctx: &Context, object: &K, finalizer: &str, present: bool) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    use kube::ResourceExt;
    let finalizers = object.finalizers();
    if finalizers.iter().any(|f| f == finalizer) == present {
        return Ok(());
    }
    let mut next: Vec<String> = finalizers.iter().filter(|f| *f != finalizer).cloned().collect();
    if present {
        next.push(finalizer.to_owned());
    }
    let patch = serde_json::json!({"metadata": {"finalizers": next, "resourceVersion": object.resource_version()}});
    match merge_patch(ctx, object, &patch).await {
        Err(kube::Error::Api(s)) if s.code == 404 && !present => Ok(()),
        other => other,
    }
}

/// A JSON merge patch of `object`.
async fn merge_patch<K>(ctx: &Context, object: &K, patch: &serde_json::Value) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    use kube::ResourceExt;
    let params = kube::api::PatchParams::default();
    ctx.api_of(object).patch(&object.name_any(), &params, &kube::api::Patch::Merge(patch)).await.map(|_| ())
}

/// A JSON merge patch of `object`; an object already gone is fine.
pub async fn patch_merge<K>(ctx: &Context, object: &K, patch: &serde_json::Value) -> Result<(), ReconcileError>
where
    K: Resource<DynamicType = ()>,
{
    match merge_patch(ctx, object, patch).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => Ok(other?),
    }
}

/// The wait before retrying `object` after a failed operation: 5 s after the first failure,
/// doubling up to 5 minutes; the count lives in `operation_failures` until the object is done.
pub fn retry_delay<K: Resource>(ctx: &Context, object: &K) -> Duration {
    use kube::ResourceExt;
    let mut failures = crate::context::locked(&ctx.operation_failures);
    let count = failures.entry(object.uid().unwrap_or_default()).or_insert(0);
    let delay =
        Duration::from_secs(5).saturating_mul(2u32.saturating_pow((*count).min(6))).min(Duration::from_secs(300));
    *count = count.saturating_add(1);
    delay
}

/// `object` is done with (succeeded, or gone): its failure count goes.
pub fn forget_failures<K: Resource>(ctx: &Context, object: &K) {
    use kube::ResourceExt;
    crate::context::locked(&ctx.operation_failures).remove(&object.uid().unwrap_or_default());
}

/// A predicate for `predicate_filter`: passes come from spec changes (generation) and the start
/// of a deletion, not from our own status writes.
pub fn generation_or_deletion<K: Resource>(object: &K) -> Option<u64> {
    let meta = object.meta();
    let generation = meta.generation.map_or(0, i64::unsigned_abs);
    Some(generation.saturating_mul(2) + u64::from(meta.deletion_timestamp.is_some()))
}
