//! Annotation scheduling: ReclaimSpaceCronJobs and EncryptionKeyRotationCronJobs for PVCs from
//! the PVC's, its Namespace's or its StorageClass's annotations, in either precedence mode.
//! fetch (PVC, Namespace, StorageClass and the PV's driver from trimmed caches; the children) → decide
//! (`decide::desired`, `decide::plan_children`, pure) → act (create, update, delete) → events.
//! Unlike upstream: Namespace changes apply at once (no restart), a PVC that binds after being
//! annotated is picked up when it binds (upstream's misses it), the Namespace `…/drivers`
//! annotation is compared with the driver's name (upstream's with the annotation key), and a live
//! `schedule-precedence` change re-evaluates every PVC. [differs: namespace-live]
pub mod decide;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::{EncryptionKeyRotationCronJob, ReclaimSpaceCronJob};
use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use self::decide::{
    Child, ChildPlan, Desired, Feature, MANAGED, STATE, Sources, child_name, desired, names_a_schedule, plan_children,
};
use crate::cache_ready::{Ready, Stopped};
use crate::claim::Claim;
use crate::compact::CsiPv;
use crate::controllers::jobs::decide::{RECLAIM_OFFLINE, RECLAIM_ONLINE};
use crate::controllers::jobs::kinds::KEY_ROTATION;
use crate::controllers::jobs::side::RECLAIM_SIDE_ANNOTATION;
use crate::controllers::volume_health::decide::keep_checked;
use crate::core::Core;
use crate::core::action::Action;
use crate::core::error::{Categorized, Category, kube_category};
use crate::core::slim::{SlimMeta, SlimStore};
use crate::core::slim_text::SlimText;
use crate::flags::SchedulePrecedence;
use crate::pv_drivers::{self, PvDrivers};

const NAME: &str = "persistentvolumeclaim";
const FEATURES: [Feature; 2] = [Feature::ReclaimSpace, Feature::KeyRotation];
/// A Namespace schedule for a driver whose sidecars have not registered yet is looked at again.
const DRIVER_WAIT: Duration = Duration::from_secs(30);

/// The annotation keys this controller reads.
fn relevant_keys() -> Vec<String> {
    FEATURES.iter().flat_map(|f| [f.schedule_key(), f.enable_key(), f.drivers_key(), f.cronjob_key()]).collect()
}

fn keep_relevant(annotations: &mut BTreeMap<String, String>, keys: &[String]) {
    annotations.retain(|k, _| keys.contains(k));
}

/// What the controller needs of a PVC's metadata, the rest dropped before caching (memory at
/// scale; the spec and status are decoded as little as `Claim` holds). With `volume_health`, the
/// volume-health annotations too, each reduced to what the cleanup reads.
fn trim_pvc(pvc: &mut Claim, keys: &[String], volume_health: bool) {
    let meta = &mut pvc.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.finalizers = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|key, value| keys.contains(key) || (volume_health && keep_checked(key, value)));
    }
    // Most PVCs carry only annotations read by others (the binder's, the provisioner's).
    if meta.annotations.as_ref().is_some_and(BTreeMap::is_empty) {
        meta.annotations = None;
    }
}

fn resource(feature: Feature) -> ApiResource {
    match feature {
        Feature::ReclaimSpace => ApiResource::erase::<ReclaimSpaceCronJob>(&()),
        Feature::KeyRotation => ApiResource::erase::<EncryptionKeyRotationCronJob>(&()),
    }
}

