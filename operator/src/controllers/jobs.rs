//! One reconciler for both one-shot job kinds (ReclaimSpaceJob, EncryptionKeyRotationJob; upstream
//! has two near-copies). fetch (job, PVC, PV, attachment) → validate → decide (`job::next_step`)
//! → act (the kind's sidecar calls) → status and events. What differs per kind is the
//! `JobKind` implementation in `job_kinds`.
use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::OperationResult;
use futures::Future;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::compact::CsiPv;
use crate::context::{Context, ReconcileError, condition, locked, now_seconds, read_cached, set_condition};
use crate::job::{Limits, Step, next_step};

/// The volume a job acts on.
#[derive(Debug, Clone)]
pub struct Volume {
    pub pvc: String,
    pub pv: String,
    pub driver: String,
    /// The node where a live VolumeAttachment says the volume is attached.
    pub attached_to: Option<String>,
}

/// What an attempt did.
#[derive(Debug, Clone, Default)]
pub struct Done {
    pub reclaimed_bytes: Option<i64>,
}

/// Why an attempt failed: worth retrying, or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptError {
    Transient(String),
    Permanent(String),
}

/// A one-shot job kind.
pub trait JobKind: super::NamespacedKind {
    /// controller-runtime's name for upstream's controller of this kind.
    const CONTROLLER: &'static str;
    const SUCCESS: &'static str;
    fn pvc(&self) -> &str;
    fn limits(&self) -> Limits;
    /// `spec.timeout` in seconds.
    fn timeout(&self) -> Option<i64>;
    /// The timeout when the spec gives none.
    fn default_timeout(settings: &crate::config::Settings) -> Duration;
    /// Of a finished job, forgets all of the status but the result and its times (all that the
    /// job and cron-job passes read of it).
    fn keep_only_outcome(&mut self);
    /// One attempt of the operation.
    fn attempt(
        ctx: &Context,
        volume: &Volume,
        timeout: Duration,
    ) -> impl Future<Output = Result<Done, AttemptError>> + Send;
}

/// The status fields both kinds share.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JobStatus {
    result: Option<OperationResult>,
    #[serde(default)]
    conditions: Vec<Condition>,
    retries: Option<i32>,
    start_time: Option<Time>,
}

fn status_of<K: Serialize>(job: &K) -> JobStatus {
    serde_json::to_value(job)
        .ok()
        .and_then(|mut v| v.get_mut("status").map(serde_json::Value::take))
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default()
}

pub async fn run<K: JobKind>(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    // Cached as a pass reads them: no labels, annotations or owners; of a finished job only the
    // outcome (finished jobs are kept for as long as they exist).
    let (store, ready, changes) = super::trimmed_watch_with(ctx.watched::<K>(), |job: &mut K| {
        let meta = job.meta_mut();
        (meta.labels, meta.annotations, meta.owner_references) = (None, None, None);
        job.keep_only_outcome();
    });
    ctx.caches.follow(K::CONTROLLER, ready);
    prune_memory(&ctx, store.clone());
    super::run_controller(Controller::for_stream(changes, store), ctx, K::CONTROLLER, stop, reconcile::<K>).await;
}

fn forget(ctx: &Context, uid: &str) {
    locked(&ctx.job_failures).remove(uid);
    locked(&ctx.unrecorded_results).remove(uid);
}

/// Drops what is remembered about jobs that no longer exist (deleted before they finished:
/// pruned, replaced, garbage-collected), every few minutes while the controller runs.
fn prune_memory<K: JobKind>(ctx: &Arc<Context>, store: Store<K>) {
    let ctx = Arc::downgrade(ctx);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(300)).await;
            let Some(ctx) = ctx.upgrade() else { return };
            let live: std::collections::HashSet<String> = store.state().iter().filter_map(|j| j.uid()).collect();
            locked(&ctx.job_failures).retain(|uid, _| live.contains(uid));
            locked(&ctx.finished_jobs).retain(|uid| live.contains(uid));
            locked(&ctx.unrecorded_results).retain(|uid, _| live.contains(uid));
        }
    });
}

