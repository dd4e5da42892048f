//! VolumeGroupReplication: the PVCs its selector picks form a group; a
//! VolumeGroupReplicationContent asks the driver for the group, and a VolumeReplication of the
//! group replicates it. fetch (class, member PVCs, content, VolumeReplication) → validate (count,
//! ownership, handles) → decide (`membership`) → act (mark members, create or update content and
//! VolumeReplication) → status (the VolumeReplication's, plus the members). Unlike upstream:
//! label-only PVC changes add and remove members (defect 11), the limit's message prints a
//! number (defect 23), a PVC of a VolumeReplication is refused (defect 22), an error of the
//! content shows in the status and as a Warning event (kubernetes-csi-addons#1076), and the
//! reconciler honours `max-concurrent-reconciles` (defect 12).
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
use kube::core::{PartialObjectMeta, Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::patch_merge;
use super::replication_source::{SourceProblem, csi_handle};
use crate::context::{Context, ReconcileError, set_condition};
use crate::replication::{
    self as rep, DESTINATION_INFO, GROUP_API, GROUP_REF, PROVISIONED_BY, VGR_FINALIZER, VGR_OWNER, VR_OWNER,
};

const NAME: &str = "volumegroupreplication";
/// The annotation upstream writes on a group: its PVC selector as text.
pub const PVC_SELECTOR: &str = "pvcSelector";
/// How often a deletion waiting for its VolumeReplication and content looks again.
const DELETION_RECHECK: Duration = Duration::from_secs(10);

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let (store, ready, changes) =
        super::spec_watch(ctx.watched::<VolumeGroupReplication>(), super::generation_or_deletion);
    ctx.caches.follow(NAME, ready);
    let groups = store.clone();
    // Every PVC change, labels included, and deletions: metadata only, nothing cached.
    let pvcs = watcher(ctx.watched::<PartialObjectMeta<PersistentVolumeClaim>>(), super::list_config())
        .default_backoff()
        .touched_objects();
    let contents = watcher(Api::<VolumeGroupReplicationContent>::all(ctx.client.clone()), super::list_config())
        .default_backoff()
        .touched_objects();
    let replications =
        watcher(ctx.watched::<VolumeReplication>(), super::list_config()).default_backoff().touched_objects();
    let controller = Controller::for_stream(changes, store)
        .watches_stream(pvcs, move |pvc: PartialObjectMeta<PersistentVolumeClaim>| groups_of(&groups, &pvc))
        .watches_stream(contents, |content: VolumeGroupReplicationContent| group_ref(&content))
        .watches_stream(replications, |vr: VolumeReplication| group_ref(&vr));
    super::run_controller(controller, ctx, NAME, stop, reconcile).await;
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

fn members(vgr: &VolumeGroupReplication) -> BTreeSet<String> {
    let status = vgr.status.as_ref();
    status.map(|s| s.persistent_volume_claims_ref_list.iter().map(|r| r.name.clone()).collect()).unwrap_or_default()
}

/// The content's and the VolumeReplication's names: the spec's, else upstream's defaults.
pub fn child_names(vgr: &VolumeGroupReplication) -> (String, String) {
    let uid = vgr.uid().unwrap_or_default();
    let content = vgr.spec.volume_group_replication_content_name.clone().filter(|n| !n.is_empty());
    let replication = vgr.spec.volume_replication_name.clone().filter(|n| !n.is_empty());
    (content.unwrap_or_else(|| format!("vgrcontent-{uid}")), replication.unwrap_or_else(|| format!("vr-{uid}")))
}

/// A label selector as Kubernetes prints one (`app=foo,tier in (a,b)`), its requirements sorted
/// by key as Go sorts them; empty for a selector that selects everything.
pub fn selector_text(selector: Selector) -> String {
    use kube::core::Expression;
    let mut parts: Vec<(String, String)> = selector
        .into_iter()
        .map(|e| {
            let key = match &e {
                Expression::In(k, _)
                | Expression::NotIn(k, _)
                | Expression::Equal(k, _)
                | Expression::NotEqual(k, _)
                | Expression::Exists(k)
                | Expression::DoesNotExist(k) => k.clone(),
            };
            (key, e.to_string())
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, text)| text).collect::<Vec<_>>().join(",")
}

/// The previous members to release, given the selected ones.
pub fn released(selected: &BTreeSet<String>, previous: &BTreeSet<String>) -> Vec<String> {
    previous.difference(selected).cloned().collect()
}

/// Upstream's limit, with the number printed as a number (defect 23).
pub fn check_count(count: usize, limit: u32) -> Result<(), String> {
    if count > limit as usize {
        return Err(format!(
            "the selector matches {count} PVCs, more than the {limit} a group may hold (max-group-pvcs)"
        ));
    }
    Ok(())
}

async fn reconcile(vgr: Arc<VolumeGroupReplication>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    if vgr.spec.external {
        return Ok(Action::await_change());
    }
    if vgr.metadata.deletion_timestamp.is_some() {
        return delete(&ctx, &vgr).await;
    }
    match build(&ctx, &vgr).await {
        Ok(action) => Ok(action),
        Err(problem) => {
            fail(&ctx, &vgr, &problem.message).await?;
            Ok(if problem.transient {
                Action::requeue(super::retry_delay(&ctx, vgr.as_ref()))
            } else {
                Action::await_change()
            })
        }
    }
}

async fn build(ctx: &Context, vgr: &VolumeGroupReplication) -> Result<Action, SourceProblem> {
    let namespace = vgr.namespace().unwrap_or_default();
    let name = vgr.name_any();
    let problem = |message: String| SourceProblem { message, transient: true };
    let class_name = &vgr.spec.volume_group_replication_class_name;
    let class = Api::<VolumeGroupReplicationClass>::all(ctx.client.clone())
        .get_opt(class_name)
        .await
        .map_err(|e| problem(format!("reading VolumeGroupReplicationClass {class_name}: {e}")))?
        .ok_or_else(|| problem(format!("VolumeGroupReplicationClass {class_name} not found")))?;
    rep::class_parameters(class.spec.parameters.as_ref()).map_err(|why| SourceProblem {
        message: format!("VolumeGroupReplicationClass {class_name}: {why}"),
        transient: false,
    })?;
    let driver = class.spec.provisioner.clone();
    let selector = Selector::try_from(vgr.spec.source.selector.clone())
        .map_err(|e| SourceProblem { message: format!("spec.source.selector: {e}"), transient: false })?;
    super::set_finalizer(ctx, vgr, VGR_FINALIZER, true).await.map_err(|e| problem(e.to_string()))?;
    // As upstream: the selector, as Kubernetes prints it, for whoever reads the group.
    let selector_text = selector_text(selector.clone());
    if vgr.annotations().get(PVC_SELECTOR) != Some(&selector_text) {
        let patch = json!({"metadata": {"annotations": {PVC_SELECTOR: selector_text}}});
        patch_merge(ctx, vgr, &patch).await.map_err(|e| problem(e.to_string()))?;
    }

    // Members: the selected PVCs; a terminating one stays while it carries our finalizer.
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace);
    let listed = pvcs.list(&ListParams::default().labels_from(&selector)).await.map_err(|e| problem(e.to_string()))?;
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
            return Err(problem(format!(
                "PVC {} is replicated by VolumeReplication {owner}; a PVC is replicated by one VolumeReplication or one group, not both",
                pvc.name_any()
            )));
        }
        if let Some(other) = pvc.annotations().get(VGR_OWNER).filter(|o| **o != name) {
            return Err(problem(format!("PVC {} is a member of VolumeGroupReplication {other}", pvc.name_any())));
        }
        selected.push(pvc);
    }
    check_count(selected.len(), ctx.settings().max_group_pvcs)
        .map_err(|message| SourceProblem { message, transient: false })?;
    let names: BTreeSet<String> = selected.iter().map(ResourceExt::name_any).collect();
    let released = released(&names, &members(vgr));
    for pvc in &selected {
        mark_member(ctx, pvc, &name, true).await.map_err(|e| problem(e.to_string()))?;
    }
    for gone in released {
        if let Some(pvc) = pvcs.get_opt(&gone).await.map_err(|e| problem(e.to_string()))? {
            mark_member(ctx, &pvc, &name, false).await.map_err(|e| problem(e.to_string()))?;
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
    let content = match contents.get_opt(&content_name).await.map_err(|e| problem(e.to_string()))? {
        Some(content) => {
            if content.spec.source.volume_handles != handles {
                let patch = json!({"spec": {"source": {"volumeHandles": handles}}});
                patch_merge(ctx, &content, &patch).await.map_err(|e| problem(e.to_string()))?;
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
            .map_err(|e| problem(e.to_string()))?;
            contents.create(&PostParams::default(), &content).await.map_err(|e| problem(e.to_string()))?
        }
    };
    let names_patch =
        json!({"spec": {"volumeGroupReplicationContentName": content_name, "volumeReplicationName": vr_name}});
    if vgr.spec.volume_group_replication_content_name.as_deref() != Some(&content_name)
        || vgr.spec.volume_replication_name.as_deref() != Some(&vr_name)
    {
        patch_merge(ctx, vgr, &names_patch).await.map_err(|e| problem(e.to_string()))?;
    }
    let refs: Vec<serde_json::Value> = names.iter().map(|n| json!({"name": n})).collect();
    // A failing content says why here (upstream: "Progressing" forever, #1076).
    if let Some(error) = content_error(&content) {
        let message = format!("VolumeGroupReplicationContent {content_name}: {error}");
        write_status(ctx, vgr, None, (&refs, None), Some(&message)).await.map_err(|e| problem(e.to_string()))?;
        if vgr.status.as_ref().and_then(|s| s.replication.message.as_deref()) != Some(message.as_str()) {
            ctx.event(vgr, true, "VolumeGroupFailed", message).await;
        }
        return Ok(Action::await_change());
    }
    if content.spec.volume_group_replication_handle.as_deref().is_none_or(str::is_empty) {
        let message = "waiting for the driver to create the volume group";
        write_status(ctx, vgr, None, (&refs, None), Some(message)).await.map_err(|e| problem(e.to_string()))?;
        return Ok(Action::await_change());
    }

    // The VolumeReplication of the group, mirroring the wanted state.
    let Some(vr_class) = vgr.spec.volume_replication_class_name.clone().filter(|c| !c.is_empty()) else {
        return Err(SourceProblem {
            message: "spec.volumeReplicationClassName is needed to replicate the group".into(),
            transient: false,
        });
    };
    let replications = Api::<VolumeReplication>::namespaced(ctx.client.clone(), &namespace);
    let vr = match replications.get_opt(&vr_name).await.map_err(|e| problem(e.to_string()))? {
        Some(vr) => {
            if vr.spec.replication_state != vgr.spec.replication_state || vr.spec.auto_resync != vgr.spec.auto_resync {
                let patch = json!({"spec": {"replicationState": vgr.spec.replication_state, "autoResync": vgr.spec.auto_resync}});
                patch_merge(ctx, &vr, &patch).await.map_err(|e| problem(e.to_string()))?;
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
            .map_err(|e| problem(e.to_string()))?;
            replications.create(&PostParams::default(), &vr).await.map_err(|e| problem(e.to_string()))?
        }
    };
    let destination = ctx.pool.offers(&driver, DESTINATION_INFO).then(|| group_destination(&content, refs.len()));
    write_status(ctx, vgr, Some(&vr), (&refs, destination), None).await.map_err(|e| problem(e.to_string()))?;
    Ok(Action::await_change())
}

/// The content's `Ready=False` message, if any.
fn content_error(content: &VolumeGroupReplicationContent) -> Option<String> {
    let conditions = content.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions.iter().find(|c| c.type_ == "Ready" && c.status == "False").map(|c| c.message.clone())
}

/// The group's status: its VolumeReplication's (or, before there is one, its own so far) with the
/// member list, every condition at the group's generation (a DR orchestrator compares each with
/// the group's, not the VolumeReplication's), and `DestinationInfoAvailable` where the driver
/// reports destinations; `message` overrides.
async fn write_status(
    ctx: &Context,
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

/// Whether every member's destination is known to the content (upstream [main]'s rule for the
/// group's `DestinationInfoAvailable`).
pub fn group_destination(content: &VolumeGroupReplicationContent, members: usize) -> rep::Destination {
    let mapped = content.status.as_ref().map(|s| s.persistent_volume_mapping_list.as_slice()).unwrap_or_default();
    let known = mapped.iter().filter(|m| m.destination_volume_handle.as_deref().is_some_and(|d| !d.is_empty())).count();
    if known >= members { rep::Destination::Available } else { rep::Destination::Pending }
}

async fn fail(ctx: &Context, vgr: &VolumeGroupReplication, message: &str) -> Result<(), ReconcileError> {
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
async fn mark_member(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    group: &str,
    member: bool,
) -> Result<(), ReconcileError> {
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
async fn delete(ctx: &Context, vgr: &VolumeGroupReplication) -> Result<Action, ReconcileError> {
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
    super::set_finalizer(ctx, vgr, VGR_FINALIZER, false).await?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_printed_as_a_number() {
        assert_eq!(check_count(100, 100), Ok(()));
        assert_eq!(
            check_count(101, 100).unwrap_err(),
            "the selector matches 101 PVCs, more than the 100 a group may hold (max-group-pvcs)"
        );
    }

    #[test]
    fn the_selector_is_printed_as_kubernetes_prints_it() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
        let selector = LabelSelector {
            match_labels: Some([("tier".to_owned(), "db".to_owned()), ("app".to_owned(), "shop".to_owned())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "env".into(),
                operator: "In".into(),
                values: Some(vec!["prod".into(), "dev".into()]),
            }]),
        };
        let text = selector_text(Selector::try_from(selector).unwrap());
        assert_eq!(text, "app=shop,env in (dev,prod),tier=db");
        assert_eq!(selector_text(Selector::try_from(LabelSelector::default()).unwrap()), "");
    }

    #[test]
    fn members_are_the_selected_and_the_rest_are_released() {
        let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
        assert_eq!(released(&set(&["a", "b"]), &set(&["b", "c"])), vec!["c".to_owned()]);
    }

    #[test]
    fn children_are_named_after_the_uid_unless_the_spec_names_them() {
        let mut vgr = VolumeGroupReplication::new("g", Default::default());
        vgr.metadata.uid = Some("u1".into());
        assert_eq!(child_names(&vgr), ("vgrcontent-u1".to_owned(), "vr-u1".to_owned()));
        vgr.spec.volume_replication_name = Some("mine".into());
        assert_eq!(child_names(&vgr).1, "mine");
    }
}
