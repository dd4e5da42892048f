//! One reconciler for both one-shot job kinds (ReclaimSpaceJob, EncryptionKeyRotationJob; upstream
//! has two near-copies). fetch (job, PVC, PV, attachment: from the caches of `VolumeCaches`, a
//! request only for what they do not show yet) → validate → decide
//! (`decide::next_step`) → act (the kind's sidecar calls, within the driver's share of the workers:
//! `shares`) → status and events. What differs per kind is the `JobKind` implementation in `kinds`.
pub mod attachments;
pub mod decide;
pub mod kinds;
pub mod shares;
pub mod side;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::csiaddons::OperationResult;
use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use self::attachments::{Attachments, NotSynced};
use self::decide::{Limits, NoReclaimCall, Step, next_step};
use self::shares::{JobKey, Shares};
use self::side::{BadSide, ChosenSide, RECLAIM_SIDE_ANNOTATION};
use crate::cache_ready::Ready;
use crate::claim::Claim;
use crate::compact::CsiPv;
use crate::controllers::node::Roster;
use crate::core::Core;
use crate::core::action::Action;
use crate::core::backoff::{Backoff, prune_periodically};
use crate::core::clock::now_seconds;
use crate::core::run::Context;
use crate::core::slim::SlimStore;
use crate::core::status::{condition, set_condition};
use crate::primitives::locked;
use crate::primitives::read_cached;
use crate::pv_drivers::PvDrivers;
use crate::sidecars::pool::LookupError;

/// The volume a job acts on.
#[derive(Debug, Clone)]
pub struct Volume {
    pub pvc: String,
    pub pv: String,
    pub driver: String,
    /// The node where a live VolumeAttachment says the volume is attached.
    pub attached_to: Option<String>,
    /// The PVC's StorageClass, and its `csi-addons-rs.io/reclaim-side` annotation.
    pub storage_class: Option<String>,
    pub pvc_reclaim_side: Option<String>,
}

/// What a job reads of its PVC.
struct BoundClaim {
    pv: String,
    storage_class: Option<String>,
    reclaim_side: Option<String>,
}

/// What an attempt did.
#[derive(Debug, Clone, Default)]
pub struct Done {
    pub reclaimed_bytes: Option<i64>,
}

