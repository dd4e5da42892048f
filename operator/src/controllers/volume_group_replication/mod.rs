//! VolumeGroupReplication: the PVCs its selector picks form a group; a
//! VolumeGroupReplicationContent asks the driver for the group, and a VolumeReplication of the
//! group replicates it. fetch (class, member PVCs, content, VolumeReplication) → validate (count,
//! ownership, handles) → decide (`decide`: members, their limit, the children's names) → act (mark
//! members, create or update content and VolumeReplication) → status (the VolumeReplication's, plus
//! the members). Unlike upstream: label-only PVC changes add and remove members (upstream's PVC
//! watch sees generation changes only) [differs: group-label-changes], the limit's message prints
//! a number, a PVC of a VolumeReplication is refused whichever came first, an error of the content
//! shows in the status and as a Warning event (upstream's group says nothing), and the reconciler
//! honours `max-concurrent-reconciles` (upstream runs one worker).
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use api::replication::{
    VolumeGroupReplication, VolumeGroupReplicationClass, VolumeGroupReplicationContent, VolumeReplication,
};
use futures::Future;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ListParams, PostParams};
use kube::core::{ParseExpressionError, PartialObjectMeta, Selector, SelectorExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use self::decide::{
    TooManyPvcs, check_count, child_names, content_error, group_destination, members, released, selector_text,
};
use crate::controllers::replication::{
    self as rep, DESTINATION_INFO, GROUP_API, GROUP_REF, PROVISIONED_BY, VGR_FINALIZER, VGR_OWNER, VR_OWNER,
};
use crate::controllers::replication_class::{self, ClassError};
use crate::controllers::volume_replication::source::{SourceError, csi_handle};
use crate::core::Core;
use crate::core::action::Action;
use crate::core::backoff::Retrying;
use crate::core::patch::patch_merge;
use crate::core::status::set_condition;
use crate::core::watch::list_and_watch;

pub mod decide;

const NAME: &str = "volumegroupreplication";
/// The annotation upstream writes on a group: its PVC selector as text.
pub const PVC_SELECTOR: &str = "pvcSelector";
/// How often a deletion waiting for its VolumeReplication and content looks again.
const DELETION_RECHECK: Duration = Duration::from_secs(10);

pub async fn run(core: Arc<Core>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let watched = core.watched::<VolumeGroupReplication>();
    let (store, ready, changes) = crate::core::watch::spec_watch(watched, crate::core::watch::generation_or_deletion);
    core.caches.follow(NAME, ready);
    let ctx = Retrying::retrying(core, &store);
    let groups = store.clone();
    // Every PVC change, labels included, and deletions: metadata only, nothing cached.
    let pvcs =
        list_and_watch(ctx.watched::<PartialObjectMeta<PersistentVolumeClaim>>()).default_backoff().touched_objects();
    let contents = list_and_watch(Api::<VolumeGroupReplicationContent>::all(ctx.client.clone()))
        .default_backoff()
        .touched_objects();
    let replications = list_and_watch(ctx.watched::<VolumeReplication>()).default_backoff().touched_objects();
    let controller = crate::core::queue::Triggers::new(changes)
        .watches(pvcs, move |pvc: PartialObjectMeta<PersistentVolumeClaim>| groups_of(&groups, &pvc))
        .watches(contents, |content: VolumeGroupReplicationContent| group_ref(&content))
        .watches(replications, |vr: VolumeReplication| group_ref(&vr))
        .controller(store);
    crate::core::run::run_controller(controller, ctx, NAME, stop, reconcile).await;
}

/// The groups that select the PVC or list it as a member.
fn groups_of(
    groups: &Store<VolumeGroupReplication>,
    pvc: &PartialObjectMeta<PersistentVolumeClaim>,
) -> Vec<ObjectRef<VolumeGroupReplication>> {
    let namespace = pvc.namespace();
    let name = pvc.name_any();
    groups
        .state()
        .iter()
        .filter(|g| g.namespace() == namespace)
        .filter(|g| {
            let selected = Selector::try_from(g.spec.source.selector.clone()).is_ok_and(|s| s.matches(pvc.labels()));
            selected || members(g).contains(&name) || pvc.annotations().get(VGR_OWNER) == Some(&g.name_any())
        })
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

/// The group named by an object's `volumegroupref` annotation.
fn group_ref<K: Resource>(object: &K) -> Option<ObjectRef<VolumeGroupReplication>> {
    let (namespace, name) = object.annotations().get(GROUP_REF)?.split_once('/')?;
    Some(ObjectRef::new(name).within(namespace))
}

/// Why a group cannot be built now: its status message, and whether a growing wait may help.
#[derive(Debug, thiserror::Error)]
enum Problem {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Class(#[from] ClassError),
    #[error("spec.source.selector: {0}")]
    Selector(#[source] ParseExpressionError),
    #[error(
        "PVC {pvc} is replicated by VolumeReplication {owner}; a PVC is replicated by one VolumeReplication or one \
         group, not both"
    )]
    ReplicatedAlone { pvc: String, owner: String },
    #[error("PVC {pvc} is a member of VolumeGroupReplication {group}")]
    OtherGroup { pvc: String, group: String },
    #[error(transparent)]
    TooMany(#[from] TooManyPvcs),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("spec.volumeReplicationClassName is needed to replicate the group")]
    NoReplicationClass,
    #[error("building {what}: {source}")]
    Build {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl Problem {
    fn transient(&self) -> bool {
        match self {
            Problem::Class(class) => !class.permanent(),
            Problem::Selector(_) | Problem::TooMany(_) | Problem::NoReplicationClass | Problem::Build { .. } => false,
            Problem::Source(source) => source.transient(),
            _ => true,
        }
    }
}

pub(crate) async fn reconcile(vgr: Arc<VolumeGroupReplication>, ctx: Arc<Retrying>) -> Result<Action, kube::Error> {
    if vgr.spec.external {
        return Ok(Action::await_change());
    }
    if vgr.metadata.deletion_timestamp.is_some() {
        return delete(&ctx, &vgr).await;
    }
    match build(&ctx, &vgr).await {
        Ok(action) => {
            ctx.forget(vgr.as_ref());
            Ok(action)
        }
        Err(problem) => {
            fail(&ctx, &vgr, &problem.to_string()).await?;
            Ok(if problem.transient() { Action::requeue(ctx.retry(vgr.as_ref())) } else { Action::await_change() })
        }
    }
}

async fn build(ctx: &Core, vgr: &VolumeGroupReplication) -> Result<Action, Problem> {
    let namespace = vgr.namespace().unwrap_or_default();
    let name = vgr.name_any();
    let class_name = &vgr.spec.volume_group_replication_class_name;
    let (class, _) = replication_class::read::<VolumeGroupReplicationClass>(&ctx.client, class_name).await?;
    let driver = class.spec.provisioner.clone();
    let selector = Selector::try_from(vgr.spec.source.selector.clone()).map_err(Problem::Selector)?;
    crate::core::patch::set_finalizer(ctx, vgr, VGR_FINALIZER, true).await?;
    // As upstream: the selector, as Kubernetes prints it, for whoever reads the group.
    let selector_text = selector_text(selector.clone());
    if vgr.annotations().get(PVC_SELECTOR) != Some(&selector_text) {
        let patch = json!({"metadata": {"annotations": {PVC_SELECTOR: selector_text}}});
        patch_merge(ctx, vgr, &patch).await?;
    }

    // Members: the selected PVCs; a terminating one stays while it carries our finalizer.
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace);
    let listed = pvcs.list(&ListParams::default().labels_from(&selector)).await?;
    let mut selected = Vec::new();
    for pvc in listed.items {
        let ours = pvc.finalizers().iter().any(|f| f == VGR_FINALIZER);
        if pvc.metadata.deletion_timestamp.is_some() {
            if !ours {
                continue;
            }
            let note = format!(
                "PVC {} is a member of VolumeGroupReplication {name}: remove its label to let it go",
                pvc.name_any()
            );
            ctx.event(&pvc, true, "PersistentVolumeClaimDeletionBlocked", note).await;
        }
        if let Some(owner) = pvc.annotations().get(VR_OWNER) {
            return Err(Problem::ReplicatedAlone { pvc: pvc.name_any(), owner: owner.clone() });
        }
        if let Some(other) = pvc.annotations().get(VGR_OWNER).filter(|o| **o != name) {
            return Err(Problem::OtherGroup { pvc: pvc.name_any(), group: other.clone() });
        }
        selected.push(pvc);
    }
    check_count(selected.len(), ctx.settings().max_group_pvcs)?;
    let names: BTreeSet<String> = selected.iter().map(ResourceExt::name_any).collect();
    let released = released(&names, &members(vgr));
    for pvc in &selected {
        mark_member(ctx, pvc, &name, true).await?;
    }
    for gone in released {
        if let Some(pvc) = pvcs.get_opt(&gone).await? {
            mark_member(ctx, &pvc, &name, false).await?;
        }
    }
    let mut handles = Vec::new();
    for pvc in &selected {
        handles.push(csi_handle(ctx, pvc, &driver).await?);
    }
    handles.sort();

    // The content: made, or its volume list kept in step.
    let (content_name, vr_name) = child_names(vgr);
    let contents = Api::<VolumeGroupReplicationContent>::all(ctx.client.clone());
    let content = match contents.get_opt(&content_name).await? {
        Some(content) => {
            if content.spec.source.volume_handles != handles {
                let patch = json!({"spec": {"source": {"volumeHandles": handles}}});
                patch_merge(ctx, &content, &patch).await?;
            }
            content
        }
        None => {
            let content = serde_json::from_value(json!({
                "apiVersion": format!("{GROUP_API}/v1alpha1"), "kind": "VolumeGroupReplicationContent",
                "metadata": {"name": content_name, "annotations": {GROUP_REF: format!("{namespace}/{name}"), PROVISIONED_BY: driver}},
                "spec": {
                    "volumeGroupReplicationRef": {
                        "apiVersion": format!("{GROUP_API}/v1alpha1"), "kind": "VolumeGroupReplication",
                        "name": name, "namespace": namespace, "uid": vgr.uid(),
                    },
                    "provisioner": driver,
                    "volumeGroupReplicationClassName": class_name,
                    "source": {"volumeHandles": handles},
                },
            }))
            .map_err(|source| Problem::Build { what: "the VolumeGroupReplicationContent", source })?;
            contents.create(&PostParams::default(), &content).await?
        }
    };
    let names_patch =
        json!({"spec": {"volumeGroupReplicationContentName": content_name, "volumeReplicationName": vr_name}});
    if vgr.spec.volume_group_replication_content_name.as_deref() != Some(&content_name)
        || vgr.spec.volume_replication_name.as_deref() != Some(&vr_name)
    {
        patch_merge(ctx, vgr, &names_patch).await?;
    }
    let refs: Vec<serde_json::Value> = names.iter().map(|n| json!({"name": n})).collect();
    // A failing content says why here (upstream: "Progressing" forever, #1076).
    // [differs: group-content-errors]
    if let Some(error) = content_error(&content) {
        let message = format!("VolumeGroupReplicationContent {content_name}: {error}");
        write_status(ctx, vgr, None, (&refs, None), Some(&message)).await?;
        if vgr.status.as_ref().and_then(|s| s.replication.message.as_deref()) != Some(message.as_str()) {
            ctx.event(vgr, true, "VolumeGroupFailed", message).await;
        }
        return Ok(Action::await_change());
    }
    if content.spec.volume_group_replication_handle.as_deref().is_none_or(str::is_empty) {
        let message = "waiting for the driver to create the volume group";
        write_status(ctx, vgr, None, (&refs, None), Some(message)).await?;
        return Ok(Action::await_change());
    }

    // The VolumeReplication of the group, mirroring the wanted state.
    let Some(vr_class) = vgr.spec.volume_replication_class_name.clone().filter(|c| !c.is_empty()) else {
        return Err(Problem::NoReplicationClass);
    };
    let replications = Api::<VolumeReplication>::namespaced(ctx.client.clone(), &namespace);
    let vr = match replications.get_opt(&vr_name).await? {
        Some(vr) => {
            if vr.spec.replication_state != vgr.spec.replication_state || vr.spec.auto_resync != vgr.spec.auto_resync {
                let patch = json!({"spec": {"replicationState": vgr.spec.replication_state, "autoResync": vgr.spec.auto_resync}});
                patch_merge(ctx, &vr, &patch).await?;
            }
            vr
        }
        None => {
            let owner = vgr.controller_owner_ref(&()).map(|mut o| {
                o.controller = Some(false);
                o
            });
            let vr = serde_json::from_value(json!({
                "apiVersion": format!("{GROUP_API}/v1alpha1"), "kind": "VolumeReplication",
                "metadata": {"name": vr_name, "annotations": {GROUP_REF: format!("{namespace}/{name}")}, "ownerReferences": owner.into_iter().collect::<Vec<_>>()},
                "spec": {
                    "volumeReplicationClass": vr_class,
                    "replicationState": vgr.spec.replication_state,
                    "autoResync": vgr.spec.auto_resync,
                    "dataSource": {"apiGroup": GROUP_API, "kind": "VolumeGroupReplication", "name": name},
                },
            }))
            .map_err(|source| Problem::Build { what: "the VolumeReplication", source })?;
            replications.create(&PostParams::default(), &vr).await?
        }
    };
    let destination = ctx.pool.offers(&driver, DESTINATION_INFO).then(|| group_destination(&content, refs.len()));
    write_status(ctx, vgr, Some(&vr), (&refs, destination), None).await?;
    Ok(Action::await_change())
}

/// The group's status: its VolumeReplication's (or, before there is one, its own so far) with the
/// member list, every condition at the group's generation (a DR orchestrator compares each with
/// the group's, not the VolumeReplication's), and `DestinationInfoAvailable` where the driver
/// reports destinations; `message` overrides.
async fn write_status(
    ctx: &Core,
    vgr: &VolumeGroupReplication,
    vr: Option<&VolumeReplication>,
    (refs, destination): (&[serde_json::Value], Option<rep::Destination>),
    message: Option<&str>,
) -> Result<(), kube::Error> {
    let own = vgr.status.as_ref().map(|s| &s.replication);
    let replication = vr.and_then(|v| v.status.as_ref()).or(own).cloned().unwrap_or_default();
    let generation = vgr.metadata.generation;
    let mut conditions = replication.conditions.clone();
    conditions.retain(|c| c.type_ != rep::DESTINATION_CONDITION);
    for condition in &mut conditions {
        condition.observed_generation = generation;
    }
    if let Some(destination) = destination {
        let previous: Vec<Condition> = own
            .map(|s| s.conditions.iter().filter(|c| c.type_ == rep::DESTINATION_CONDITION).cloned().collect())
            .unwrap_or_default();
        let next = rep::destination_condition("volume group", &destination, generation);
        conditions.extend(set_condition(&previous, next));
    }
    let mut status = json!(replication);
    status["conditions"] = json!(conditions);
    status["persistentVolumeClaimsRefList"] = json!(refs);
    status["observedGeneration"] = json!(generation);
    if let Some(message) = message {
        status["message"] = json!(message);
    }
    ctx.apply_status(vgr, status).await
}

async fn fail(ctx: &Core, vgr: &VolumeGroupReplication, message: &str) -> Result<(), kube::Error> {
    if vgr.status.as_ref().and_then(|s| s.replication.message.as_deref()) == Some(message) {
        return Ok(());
    }
    let mut status = vgr.status.as_ref().map_or_else(|| json!({}), |s| json!(s));
    status["message"] = json!(message);
    status["observedGeneration"] = json!(vgr.metadata.generation);
    // Its state as upstream reports a failure: the current one, or Unknown.
    if status.get("state").is_none() {
        status["state"] = json!(api::replication::ObservedReplicationState::Unknown);
    }
    ctx.apply_status(vgr, status).await?;
    ctx.event(vgr, true, "Error", message.to_owned()).await;
    Ok(())
}

/// Adds (or removes) the member annotation and our finalizer on a PVC.
async fn mark_member(ctx: &Core, pvc: &PersistentVolumeClaim, group: &str, member: bool) -> Result<(), kube::Error> {
    let annotated = pvc.annotations().get(VGR_OWNER).is_some_and(|g| g == group);
    let finalized = pvc.finalizers().iter().any(|f| f == VGR_FINALIZER);
    if annotated == member && finalized == member {
        return Ok(());
    }
    if !member && !annotated {
        return Ok(()); // another group's member now
    }
    let mut finalizers: Vec<String> = pvc.finalizers().iter().filter(|f| *f != VGR_FINALIZER).cloned().collect();
    if member {
        finalizers.push(VGR_FINALIZER.to_owned());
    }
    let annotation = if member { json!(group) } else { serde_json::Value::Null };
    let patch = json!({"metadata": {
        "annotations": {VGR_OWNER: annotation}, "finalizers": finalizers, "resourceVersion": pvc.resource_version(),
    }});
    patch_merge(ctx, pvc, &patch).await
}

/// Deletion: the VolumeReplication, then the content, then the members, then our finalizer.
async fn delete(ctx: &Retrying, vgr: &VolumeGroupReplication) -> Result<Action, kube::Error> {
    if !vgr.finalizers().iter().any(|f| f == VGR_FINALIZER) {
        return Ok(Action::await_change());
    }
    let namespace = vgr.namespace().unwrap_or_default();
    let name = vgr.name_any();
    let (content_name, vr_name) = child_names(vgr);
    let replications = Api::<VolumeReplication>::namespaced(ctx.client.clone(), &namespace);
    let contents = Api::<VolumeGroupReplicationContent>::all(ctx.client.clone());
    let mut waiting = false;
    if replications.get_opt(&vr_name).await?.is_some() {
        replications.delete(&vr_name, &Default::default()).await?;
        waiting = true;
    }
    if contents.get_opt(&content_name).await?.is_some() {
        if !waiting {
            contents.delete(&content_name, &Default::default()).await?;
        }
        waiting = true;
    }
    if waiting {
        return Ok(Action::requeue(DELETION_RECHECK));
    }
    // Every PVC still marked as this group's member (mark_member leaves others alone).
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace);
    for pvc in
        pvcs.list(&ListParams::default()).await?.items.iter().filter(|p| p.annotations().get(VGR_OWNER) == Some(&name))
    {
        mark_member(ctx, pvc, &name, false).await?;
    }
    crate::core::patch::set_finalizer(ctx, vgr, VGR_FINALIZER, false).await?;
    ctx.forget(vgr);
    Ok(Action::await_change())
}
