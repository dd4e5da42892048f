//! One reconciler for both cron job kinds (ReclaimSpaceCronJob, EncryptionKeyRotationCronJob;
//! upstream has two near-copies). fetch (cron job, its children from a watch cache) → validate
//! (schedule) → decide (`decide::decide`, pure) → act (prune, create, replace) → status, events.
pub mod decide;

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::csiaddons::{
    ConcurrencyPolicy, CronJobStatus, EncryptionKeyRotationCronJob, EncryptionKeyRotationCronJobSpec,
    EncryptionKeyRotationJob, JobTemplateMetadata, OperationResult, ReclaimSpaceCronJob, ReclaimSpaceCronJobSpec,
    ReclaimSpaceJob,
};
use futures::{Future, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{DeleteParams, ObjectMeta, PostParams, PropagationPolicy};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use self::decide::{Child, CronAction, CronInput, CronStatus, Outcome, decide, stagger_offset};
use crate::cache_ready::{Ready, Stopped};
use crate::controllers::jobs::JobKind;
use crate::controllers::pvc::decide::{MANAGED, STATE};
use crate::core::Core;
use crate::core::action::Action;
use crate::core::clock::now_seconds;
use crate::core::error::{Categorized, Category, kube_category};
use crate::core::slim::{SlimStore, Slimmable};
use crate::core::wakeups::Wakeups;
use crate::primitives::locked;
use crate::schedule::Schedule;

/// Why a pass could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("the job cache: {0}")]
    JobCache(#[from] Stopped),
    /// A run's job could not be created (told by a `JobCreateFailed` event).
    #[error("creating {name}: {source}")]
    CreateJob {
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl Categorized for Error {
    fn category(&self) -> Category {
        match self {
            Error::Api(e) | Error::CreateJob { source: e, .. } => kube_category(e),
            Error::JobCache(_) => Category::Transient,
        }
    }

    fn announced(&self) -> bool {
        matches!(self, Error::CreateJob { .. })
    }
}

/// The nominal run time of a job made by a cron job (RFC 3339).
pub const SCHEDULED_AT: &str = "csiaddons.openshift.io/scheduled-at";

/// A cron job kind and the job kind it makes.
pub trait CronKind: crate::core::watch::NamespacedKind + Slimmable {
    type Job: JobKind;
    const CONTROLLER: &'static str;
    fn schedule(&self) -> &str;
    fn starting_deadline(&self) -> Option<i64>;
    fn concurrency(&self) -> ConcurrencyPolicy;
    fn suspended(&self) -> bool;
    /// (successful, failed) history limits.
    fn history_limits(&self) -> (i32, i32);
    fn last_schedule(&self) -> Option<i64>;
    /// The status as written: (lastScheduleTime, lastSuccessfulTime, active job's name).
    fn reported(&self) -> CronStatus;
    /// A child job named `name` from the template (metadata other than annotations and labels is
    /// set by the caller).
    fn job(&self, name: &str) -> Self::Job;
    fn outcome(job: &Self::Job) -> (Outcome, Option<i64>, Option<i64>);
}

fn template_metadata(metadata: Option<&JobTemplateMetadata>) -> JobTemplateMetadata {
    metadata.cloned().unwrap_or_default()
}

fn seconds(time: Option<&Time>) -> Option<i64> {
    time.map(|t| t.0.as_second())
}

fn outcome_of(result: Option<OperationResult>) -> Outcome {
    match result {
        None => Outcome::Active,
        Some(OperationResult::Succeeded) => Outcome::Succeeded,
        Some(OperationResult::Failed) => Outcome::Failed,
    }
}

macro_rules! cron_kind {
    ($cron:ty, $spec:ty, $job:ty, $controller:literal) => {
        impl Slimmable for $cron {
            type Rest = ($spec, Option<CronJobStatus>);
            fn split(self) -> (ObjectMeta, Self::Rest) {
                (self.metadata, (self.spec, self.status))
            }
            fn join(metadata: ObjectMeta, (spec, status): &Self::Rest) -> Self {
                Self { metadata, spec: spec.clone(), status: status.clone() }
            }
        }

        impl CronKind for $cron {
            type Job = $job;
            const CONTROLLER: &'static str = $controller;
            fn schedule(&self) -> &str {
                &self.spec.schedule
            }
            fn starting_deadline(&self) -> Option<i64> {
                self.spec.starting_deadline_seconds
            }
            fn concurrency(&self) -> ConcurrencyPolicy {
                self.spec.concurrency_policy
            }
            fn suspended(&self) -> bool {
                self.spec.suspend.unwrap_or(false)
            }
            fn history_limits(&self) -> (i32, i32) {
                (self.spec.successful_jobs_history_limit, self.spec.failed_jobs_history_limit)
            }
            fn last_schedule(&self) -> Option<i64> {
                seconds(self.status.as_ref().and_then(|s| s.last_schedule_time.as_ref()))
            }
            fn reported(&self) -> CronStatus {
                let status = self.status.as_ref();
                CronStatus {
                    last_schedule: self.last_schedule(),
                    last_successful: seconds(status.and_then(|s| s.last_successful_time.as_ref())),
                    active: status.and_then(|s| s.active.as_ref()).and_then(|a| a.name.clone()),
                }
            }
            fn job(&self, name: &str) -> $job {
                let template = &self.spec.job_template;
                let metadata = template_metadata(template.metadata.as_ref());
                let mut job = <$job>::new(name, template.spec.clone());
                job.metadata.labels = Some(metadata.labels);
                job.metadata.annotations = Some(metadata.annotations);
                job
            }
            fn outcome(job: &$job) -> (Outcome, Option<i64>, Option<i64>) {
                let status = job.status.as_ref();
                (
                    outcome_of(status.and_then(|s| s.result)),
                    seconds(status.and_then(|s| s.start_time.as_ref())),
                    seconds(status.and_then(|s| s.completion_time.as_ref())),
                )
            }
        }
    };
}

cron_kind!(ReclaimSpaceCronJob, ReclaimSpaceCronJobSpec, ReclaimSpaceJob, "reclaimspacecronjob");
cron_kind!(
    EncryptionKeyRotationCronJob,
    EncryptionKeyRotationCronJobSpec,
    EncryptionKeyRotationJob,
    "encryptionkeyrotationcronjob"
);

/// Which cached cron jobs the annotation controller manages (`csiaddons.openshift.io/state:
/// managed`), by UID. That annotation is all that is read of a cached cron job's annotations, and
/// a map of one costs some 600 bytes (a B-tree leaf has room for eleven): the cache keeps none,
/// and this set 16 bytes a managed cron job.
#[derive(Clone, Default)]
pub struct ManagedCrons(Arc<Mutex<HashSet<u128>>>);

impl ManagedCrons {
    /// A UUID as its 128 bits; any other text (never from an API server) hashed.
    fn key(uid: &str) -> u128 {
        let digits = uid.bytes().filter(|b| *b != b'-');
        let value = digits.clone().try_fold(0u128, |value, b| {
            let digit = char::from(b).to_digit(16)?;
            value.checked_mul(16)?.checked_add(u128::from(digit))
        });
        value.filter(|_| digits.count() == 32).unwrap_or_else(|| {
            let mut hasher = DefaultHasher::new();
            uid.hash(&mut hasher);
            u128::from(hasher.finish())
        })
    }

    pub fn contains(&self, uid: &str) -> bool {
        locked(&self.0).contains(&Self::key(uid))
    }

    fn record(&self, uid: &str, managed: bool) {
        let mut set = locked(&self.0);
        if managed {
            set.insert(Self::key(uid))
        } else {
            set.remove(&Self::key(uid))
        };
    }
}

/// The watch of a cron kind, shared: the cron controller is driven by it, and the PVC controller
/// reads the same cache (no second watch of every cron job) and hears, through `owners`, of
/// every change or deletion of a cron job a PVC owns. Cached slim (`core::slim`) and without
/// annotations (`managed` says which are managed); a deleted cron job's wake-up goes.
pub fn watch<C: CronKind>(
    ctx: &Core,
    owners: mpsc::UnboundedSender<ObjectRef<crate::claim::Claim>>,
    managed: ManagedCrons,
    wakeups: Wakeups,
) -> (SlimStore<C>, Ready, impl futures::Stream<Item = Result<C, watcher::Error>> + Send + 'static) {
    let recorded = managed.clone();
    let (store, ready, events) = crate::core::watch::slim_watch(ctx.watched::<C>(), move |cron: &mut C| {
        let meta = cron.meta_mut();
        let state = meta.annotations.take().and_then(|mut annotations| annotations.remove(STATE));
        recorded.record(meta.uid.as_deref().unwrap_or_default(), state.as_deref() == Some(MANAGED));
    });
    let events = events.inspect(move |event| {
        if let Ok(watcher::Event::Delete(cron)) = event {
            wakeups.forget(&cron.namespace().unwrap_or_default(), &cron.name_any());
            managed.record(&cron.uid().unwrap_or_default(), false);
        }
        let (Ok(watcher::Event::Apply(cron)) | Ok(watcher::Event::Delete(cron))) = event else { return };
        let namespace = cron.namespace().unwrap_or_default();
        for owner in cron.owner_references().iter().filter(|o| o.controller == Some(true)) {
            if owner.kind == "PersistentVolumeClaim" && owner.api_version == "v1" {
                // The PVC controller stops only with the manager's reconcilers, as this watch does.
                let _ = owners.send(ObjectRef::new(&owner.name).within(&namespace));
            }
        }
    });
    let changes = crate::core::watch::changed_objects(events, store.clone());
    (store, ready, changes)
}

pub async fn run<C: CronKind>(
    ctx: Arc<Core>,
    store: SlimStore<C>,
    ready: Ready,
    changes: impl futures::Stream<Item = Result<C, watcher::Error>> + Send + 'static,
    wakeups: Wakeups,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Only the jobs a cron job of this kind controls: the others are never a child.
    let (children, children_ready, child_events) = crate::core::watch::cached_watch_where(
        ctx.watched::<C::Job>(),
        |job: &mut C::Job| {
            // What `child_of` and the owner lookup read: annotations, owners, the outcome.
            job.meta_mut().labels = None;
            job.keep_only_outcome();
        },
        controlled_by_a::<C, C::Job>,
    );
    let child_events = child_events.touched_objects();
    ctx.caches.follow(C::CONTROLLER, ready);
    // Next runs come from `wakeups`, not from kube's scheduler (see `core::wakeups`).
    let controller =
        crate::core::queue::Triggers::new(changes).owns(child_events).on(wakeups.due::<C>()).slim_controller(store);
    crate::core::run::run_controller(controller, ctx, C::CONTROLLER, stop, move |cron, ctx| {
        reconcile::<C>(cron, ctx, (children.clone(), children_ready.clone()), wakeups.clone())
    })
    .await;
}

/// Whether a cron job of kind `C` controls `job`.
fn controlled_by_a<C: CronKind, J: kube::Resource>(job: &J) -> bool {
    let (kind, api_version) = (C::kind(&()), C::api_version(&()));
    job.meta().owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.kind.as_str() == kind.as_ref() && o.api_version.as_str() == api_version.as_ref()
    })
}

fn child_of<C: CronKind>(job: &C::Job) -> Child {
    let (outcome, start_time, completion_time) = C::outcome(job);
    let scheduled_at = job
        .annotations()
        .get(SCHEDULED_AT)
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| t.as_second());
    Child { name: job.name_any(), scheduled_at, outcome, start_time, completion_time }
}