/// Why an attempt failed; the job's status says it, and `permanent` ones are not retried.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("reading PVC {pvc}: {source}")]
    ReadPvc {
        pvc: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("PVC {0} does not exist")]
    NoPvc(String),
    #[error("PVC {0} is not bound yet")]
    NotBound(String),
    #[error("reading PV {pv}: {source}")]
    ReadPv {
        pv: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("PV {0} does not exist")]
    NoPv(String),
    #[error("PV {pv} of PVC {pvc} is not a CSI volume")]
    NotCsi { pv: String, pvc: String },
    #[error("finding where PV {pv} is attached: {source}")]
    Attachment {
        pv: String,
        #[source]
        source: NotSynced,
    },
    #[error(transparent)]
    NoCall(#[from] NoReclaimCall),
    #[error("PV {0} is not attached to any node; key rotation runs where the volume is attached")]
    NotAttached(String),
    #[error(transparent)]
    NoSidecar(#[from] LookupError),
    #[error("Failed to {what} {sidecar}: {code:?}: {message}")]
    /// `what` ends with its preposition: "make node request to", "rotate the key through".
    Call { what: &'static str, sidecar: String, code: tonic::Code, message: String },
    #[error("driver {driver} does not implement EncryptionKeyRotate ({message}); the key was not rotated")]
    RotationUnimplemented { driver: String, message: String },
    #[error(transparent)]
    BadSide(#[from] BadSide),
    #[error("the reclaim side is {} ({}), and driver {driver} does not implement {method}: {message}", .side.side, .side.from)]
    SideUnimplemented { side: ChosenSide, driver: String, method: &'static str, message: String },
    #[error("the StorageClass cache has no full list yet, so StorageClass {0}'s reclaim side is not known")]
    ClassesNotSynced(String),
}

impl AttemptError {
    /// Whether waiting cannot help: the job fails at once.
    pub fn permanent(&self) -> bool {
        match self {
            AttemptError::NotCsi { .. }
            | AttemptError::RotationUnimplemented { .. }
            | AttemptError::BadSide(_)
            | AttemptError::SideUnimplemented { .. } => true,
            AttemptError::NoCall(no_call) => no_call.permanent(),
            _ => false,
        }
    }
}

/// A job's result that could not be written yet: what reclaim space freed, or why it failed.
#[derive(Debug, Clone)]
pub enum Outcome {
    Done(Option<i64>),
    Failed(String),
}

/// The job controller's context: the core, the volume caches, and what it remembers of jobs
/// without a written result (dropped when a job finishes or goes).
pub type JobContext = Context<JobState>;

/// What a pass reads of its volume without a request: where volumes are attached (kept for the
/// jobs), and the PVCs and PV drivers the PVC controller keeps. A job then costs the API server
/// its status write and the driver's Lease read.
#[derive(Clone)]
pub struct VolumeCaches {
    pub attachments: Arc<Attachments>,
    pub claims: SlimStore<Claim>,
    pub drivers: PvDrivers,
    /// The StorageClasses the PVC controller watches, and when they have their first full list.
    pub classes: (Store<StorageClass>, Ready),
    /// Whether every sidecar of a driver is connected, before a side it lacks is taken as final.
    pub roster: Roster,
}

/// How long a job waits for the StorageClass cache's first list before its attempt fails (and is
/// retried): moments after a start it is still listing.
const CLASSES_WAIT: Duration = Duration::from_secs(10);

impl VolumeCaches {
    /// The PV of `namespace/pvc` if the cache has it bound. Otherwise the PVC is read: the cache
    /// may not show it, or its bind, yet.
    fn bound_claim(&self, namespace: &str, pvc: &str) -> Option<BoundClaim> {
        let claim = self.claims.get(Some(namespace), pvc)?;
        Some(BoundClaim {
            pv: claim.rest.bound_volume()?.to_owned(),
            storage_class: claim.rest.storage_class().map(str::to_owned),
            reclaim_side: claim.meta.annotation(RECLAIM_SIDE_ANNOTATION).map(str::to_owned),
        })
    }

    /// `key`'s value on StorageClass `class` (None for a class that does not exist).
    async fn class_annotation(&self, class: &str, key: &str) -> Result<Option<String>, AttemptError> {
        let (store, ready) = &self.classes;
        if !ready.is_ready() && !matches!(tokio::time::timeout(CLASSES_WAIT, ready.wait()).await, Ok(Ok(()))) {
            return Err(AttemptError::ClassesNotSynced(class.to_owned()));
        }
        let found = store.get(&ObjectRef::new(class));
        Ok(found.and_then(|c| c.metadata.annotations.as_ref()?.get(key).cloned()))
    }

    /// The CSI driver of `pv` if the cache has it. A PV it does not know, or knows as not CSI, is
    /// read: a PV that fails a job for good is worth a request to be sure of.
    fn driver(&self, pv: &str) -> Option<String> {
        self.drivers.get(pv).flatten().map(|d| d.to_string())
    }
}

/// What the job controllers alone keep.
pub struct JobState {
    caches: VolumeCaches,
    /// Each driver's share of the workers, and the jobs waiting for one.
    shares: Arc<Shares>,
    /// Failed attempts of jobs without a result yet. In memory only: after a restart a job
    /// retries at once (its status says how many failed), then backs off again.
    failures: Backoff,
    /// Jobs this manager finished whose result the watch cache may not show yet: a pass on the
    /// stale copy must not run the operation again.
    finished: Mutex<HashSet<String>>,
    /// Jobs whose operation ran but whose result could not be written (the API server was away):
    /// UID → the outcome and the attempts made in all, written on the next pass instead of
    /// running the operation again.
    unrecorded: Mutex<HashMap<String, (Outcome, u32)>>,
}

/// A one-shot job kind.
pub trait JobKind: crate::core::watch::NamespacedKind + crate::core::slim::Slimmable {
    /// controller-runtime's name for upstream's controller of this kind.
    const CONTROLLER: &'static str;
    const SUCCESS: &'static str;
    /// The annotations an attempt reads; the cache drops the others.
    const KEPT_ANNOTATIONS: &'static [&'static str];
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
        ctx: &JobContext,
        job: &Self,
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

pub async fn run<K: JobKind>(
    core: Arc<Core>,
    caches: VolumeCaches,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Cached slim (`core::slim`) and as a pass reads them: no labels, owners or annotations but
    // those the kind reads; of a finished job only the outcome (finished jobs are kept for as long
    // as they exist).
    let (store, ready, events) = crate::core::watch::slim_watch(core.watched::<K>(), |job: &mut K| {
        let meta = job.meta_mut();
        (meta.labels, meta.owner_references) = (None, None);
        meta.annotations = meta.annotations.take().and_then(|mut annotations| {
            annotations.retain(|key, _| K::KEPT_ANNOTATIONS.contains(&key.as_str()));
            (!annotations.is_empty()).then_some(annotations)
        });
        job.keep_only_outcome();
    });
    let changes = crate::core::watch::changed_objects(events, store.clone());
    core.caches.follow(K::CONTROLLER, ready);
    let (shares, woken) = Shares::new(core.settings().max_concurrent_reconciles);
    let state = JobState {
        caches,
        shares,
        failures: Backoff::default(),
        finished: Mutex::default(),
        unrecorded: Mutex::default(),
    };
    let ctx = Arc::new(Context::new(core, state));
    // Jobs deleted before they finished (pruned, replaced, garbage-collected) are forgotten.
    prune_periodically(Arc::downgrade(&ctx), store.clone(), |ctx: &JobContext, live| {
        ctx.state.failures.retain(live);
        ctx.state.shares.retain(live);
        locked(&ctx.state.finished).retain(|uid| live.contains(uid));
        locked(&ctx.state.unrecorded).retain(|uid, _| live.contains(uid));
    });
    // A job queued for its driver's share runs again as soon as a call of that driver ends.
    let woken = woken.map(|job| ObjectRef::<K>::new(&job.name).within(&job.namespace));
    let controller = crate::core::queue::Triggers::new(changes).on(woken).slim_controller(store);
    crate::core::run::run_controller(controller, ctx, K::CONTROLLER, stop, reconcile::<K>).await;
}

fn forget(ctx: &JobContext, uid: &str) {
    ctx.state.failures.forget(uid);
    ctx.state.shares.forget(uid);
    locked(&ctx.state.unrecorded).remove(uid);
}

pub(crate) async fn reconcile<K: JobKind>(job: Arc<K>, ctx: Arc<JobContext>) -> Result<Action, kube::Error> {
    let uid = job.uid().unwrap_or_default();
    let status = status_of(job.as_ref());
    if job.meta().deletion_timestamp.is_some() || status.result.is_some() {
        forget(&ctx, &uid);
        locked(&ctx.state.finished).remove(&uid);
        return Ok(Action::await_change());
    }
    // Finished by us, and this copy predates the result: never run the operation again.
    if locked(&ctx.state.finished).contains(&uid) {
        return Ok(Action::await_change());
    }
    let now = now_seconds();
    let start = status.start_time.as_ref().map_or(now, |t| t.0.as_second());
    // Run, but its result never written: write it now rather than run the operation twice.
    let unrecorded = locked(&ctx.state.unrecorded).get(&uid).cloned();
    if let Some((outcome, attempts)) = unrecorded {
        return Box::pin(finish(&ctx, job.as_ref(), &status, (start, attempts), outcome)).await;
    }
    if let Some(why) = api::names::dns1123_problem(job.pvc(), false) {
        let shown: String = job.pvc().chars().take(80).collect();
        let message = format!("spec.target.persistentVolumeClaim {shown:?} is not a PVC name: {why}");
        return Box::pin(finish(&ctx, job.as_ref(), &status, (start, 0), Outcome::Failed(message))).await;
    }
    let limits = job.limits();
    let created = job.meta().creation_timestamp.as_ref().map_or(now, |t| t.0.as_second());
    let (failures, last_failure) =
        decide::failures_so_far(ctx.state.failures.get(&uid), status.start_time.is_some(), status.retries);
    match next_step(limits, created, now, failures, last_failure) {
        Step::GiveUp(limit) => {
            // The reason of the last failed attempt, which the status holds, says what to fix.
            let last = status.conditions.iter().find(|c| c.type_ == "Failed" && c.status == "True");
            let message = match last.filter(|c| !c.message.is_empty()) {
                Some(last) => format!("{limit}; last error: {}", last.message),
                None => limit.to_string(),
            };
            return Box::pin(finish(&ctx, job.as_ref(), &status, (start, failures), Outcome::Failed(message))).await;
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
    let key = || JobKey { uid: uid.clone(), namespace: job.namespace().unwrap_or_default(), name: job.name_any() };
    // A job woken from its driver's line takes its share first: one still over it reads nothing.
    let early = match ctx.state.shares.queued_for(&uid) {
        Some(driver) => match ctx.state.shares.take(&driver, &key()) {
            Some(share) => Some(share),
            None => return Ok(Action::requeue(SHARE_RECHECK)),
        },
        None => None,
    };
    let outcome = match volume(&ctx, job.as_ref()).await {
        Ok(volume) => match early.or_else(|| ctx.state.shares.take(&volume.driver, &key())) {
            Some(_share) => K::attempt(&ctx, job.as_ref(), &volume, timeout).await,
            None => {
                tracing::debug!(job = %job.name_any(), driver = %volume.driver, "the driver's share of the workers is taken: queued");
                return Ok(Action::requeue(SHARE_RECHECK));
            }
        },
        Err(e) => {
            drop(early);
            Err(e)
        }
    };
    // This pass's attempt included.
    let attempts = failures + 1;
    let failed = match outcome {
        Ok(done) => {
            let outcome = Outcome::Done(done.reclaimed_bytes);
            return Box::pin(finish(&ctx, job.as_ref(), &status, (start, attempts), outcome)).await;
        }
        Err(failed) if failed.permanent() => {
            let outcome = Outcome::Failed(failed.to_string());
            return Box::pin(finish(&ctx, job.as_ref(), &status, (start, attempts), outcome)).await;
        }
        Err(failed) => failed.to_string(),
    };
    // Failures in a row: this one and those before it, which after a restart only the status
    // knows; so the limit and the growing delay carry on where they were.
    let now = now_seconds();
    let failures = attempts;
    ctx.state.failures.set(&uid, failures, now);
    match next_step(limits, created, now, failures, Some(now)) {
        Step::GiveUp(limit) => {
            let outcome = Outcome::Failed(format!("{limit}; last error: {failed}"));
            Box::pin(finish(&ctx, job.as_ref(), &status, (start, attempts), outcome)).await
        }
        Step::Wait(delay) => {
            tracing::info!(job = %job.name_any(), failures, error = %failed, ?delay, "attempt failed; retrying");
            let generation = job.meta().generation;
            let conditions =
                set_condition(&status.conditions, condition("Failed", true, "failed", &failed, generation));
            let start = Time(k8s_openapi::jiff::Timestamp::from_second(start).unwrap_or_default());
            let patch = json!({"startTime": start, "retries": retries(attempts), "conditions": conditions});
            Box::pin(ctx.apply_status(job.as_ref(), patch)).await?;
            ctx.event(job.as_ref(), true, "AttemptFailed", format!("attempt {failures} failed: {failed}")).await;
            Ok(Action::requeue(delay))
        }
        Step::Attempt => Ok(Action::requeue(Duration::from_secs(1))),
    }
}

/// When a job queued for its driver's share looks again by itself. It is woken as soon as a call
/// of its driver ends (a job woken that finishes otherwise passes its turn on), so this is only a
/// safety net.
const SHARE_RECHECK: Duration = Duration::from_secs(60);

/// `status.retries` as upstream counts it: the attempts after the first, so a job that gives up
/// after its first try and `backOffLimit` retries says `backOffLimit`.
fn retries(attempts: u32) -> i32 {
    i32::try_from(attempts.saturating_sub(1)).unwrap_or(i32::MAX)
}

/// Writes the result, records the event and the metrics; the job is done. `attempts`: how many
/// were made in all.
async fn finish<K: JobKind>(
    ctx: &JobContext,
    job: &K,
    status: &JobStatus,
    (start, attempts): (i64, u32),
    outcome: Outcome,
) -> Result<Action, kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let start_time = k8s_openapi::jiff::Timestamp::from_second(start).unwrap_or(now);
    let generation = job.meta().generation;
    let uid = job.uid().unwrap_or_default();
    let retries = retries(attempts).max(status.retries.unwrap_or(0));
    let (result, message, conditions, reclaimed) = match &outcome {
        Outcome::Done(reclaimed) => (
            OperationResult::Succeeded,
            K::SUCCESS.to_owned(),
            set_condition(&status.conditions, condition("Failed", false, "succeeded", "", generation)),
            *reclaimed,
        ),
        Outcome::Failed(message) => (
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
        locked(&ctx.state.unrecorded).insert(uid, (outcome, attempts));
        return Err(e);
    }
    if let Some(bytes) = reclaimed {
        ctx.metrics.reclaimed_bytes.inc_by(bytes.unsigned_abs());
    }
    forget(ctx, &uid);
    locked(&ctx.state.finished).insert(uid);
    let (label, warning) = match result {
        OperationResult::Succeeded => ("Succeeded", false),
        OperationResult::Failed => ("Failed", true),
    };
    ctx.metrics.operation_ended(K::kind(&()).as_ref(), label);
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
async fn volume<K: JobKind>(ctx: &JobContext, job: &K) -> Result<Volume, AttemptError> {
    let namespace = job.namespace().unwrap_or_default();
    let name = job.pvc();
    let pvc_name = || format!("{namespace}/{name}");
    // Each object is read into a box and dropped before the next request: a PV is kilobytes
    // inline, and a hundred passes wait here at once.
    let caches = &ctx.state.caches;
    let claim = if let Some(claim) = caches.bound_claim(&namespace, name) {
        claim
    } else {
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace);
        let pvc = Box::pin(read_cached(&pvcs, name))
            .await
            .map_err(|source| AttemptError::ReadPvc { pvc: pvc_name(), source: Box::new(source) })?
            .ok_or_else(|| AttemptError::NoPvc(pvc_name()))?;
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let reclaim_side = pvc.metadata.annotations.and_then(|mut a| a.remove(RECLAIM_SIDE_ANNOTATION));
        let spec = pvc.spec.unwrap_or_default();
        let pv =
            spec.volume_name.filter(|v| bound && !v.is_empty()).ok_or_else(|| AttemptError::NotBound(pvc_name()))?;
        BoundClaim { pv, storage_class: spec.storage_class_name, reclaim_side }
    };
    let BoundClaim { pv: pv_name, storage_class, reclaim_side: pvc_reclaim_side } = claim;
    let driver = if let Some(driver) = caches.driver(&pv_name) {
        driver
    } else {
        let pvs = Api::<CsiPv>::all(ctx.client.clone());
        let pv = Box::pin(read_cached(&pvs, &pv_name))
            .await
            .map_err(|source| AttemptError::ReadPv { pv: pv_name.clone(), source: Box::new(source) })?
            .ok_or_else(|| AttemptError::NoPv(pv_name.clone()))?;
        let Some(csi) = pv.spec.and_then(|s| s.csi) else {
            return Err(AttemptError::NotCsi { pv: pv_name, pvc: pvc_name() });
        };
        csi.driver
    };
    let attached_to = caches
        .attachments
        .node_of(&pv_name)
        .await
        .map_err(|source| AttemptError::Attachment { pv: pv_name.clone(), source })?;
    Ok(Volume { pvc: name.to_owned(), attached_to, pv: pv_name, driver, storage_class, pvc_reclaim_side })
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
