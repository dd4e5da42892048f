//! The reconcilers, one module each, and how they are started: only while this manager leads,
//! each with its live-resized workers.
use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::{EncryptionKeyRotationCronJob, ReclaimSpaceCronJob};
use futures::StreamExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::context::{Context, ReconcileError, Workers, follow_worker_setting};

pub mod cronjobs;
pub mod job_kinds;
pub mod jobs;
pub mod node;
pub mod pvc;
pub mod volume_health;

/// How long after a failed pass an object is looked at again.
const ERROR_RETRY: Duration = Duration::from_secs(5);

/// Retries a failed pass after a short wait (the reconcilers back off themselves where it matters).
pub fn error_policy<K>(_object: Arc<K>, _error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    Action::requeue(ERROR_RETRY)
}

/// The workers of controller `name`, following `max-concurrent-reconciles`.
pub fn workers(ctx: &Context, name: &'static str) -> Arc<Workers> {
    let workers = Workers::new(name, ctx.settings().max_concurrent_reconciles, ctx.metrics.clone());
    follow_worker_setting(&workers, ctx.settings.clone());
    workers
}

/// kube's own limit of reconciles at once, from `max-concurrent-reconciles` when the controllers
/// start (a change restarts them). Objects beyond it wait in kube's queue as a small entry; an
/// unlimited queue of waiting reconciles would make each pass of kube's scheduler scan them all.
pub fn controller_config(ctx: &Context) -> kube::runtime::Config {
    let workers = ctx.settings().max_concurrent_reconciles;
    kube::runtime::Config::default().concurrency(u16::try_from(workers).unwrap_or(u16::MAX).max(1))
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
) -> (Store<K>, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, list_config())
        .default_backoff()
        .modify(|object| object.meta_mut().managed_fields = None)
        .reflect(writer)
        .applied_objects();
    (store, stream)
}

/// Drains a controller's result stream (results are already recorded by `Workers::run`).
pub async fn drain<S: futures::Stream + Send>(stream: S) {
    stream.for_each(|_| futures::future::ready(())).await;
}

/// Runs every reconciler until `stop`.
pub async fn run_all(ctx: Arc<Context>, volume_health_cleanup: bool, stop: watch::Receiver<bool>) {
    let stopped = |mut stop: watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(node::run(ctx.clone(), stopped(stop.clone())));
    tasks.spawn(jobs::run::<api::csiaddons::ReclaimSpaceJob>(ctx.clone(), stopped(stop.clone())));
    tasks.spawn(jobs::run::<api::csiaddons::EncryptionKeyRotationJob>(ctx.clone(), stopped(stop.clone())));
    let (owners, owner_events) = tokio::sync::mpsc::unbounded_channel();
    let (reclaim, reclaim_changes) = cronjobs::watch::<ReclaimSpaceCronJob>(&ctx, owners.clone());
    let (rotation, rotation_changes) = cronjobs::watch::<EncryptionKeyRotationCronJob>(&ctx, owners);
    let crons = pvc::CronCaches { reclaim: reclaim.clone(), rotation: rotation.clone() };
    tasks.spawn(cronjobs::run(ctx.clone(), reclaim, reclaim_changes, stopped(stop.clone())));
    tasks.spawn(cronjobs::run(ctx.clone(), rotation, rotation_changes, stopped(stop.clone())));
    tasks.spawn(pvc::run(ctx.clone(), crons, owner_events, stopped(stop.clone())));
    tasks.spawn(volume_health::run(ctx.clone(), volume_health_cleanup, stop.clone()));
    while tasks.join_next().await.is_some() {}
    ctx.caches.clear();
}