/// Requests are rare here (a run is due, a status changed) and their futures are kilobytes each:
/// they are boxed, so that the pass every cron job gets at start and after each change is small.
pub(crate) async fn reconcile<C: CronKind>(
    cron: Arc<C>,
    ctx: Arc<Core>,
    (store, store_ready): (Store<C::Job>, Ready),
    wakeups: Wakeups,
) -> Result<Action, Error> {
    let namespace = cron.namespace().unwrap_or_default();
    if cron.meta().deletion_timestamp.is_some() {
        wakeups.forget(&namespace, &cron.name_any());
        return Ok(Action::await_change());
    }
    // An empty children cache would read as "no running job" and start one under Forbid.
    store_ready.wait().await?;
    let uid = cron.uid().unwrap_or_default();
    let schedule = match Schedule::parse(cron.schedule()) {
        Ok(schedule) => schedule,
        Err(e) => {
            // Admission lets any non-empty text through, as upstream's CRD does.
            ctx.event(cron.as_ref(), true, "InvalidSchedule", format!("{e}; no job will be started")).await;
            wakeups.forget(&namespace, &cron.name_any());
            return Ok(Action::await_change());
        }
    };
    let children: Vec<Child> = store
        .state()
        .iter()
        .filter(|j| j.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|j| j.owner_references().iter().any(|o| o.controller == Some(true) && o.uid == uid))
        .map(|j| child_of::<C>(j))
        .collect();
    let now = now_seconds();
    let window = ctx.settings().cronjob_stagger_window.as_secs();
    let window = schedule.interval_after(now).map_or(0, |i| i.min(i64::try_from(window).unwrap_or(i64::MAX)));
    let (successful, failed) = cron.history_limits();
    let input = CronInput {
        name: &cron.name_any(),
        schedule: &schedule,
        created: seconds(cron.meta().creation_timestamp.as_ref()).unwrap_or(now),
        last_schedule: cron.last_schedule(),
        starting_deadline: cron.starting_deadline(),
        concurrency: cron.concurrency(),
        suspend: cron.suspended(),
        successful_limit: usize::try_from(successful).unwrap_or(0),
        failed_limit: usize::try_from(failed).unwrap_or(0),
        stagger: stagger_offset(&uid, window),
        now,
        children: &children,
    };
    let mut decision = decide(&input);
    // The children that succeeded may all be pruned (a history limit of 0): keep what was reported.
    decision.status.last_successful = decision.status.last_successful.max(cron.reported().last_successful);

    let jobs = Api::<C::Job>::namespaced(ctx.client.clone(), &namespace);
    let background = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
    for name in &decision.prune {
        if let Err(e) = Box::pin(jobs.delete(name, &background)).await {
            tracing::warn!(job = %format!("{namespace}/{name}"), error = %e, "pruning an old job failed");
        }
    }
    if let Some(warning) = &decision.warning {
        ctx.event(cron.as_ref(), true, "MissedSchedules", warning.clone()).await;
    }
    match &decision.action {
        CronAction::Wait => {}
        CronAction::Skip { reason } => ctx.event(cron.as_ref(), false, "RunSkipped", reason.clone()).await,
        CronAction::Create { name, scheduled_at } => {
            Box::pin(create_child(&ctx, cron.as_ref(), &jobs, name, *scheduled_at)).await?
        }
        CronAction::Replace { delete, name, scheduled_at } => {
            match Box::pin(jobs.delete(delete, &background)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            ctx.event(cron.as_ref(), false, "JobReplaced", format!("deleted the running job {delete}")).await;
            Box::pin(create_child(&ctx, cron.as_ref(), &jobs, name, *scheduled_at)).await?;
        }
    }
    let time = |t: Option<i64>| t.and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t).ok()).map(Time);
    let mut status = json!({
        "lastScheduleTime": time(decision.status.last_schedule),
        "lastSuccessfulTime": time(decision.status.last_successful),
    });
    if let Some(active) = &decision.status.active {
        status["active"] = json!({
            "apiVersion": C::Job::api_version(&()),
            "kind": C::Job::kind(&()),
            "name": active,
            "namespace": namespace,
        });
    }
    // Unchanged status is not written again (ten thousand idle cron jobs, ten thousand writes).
    if cron.reported() != decision.status {
        Box::pin(ctx.apply_status(cron.as_ref(), status)).await?;
    }
    match decision.requeue_after {
        Some(after) => wakeups.after(&namespace, &cron.name_any(), Duration::from_secs(after.max(1).unsigned_abs())),
        None => wakeups.forget(&namespace, &cron.name_any()),
    }
    Ok(Action::await_change())
}