/// Why a pass could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("a watch cache: {0}")]
    Cache(#[from] Stopped),
    #[error("building cron job {name}: {source}")]
    Build {
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

impl Categorized for Error {
    fn category(&self) -> Category {
        match self {
            Error::Api(e) => kube_category(e),
            Error::Cache(_) => Category::Transient,
            Error::Build { .. } => Category::Permanent,
        }
    }
}

impl Caches {
    async fn ready(&self) -> Result<(), Stopped> {
        for ready in self.ready.iter().chain(&self.crons.ready) {
            ready.wait().await?;
        }
        Ok(())
    }
}

/// The cron controllers' caches (the PVC controller keeps no copy of its own), which hold no
/// annotations: `managed` says which cron jobs are marked managed.
#[derive(Clone)]
pub struct CronCaches {
    pub reclaim: SlimStore<ReclaimSpaceCronJob>,
    pub rotation: SlimStore<EncryptionKeyRotationCronJob>,
    /// When each of the two has its first full list.
    pub ready: [Ready; 2],
    pub managed: crate::controllers::cron_jobs::ManagedCrons,
}

/// The caches a pass reads.
#[derive(Clone)]
pub(crate) struct Caches {
    namespaces: Store<PartialObjectMeta<Namespace>>,
    classes: Store<StorageClass>,
    /// When the Namespace, StorageClass and PV caches have their first full lists.
    ready: [Ready; 3],
    crons: CronCaches,
    /// PV name → CSI driver.
    drivers: PvDrivers,
    /// The CSIAddonsNodes: whether a driver's sidecars are all accounted for.
    roster: crate::controllers::node::Roster,
}

/// The PVC watch this controller runs on, made before it starts: the job controllers read its
/// cache too (a job's PVC and volume without a request).
pub struct ClaimWatch {
    pub store: SlimStore<Claim>,
    pub ready: Ready,
    events: futures::stream::BoxStream<'static, Result<watcher::Event<Claim>, watcher::Error>>,
}

/// Every PVC, trimmed to what a pass reads (`Claim`, the annotations this controller and the
/// reclaim-space jobs read), and with `volume_health` what the volume-health cleanup reads.
pub fn watch_claims(ctx: &Core, volume_health: bool) -> ClaimWatch {
    let mut keys = relevant_keys();
    keys.push(RECLAIM_SIDE_ANNOTATION.to_owned());
    let (store, ready, events) =
        crate::core::watch::slim_watch(ctx.watched::<Claim>(), move |pvc| trim_pvc(pvc, &keys, volume_health));
    ClaimWatch { store, ready, events: events.boxed() }
}

/// The StorageClass watch, made before the controller starts: the reclaim-space jobs read its
/// cache too (a StorageClass's reclaim side).
pub struct ClassWatch {
    pub store: Store<StorageClass>,
    pub ready: Ready,
    events: futures::stream::BoxStream<'static, Result<watcher::Event<StorageClass>, watcher::Error>>,
}

pub fn watch_classes(ctx: &Core) -> ClassWatch {
    let (store, ready, events) = crate::core::watch::cached_watch(Api::<StorageClass>::all(ctx.client.clone()), |_| {});
    ClassWatch { store, ready, events: events.boxed() }
}

/// `claims`: the PVC watch, the StorageClass watch and the PV drivers index this controller keeps
/// (from `watch_claims`, `watch_classes` and `PvDrivers::default`); `owner_events`: PVCs whose
/// cron jobs changed or went (from the cron controllers' watches); `connected`: drivers one of whose sidecars was just pooled (the node
/// controller's news).
pub async fn run(
    ctx: Arc<Core>,
    (claims, class_watch, drivers): (ClaimWatch, ClassWatch, PvDrivers),
    crons: CronCaches,
    owner_events: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Claim>>,
    (roster, connected): (crate::controllers::node::Roster, tokio::sync::mpsc::UnboundedReceiver<String>),
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let ClaimWatch { store: pvcs, ready: pvcs_ready, events: pvc_events } = claims;
    // No predicate filter: it would keep a key of three strings and a hash for every PVC (some
    // 230 bytes); a pass for a change that matters nothing here reads only caches.
    let pvc_stream = crate::core::watch::changed_objects(pvc_events, pvcs.clone());

    let ns_keys = relevant_keys();
    let namespace_api = Api::<PartialObjectMeta<Namespace>>::all(client.clone());
    let (namespaces, ns_ready, ns_events) = crate::core::watch::cached_watch(namespace_api, move |ns| {
        ns.metadata.labels = None;
        if let Some(annotations) = ns.metadata.annotations.as_mut() {
            keep_relevant(annotations, &ns_keys);
        }
    });
    let ns_stream = ns_events
        .applied_objects()
        .predicate_filter(kube::runtime::predicates::annotations, PredicateConfig::default());

    let ClassWatch { store: classes, ready: sc_ready, events: sc_events } = class_watch;
    let sc_stream = sc_events
        .applied_objects()
        .predicate_filter(kube::runtime::predicates::annotations, PredicateConfig::default());

    let owner_events =
        futures::stream::unfold(owner_events, |mut events| async move { events.recv().await.map(|pvc| (pvc, events)) });
    // Every PV's driver, from a watch: no GET per bound PVC.
    let (pvs_ready, pv_events) = crate::cache_ready::track(
        crate::core::watch::list_and_watch(Api::<CsiPv>::all(client.clone())).default_backoff(),
    );
    let pv_binds = pv_drivers::follow(pv_events, drivers.clone());
    // /readyz names a PV watch that cannot list (an RBAC without `watch` on PVs): no annotation
    // is acted on until it can.
    ctx.caches.follow("persistentvolumes", pvs_ready.clone());
    // A driver whose sidecar connects: its PVCs that waited for the driver's sidecars (their PV's
    // driver is known from that pass) are looked at again.
    let (of_driver, known_drivers) = (pvcs.clone(), drivers.clone());
    let driver_connected =
        futures::stream::unfold(connected, |mut news| async move { news.recv().await.map(|driver| (driver, news)) })
            .flat_map(move |driver| {
                let refs: Vec<ObjectRef<Claim>> = of_driver
                    .state()
                    .iter()
                    .filter(|p| {
                        p.rest
                            .bound_volume()
                            .and_then(|pv| known_drivers.get(pv))
                            .flatten()
                            .is_some_and(|d| *d == *driver)
                    })
                    .map(|p| p.meta.object_ref())
                    .collect();
                futures::stream::iter(refs)
            });
    let caches = Caches { namespaces, classes, ready: [ns_ready, sc_ready, pvs_ready], crons, drivers, roster };
    // A live change of schedule-precedence re-evaluates every PVC.
    let precedence_changes = futures::stream::unfold(ctx.settings.clone(), |mut settings| async move {
        let current = settings.borrow_and_update().schedule_precedence;
        loop {
            settings.changed().await.ok()?;
            if settings.borrow_and_update().schedule_precedence != current {
                return Some(((), settings));
            }
        }
    });
    let (in_namespace, of_class, all_pvcs) = (pvcs.clone(), pvcs.clone(), pvcs.clone());
    ctx.caches.follow(NAME, pvcs_ready);
    let controller = crate::core::queue::Triggers::new(pvc_stream)
        .on(owner_events)
        .on(pv_binds)
        .on(driver_connected)
        .watches(ns_stream, move |ns: PartialObjectMeta<Namespace>| {
            let name = ns.name_any();
            in_namespace
                .state()
                .iter()
                .filter(|p| p.meta.namespace() == Some(name.as_str()))
                .map(|p| p.meta.object_ref())
                .collect::<Vec<_>>()
        })
        .watches(sc_stream, move |sc: StorageClass| {
            let name = sc.name_any();
            of_class
                .state()
                .iter()
                .filter(|p| p.rest.storage_class() == Some(name.as_str()))
                .map(|p| p.meta.object_ref())
                .collect::<Vec<_>>()
        })
        .all_on(precedence_changes, all_pvcs)
        .slim_controller(pvcs);
    crate::core::run::run_controller(controller, ctx, NAME, stop, move |pvc, ctx| reconcile(pvc, ctx, caches.clone()))
        .await;
}

/// Whether a sidecar of `driver` offers the feature (a Namespace schedule counts only then).
fn driver_offers(ctx: &Core, driver: &str, feature: Feature) -> bool {
    let wanted: &[&str] = match feature {
        Feature::ReclaimSpace => &[RECLAIM_ONLINE, RECLAIM_OFFLINE],
        Feature::KeyRotation => &[KEY_ROTATION],
    };
    wanted.iter().any(|capability| ctx.pool.offers(driver, capability))
}

/// The Namespace lists `driver` in the feature's `…/drivers` annotation (comma-separated).
fn namespace_expects(annotations: Option<&BTreeMap<String, String>>, feature: Feature, driver: &str) -> bool {
    annotations
        .and_then(|a| a.get(&feature.drivers_key()))
        .is_some_and(|list| list.split(',').any(|d| d.trim() == driver))
}

/// The Namespace names a schedule for the feature (which counts only if the driver offers it).
fn namespace_schedules(annotations: Option<&BTreeMap<String, String>>, feature: Feature) -> bool {
    annotations.and_then(|a| a.get(&feature.schedule_key())).is_some_and(|s| !s.trim().is_empty())
}

pub(crate) async fn reconcile(pvc: Arc<Claim>, ctx: Arc<Core>, caches: Caches) -> Result<Action, Error> {
    if pvc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // kube holds passes until the PVC cache is ready; the other caches are waited for here, so an
    // empty cache is never read as "no schedule" (which would delete cron jobs).
    caches.ready().await?;
    // Binding is an event like any other here: an unbound PVC waits for it.
    let Some(pv) = pvc.bound_volume() else { return Ok(Action::await_change()) };
    let namespace = pvc.namespace().unwrap_or_default();
    let namespace_meta = caches.namespaces.get(&ObjectRef::new(&namespace));
    let namespace_annotations = namespace_meta.as_ref().map(|n| n.annotations());
    let class = pvc.storage_class().and_then(|name| caches.classes.get(&ObjectRef::new(name)));
    let empty = BTreeMap::new();
    let sources = |driver_offers| Sources {
        pvc: pvc.metadata.annotations.as_ref().unwrap_or(&empty),
        namespace: namespace_annotations,
        storage_class: class.as_ref().map(|c| c.annotations()),
        driver_offers,
    };
    let children = FEATURES.map(|feature| children(&caches, &pvc, feature));
    // Most PVCs: no schedule anywhere and no cron jobs, so nothing to do whatever the driver.
    let scheduled = FEATURES.iter().any(|feature| names_a_schedule(*feature, &sources(true)));
    if !scheduled && children.iter().all(Vec::is_empty) {
        return Ok(Action::await_change());
    }
    // A PV not seen yet brings this PVC back when the watch sees it bound (`pv_drivers::follow`).
    let Some(Some(driver)) = caches.drivers.get(pv) else { return Ok(Action::await_change()) };
    let precedence = ctx.settings().schedule_precedence;
    let mut requeue = None;
    for (feature, children) in FEATURES.into_iter().zip(children) {
        let offers = driver_offers(&ctx, &driver, feature);
        // Whether the driver offers the feature decides only whether a Namespace annotation counts.
        let undecided = !offers && precedence == SchedulePrecedence::Pvc;
        if undecided && namespace_expects(namespace_annotations, feature, &driver) {
            // The driver's sidecars are expected but not registered yet (a start, a failover):
            // decide nothing for this feature until they are, rather than drop a Namespace schedule.
            requeue = Some(DRIVER_WAIT);
            continue;
        }
        let settled = !undecided || caches.roster.settled(&ctx.pool, &driver);
        if !settled && namespace_schedules(namespace_annotations, feature) {
            // Some of the driver's sidecars are not connected yet: whether the Namespace's
            // schedule counts is not known. Decide nothing until they are (their connection
            // brings this PVC back; the wait is a fallback).
            requeue = Some(DRIVER_WAIT);
            continue;
        }
        let want = desired(feature, precedence, &sources(offers));
        let mut plan = plan_children(&pvc.name_any(), feature, &want, &children);
        if plan.hands_off {
            continue;
        }
        if !settled && !plan.delete.is_empty() {
            // A managed cron job is never deleted on a guess.
            plan.delete.clear();
            requeue = Some(DRIVER_WAIT);
        }
        act(&ctx, &pvc, feature, &want, plan).await?;
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// The feature's cron jobs owned by the PVC, with their schedules, from the cron controllers'
/// caches. Ours have a deterministic name; upstream's default mode named its child in the PVC's
/// `…/cronjob` annotation. Looked up by name: no scan of every cron job per pass.
fn children(caches: &Caches, pvc: &Claim, feature: Feature) -> Vec<Child> {
    // In the form the slim caches hold owners' UIDs in, once.
    let uid = SlimText::of(pvc.uid().unwrap_or_default());
    let namespace = pvc.namespace().unwrap_or_default();
    let mut candidates = vec![child_name(&pvc.name_any(), feature)];
    if let Some(named) = pvc.annotations().get(&feature.cronjob_key())
        && !candidates.contains(named)
    {
        candidates.push(named.clone());
    }
    let child = |meta: &SlimMeta, name: String, schedule: &str| {
        let owned = meta.owners.iter().any(|o| o.uid == uid && o.controller == Some(true));
        let managed = caches.crons.managed.contains(&meta.uid.text());
        owned.then(|| Child { name, managed, schedule: schedule.to_owned() })
    };
    candidates
        .into_iter()
        .filter_map(|name| match feature {
            Feature::ReclaimSpace => {
                let cron = caches.crons.reclaim.get(Some(&namespace), &name)?;
                child(&cron.meta, name, &cron.rest.0.schedule)
            }
            Feature::KeyRotation => {
                let cron = caches.crons.rotation.get(Some(&namespace), &name)?;
                child(&cron.meta, name, &cron.rest.0.schedule)
            }
        })
        .collect()
}

/// A managed cron job for `pvc` with upstream's defaults (Forbid, three successful and one failed
/// child kept; each child tried 7 times within 10 minutes).
fn cron_job(pvc: &Claim, feature: Feature, name: &str, schedule: &str) -> serde_json::Value {
    let resource = resource(feature);
    json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {
            "name": name,
            "namespace": pvc.namespace(),
            "annotations": {STATE: MANAGED},
            "ownerReferences": [{
                "apiVersion": Claim::api_version(&()),
                "kind": Claim::kind(&()),
                "name": pvc.name_any(),
                "uid": pvc.uid(),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "failedJobsHistoryLimit": 1,
            "successfulJobsHistoryLimit": 3,
            "jobTemplate": {"spec": {
                "target": {"persistentVolumeClaim": pvc.name_any()},
                "backOffLimit": 6,
                "retryDeadlineSeconds": 600,
            }},
        },
    })
}

/// Deleting and updating are rare and their futures hold a whole decoded object: they are boxed,
/// so that the hundred passes creating cron jobs at once each carry only a create.
async fn act(ctx: &Core, pvc: &Claim, feature: Feature, want: &Desired, plan: ChildPlan) -> Result<(), Error> {
    let namespace = pvc.namespace().unwrap_or_default();
    let resource = resource(feature);
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let changing = plan.create.is_some() || plan.update.is_some();
    if let (Desired::Present { warning: Some(warning), .. }, true) = (want, changing) {
        ctx.event(pvc, true, "InvalidSchedule", warning.clone()).await;
    }
    for name in &plan.delete {
        match Box::pin(api.delete(name, &DeleteParams::background())).await {
            Ok(_) => tracing::debug!(pvc = %pvc.name_any(), cron_job = %name, "managed cron job deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some((name, schedule)) = &plan.update {
        let patch = json!({"spec": {"schedule": schedule}});
        Box::pin(api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await?;
        tracing::debug!(pvc = %pvc.name_any(), cron_job = %name, %schedule, "managed cron job updated");
    }
    if let Some((name, schedule)) = &plan.create {
        let body = serde_json::to_vec(&cron_job(pvc, feature, name, schedule))
            .map_err(|source| Error::Build { name: name.clone(), source })?;
        // The created object is taken as text and never decoded: nothing here reads it, and a
        // hundred passes at once each decoding one is a peak of their own at scale.
        let mut request = kube::core::Request::new(DynamicObject::url_path(&resource, Some(&namespace)))
            .create(&PostParams::default(), body)
            .map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("create");
        match ctx.client.request_text(request).await {
            // No event per PVC: at ten thousand PVCs that is ten thousand Events; the cron job's
            // own existence is what the user sees.
            Ok(_) => tracing::debug!(pvc = %pvc.name_any(), cron_job = %name, %schedule, "managed cron job created"),
            // Created by an earlier pass whose cache had not caught up.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_driver_list_is_compared_with_the_driver_name() {
        let annotations: BTreeMap<String, String> =
            [(Feature::ReclaimSpace.drivers_key(), "rbd.csi.ceph.com, cephfs.csi.ceph.com".to_owned())].into();
        assert!(namespace_expects(Some(&annotations), Feature::ReclaimSpace, "cephfs.csi.ceph.com"));
        assert!(!namespace_expects(Some(&annotations), Feature::ReclaimSpace, "other.csi"));
        assert!(!namespace_expects(Some(&annotations), Feature::KeyRotation, "rbd.csi.ceph.com"));
        assert!(!namespace_expects(None, Feature::ReclaimSpace, "rbd.csi.ceph.com"));
    }

    #[test]
    fn cached_pvcs_keep_only_what_scheduling_reads() {
        let health = r#"{"state":"healthy","lastChecked":"2026-11-23T12:00:00Z","node":"n"}"#;
        let pvc: Claim = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"a": "b"}, "annotations": {
                "reclaimspace.csiaddons.openshift.io/schedule": "@daily", "unrelated": "x",
                "csiaddons.openshift.io/volumehealth.node-1": health}},
            "spec": {"storageClassName": "fast", "volumeName": "pv-1", "accessModes": ["ReadWriteOnce"]},
            "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"]},
        }))
        .unwrap();
        let trimmed = |volume_health| {
            let mut pvc = pvc.clone();
            trim_pvc(&mut pvc, &relevant_keys(), volume_health);
            serde_json::to_value(&pvc).unwrap()
        };
        assert_eq!(
            trimmed(false),
            json!({
                "metadata": {"name": "p", "annotations": {"reclaimspace.csiaddons.openshift.io/schedule": "@daily"}},
                "spec": {"storageClassName": "fast", "volumeName": "pv-1"},
                "status": {"phase": "Bound"},
            })
        );
        assert_eq!(
            trimmed(true)["metadata"]["annotations"],
            json!({"reclaimspace.csiaddons.openshift.io/schedule": "@daily",
                   "csiaddons.openshift.io/volumehealth.node-1": "1795435200"}),
            "with the cleanup on, a volume-health annotation is cached as its lastChecked"
        );
        let mut bound: Claim = serde_json::from_value(json!({
            "metadata": {"name": "q", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        }))
        .unwrap();
        trim_pvc(&mut bound, &relevant_keys(), true);
        assert_eq!(bound.metadata.annotations, None, "an emptied map is not kept");
    }

    #[test]
    fn managed_children_get_upstreams_defaults_and_a_controller_owner() {
        let pvc: Claim =
            serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "apps", "uid": "u-1"}})).unwrap();
        let job = cron_job(&pvc, Feature::KeyRotation, "data-keyrotation", "@weekly");
        assert_eq!(job["kind"], "EncryptionKeyRotationCronJob");
        assert_eq!(job["metadata"]["annotations"][STATE], MANAGED);
        assert_eq!(job["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(job["spec"]["jobTemplate"]["spec"]["target"]["persistentVolumeClaim"], "data");
        assert_eq!(job["spec"]["successfulJobsHistoryLimit"], 3);
    }
}