async fn reconcile<K: JobKind>(job: Arc<K>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let uid = job.uid().unwrap_or_default();
    let status = status_of(job.as_ref());
    if job.meta().deletion_timestamp.is_some() || status.result.is_some() {
        forget(&ctx, &uid);
        locked(&ctx.finished_jobs).remove(&uid);
        return Ok(Action::await_change());
    }
    // Finished by us, and this copy predates the result: never run the operation again.
    if locked(&ctx.finished_jobs).contains(&uid) {
        return Ok(Action::await_change());
    }
    let now = now_seconds();
    let start = status.start_time.as_ref().map_or(now, |t| t.0.as_second());
    // Run, but its result never written: write it now rather than run the operation twice.
    let unrecorded = locked(&ctx.unrecorded_results).get(&uid).cloned();
    if let Some((outcome, attempts)) = unrecorded {
        let outcome = outcome.map(|reclaimed_bytes| Done { reclaimed_bytes });
        return Box::pin(finish(&ctx, job.as_ref(), &status, (start, attempts), outcome)).await;
    }
    if let Some(why) = api::names::dns1123_problem(job.pvc(), false) {
        let shown: String = job.pvc().chars().take(80).collect();
        let message = format!("spec.target.persistentVolumeClaim {shown:?} is not a PVC name: {why}");
        return Box::pin(finish(&ctx, job.as_ref(), &status, (start, 0), Err(message))).await;
    }
    let limits = job.limits();
    let created = job.meta().creation_timestamp.as_ref().map_or(now, |t| t.0.as_second());
    let remembered = locked(&ctx.job_failures).get(&uid).copied();
    let (failures, last_failure) = match remembered {
        Some((failures, at)) => (failures, Some(at)),
        // After a restart: the count from status, and retry now. A start time is written with
        // the first failed attempt, and `retries` counts the attempts after it.
        None if status.start_time.is_some() => {
            (status.retries.and_then(|n| u32::try_from(n).ok()).unwrap_or(0).saturating_add(1), None)
        }
        None => (0, None),
    };
    match next_step(limits, created, now, failures, last_failure) {
        Step::GiveUp(limit) => {
            // The reason of the last failed attempt, which the status holds, says what to fix.
            let last = status.conditions.iter().find(|c| c.type_ == "Failed" && c.status == "True");
            let message = match last.filter(|c| !c.message.is_empty()) {
                Some(last) => format!("{limit}; last error: {}", last.message),
                None => limit,
            };
            return Box::pin(finish(&ctx, job.as_ref(), &status, (start, failures), Err(message))).await;
        }
        Step::Wait(delay) => return Ok(Action::requeue(delay)),
        Step::Attempt => {}
    }
    // No status write before the attempt (upstream writes once per pass too): startTime goes
    // out with the result, or with the first failed attempt.
    let timeout = job
        .timeout()
        .filter(|t| *t > 0)
        .map_or_else(|| K::default_timeout(&ctx.settings()), |t| Duration::from_secs(t.unsigned_abs()));
    let outcome = match volume(&ctx, job.as_ref()).await {
        Ok(volume) => K::attempt(&ctx, &volume, timeout).await,
        Err(e) => Err(e),
    };
    // This pass's attempt included.
    let attempts = failures + 1;
    match outcome {
        Ok(done) => Box::pin(finish(&ctx, job.as_ref(), &status, (start, attempts), Ok(done))).await,
        Err(AttemptError::Permanent(message)) => {
            Box::pin(finish(&ctx, job.as_ref(), &status, (start, attempts), Err(message))).await
        }
        Err(AttemptError::Transient(message)) => {
            let failures = failures + 1;
            let now = now_seconds();
            locked(&ctx.job_failures).insert(uid, (failures, now));
            match next_step(limits, created, now, failures, Some(now)) {
                Step::GiveUp(limit) => {
                    let message = format!("{limit}; last error: {message}");
                    Box::pin(finish(&ctx, job.as_ref(), &status, (start, attempts), Err(message))).await
                }
                Step::Wait(delay) => {
                    tracing::info!(job = %job.name_any(), failures, error = %message, ?delay, "attempt failed; retrying");
                    let generation = job.meta().generation;
                    let conditions =
                        set_condition(&status.conditions, condition("Failed", true, "failed", &message, generation));
                    let start = Time(k8s_openapi::jiff::Timestamp::from_second(start).unwrap_or_default());
                    let patch = json!({"startTime": start, "retries": retries(attempts), "conditions": conditions});
                    Box::pin(ctx.apply_status(job.as_ref(), patch)).await?;
                    ctx.event(job.as_ref(), true, "AttemptFailed", format!("attempt {failures} failed: {message}"))
                        .await;
                    Ok(Action::requeue(delay))
                }
                Step::Attempt => Ok(Action::requeue(Duration::from_secs(1))),
            }
        }
    }
}

/// `status.retries` as upstream counts it: the attempts after the first, so a job that gives up
/// after its first try and `backOffLimit` retries says `backOffLimit`.
fn retries(attempts: u32) -> i32 {
    i32::try_from(attempts.saturating_sub(1)).unwrap_or(i32::MAX)
}