async fn create_child<C: CronKind>(
    ctx: &Core,
    cron: &C,
    jobs: &Api<C::Job>,
    name: &str,
    scheduled_at: i64,
) -> Result<(), Error> {
    let mut job = cron.job(name);
    let at = k8s_openapi::jiff::Timestamp::from_second(scheduled_at).unwrap_or_default();
    job.meta_mut().namespace = cron.namespace();
    job.annotations_mut().insert(SCHEDULED_AT.to_owned(), at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    job.meta_mut().owner_references = Some(vec![OwnerReference {
        api_version: C::api_version(&()).into_owned(),
        kind: C::kind(&()).into_owned(),
        name: cron.name_any(),
        uid: cron.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {
            ctx.event(cron, false, "JobCreated", format!("created {} {name} for the run at {at}", C::Job::kind(&())))
                .await;
            Ok(())
        }
        // Deterministic names: this run was already started.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => {
            let failed = Error::CreateJob { name: name.to_owned(), source: e };
            ctx.event(cron, true, "JobCreateFailed", failed.to_string()).await;
            Err(failed)
        }
    }
}

#[cfg(test)]
mod tests {
    use api::csiaddons::{EncryptionKeyRotationCronJob, ReclaimSpaceCronJob, ReclaimSpaceJob};
    use kube::api::ObjectMeta;

    use super::*;

    fn job_owned_by(kind: &str, controller: Option<bool>) -> ReclaimSpaceJob {
        let owner = OwnerReference {
            api_version: "csiaddons.openshift.io/v1alpha1".into(),
            kind: kind.into(),
            name: "cron".into(),
            uid: "u".into(),
            controller,
            ..Default::default()
        };
        let mut job = ReclaimSpaceJob::new("j", Default::default());
        job.metadata = ObjectMeta { owner_references: Some(vec![owner]), ..Default::default() };
        job
    }

    #[test]
    fn a_child_is_a_job_a_cron_job_of_the_kind_controls() {
        assert!(controlled_by_a::<ReclaimSpaceCronJob, _>(&job_owned_by("ReclaimSpaceCronJob", Some(true))));
        assert!(!controlled_by_a::<ReclaimSpaceCronJob, _>(&job_owned_by("ReclaimSpaceCronJob", None)));
        assert!(!controlled_by_a::<EncryptionKeyRotationCronJob, _>(&job_owned_by("ReclaimSpaceCronJob", Some(true))));
        assert!(!controlled_by_a::<ReclaimSpaceCronJob, _>(&ReclaimSpaceJob::new("j", Default::default())));
    }
}