/// Writes the result, records the event and the metrics; the job is done. `attempts`: how many
/// were made in all.
async fn finish<K: JobKind>(
    ctx: &Context,
    job: &K,
    status: &JobStatus,
    (start, attempts): (i64, u32),
    outcome: Result<Done, String>,
) -> Result<Action, ReconcileError> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let start_time = k8s_openapi::jiff::Timestamp::from_second(start).unwrap_or(now);
    let generation = job.meta().generation;
    let uid = job.uid().unwrap_or_default();
    let retries = retries(attempts).max(status.retries.unwrap_or(0));
    let (result, message, conditions, reclaimed) = match &outcome {
        Ok(done) => (
            OperationResult::Succeeded,
            K::SUCCESS.to_owned(),
            set_condition(&status.conditions, condition("Failed", false, "succeeded", "", generation)),
            done.reclaimed_bytes,
        ),
        Err(message) => (
            OperationResult::Failed,
            message.clone(),
            set_condition(&status.conditions, condition("Failed", true, "failed", message, generation)),
            None,
        ),
    };
    let mut body = json!({
        "result": result,
        "message": message,
        "conditions": conditions,
        "retries": retries,
        "startTime": Time(start_time),
        "completionTime": Time(now),
    });
    if let Some(bytes) = reclaimed {
        body["reclaimedSpace"] = json!(bytes.to_string());
    }
    if let Err(e) = ctx.apply_status(job, body).await {
        let outcome = outcome.map(|done| done.reclaimed_bytes);
        locked(&ctx.unrecorded_results).insert(uid, (outcome, attempts));
        return Err(e.into());
    }
    if let Some(bytes) = reclaimed {
        ctx.metrics.reclaimed_bytes.inc_by(bytes.unsigned_abs());
    }
    forget(ctx, &uid);
    locked(&ctx.finished_jobs).insert(uid);
    let (label, warning) = match result {
        OperationResult::Succeeded => ("Succeeded", false),
        OperationResult::Failed => ("Failed", true),
    };
    ctx.metrics.operations.with_label_values(&[K::kind(&()).as_ref(), label]).inc();
    ctx.metrics
        .operation_duration
        .with_label_values(&[K::kind(&()).as_ref()])
        .observe((now.as_second() - start).max(0) as f64);
    let note = match reclaimed {
        Some(bytes) => format!("{message} Reclaimed {bytes} bytes."),
        None => message,
    };
    ctx.event(job, warning, label, note).await;
    Ok(Action::await_change())
}

/// The job's PVC, its PV and where it is attached. A PVC not (yet) there or not bound is worth
/// retrying; a PV that is not CSI is not.
async fn volume<K: JobKind>(ctx: &Context, job: &K) -> Result<Volume, AttemptError> {
    let namespace = job.namespace().unwrap_or_default();
    let name = job.pvc();
    // Each object is read into a box and dropped before the next request: a PV is kilobytes
    // inline, and a hundred passes wait here at once.
    let pv_name = {
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace);
        let pvc = Box::pin(read_cached(&pvcs, name))
            .await
            .map_err(|e| AttemptError::Transient(format!("reading PVC {namespace}/{name}: {e}")))?
            .ok_or_else(|| AttemptError::Transient(format!("PVC {namespace}/{name} does not exist")))?;
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let pv_name = pvc.spec.and_then(|s| s.volume_name).filter(|v| !v.is_empty());
        pv_name
            .filter(|_| bound)
            .ok_or_else(|| AttemptError::Transient(format!("PVC {namespace}/{name} is not bound yet")))?
    };
    let driver = {
        let pvs = Api::<CsiPv>::all(ctx.client.clone());
        let pv = Box::pin(read_cached(&pvs, &pv_name))
            .await
            .map_err(|e| AttemptError::Transient(format!("reading PV {pv_name}: {e}")))?
            .ok_or_else(|| AttemptError::Transient(format!("PV {pv_name} does not exist")))?;
        let Some(csi) = pv.spec.and_then(|s| s.csi) else {
            return Err(AttemptError::Permanent(format!("PV {pv_name} of PVC {namespace}/{name} is not a CSI volume")));
        };
        csi.driver
    };
    let attached_to = ctx
        .attachments
        .node_of(&pv_name)
        .await
        .map_err(|e| AttemptError::Transient(format!("finding where PV {pv_name} is attached: {e}")))?;
    Ok(Volume { pvc: name.to_owned(), attached_to, pv: pv_name, driver })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_shared_status_is_read_from_either_kind() {
        let mut job = api::csiaddons::ReclaimSpaceJob::new("j", Default::default());
        assert!(status_of(&job).result.is_none());
        job.status = Some(api::csiaddons::ReclaimSpaceJobStatus {
            result: Some(OperationResult::Failed),
            retries: Some(2),
            ..Default::default()
        });
        let status = status_of(&job);
        assert_eq!((status.result, status.retries), (Some(OperationResult::Failed), Some(2)));
    }
}
