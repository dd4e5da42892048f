//! VolumeGroupReplication and its content end to end: the real manager, the real sidecar and
//! the reference driver's volume groups. Membership follows PVC labels.
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::poll::MINUTE;

use crate::harness::manager::warning_in;
use crate::manager::fence::{FenceStage, cluster_of};
use crate::manager::replication::{condition, create_class, replicated_pvc, replications};

const GROUP: &str = "replication.storage.openshift.io";
const VGR_OWNER: &str = "replication.storage.openshift.io/volume-group-replication-name";
const VGR_FINALIZER: &str = "replication.storage.openshift.io/vgr-protection";

fn groups(stage: &FenceStage) -> Api<DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk(GROUP, "v1alpha1", "VolumeGroupReplication");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "volumegroupreplications");
    Api::namespaced_with(stage.client.clone(), &stage.namespace, &resource)
}

fn contents(stage: &FenceStage) -> Api<DynamicObject> {
    cluster_of(&stage.client, GROUP, "VolumeGroupReplicationContent")
}

async fn create_group_class(stage: &FenceStage) -> String {
    let name = format!("{}-vgrc", stage.namespace);
    let class = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeGroupReplicationClass",
        "metadata": {"name": name}, "spec": {"provisioner": stage.driver_name},
    });
    cluster_of(&stage.client, GROUP, "VolumeGroupReplicationClass")
        .create(&PostParams::default(), &serde_json::from_value(class).unwrap())
        .await
        .unwrap();
    name
}

async fn create_group(stage: &FenceStage, name: &str, app: &str, group_class: &str, class: &str) {
    let vgr = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeGroupReplication",
        "metadata": {"name": name},
        "spec": {"volumeGroupReplicationClassName": group_class, "volumeReplicationClassName": class,
                 "replicationState": "primary", "autoResync": false,
                 "source": {"selector": {"matchLabels": {"app": app}}}},
    });
    groups(stage).create(&PostParams::default(), &serde_json::from_value(vgr).unwrap()).await.unwrap();
}

async fn label(stage: &FenceStage, pvc: &str, app: Option<&str>) {
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace);
    let patch = json!({"metadata": {"labels": {"app": app}}});
    pvcs.patch(pvc, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// Waits until the group's status satisfies `check`; returns the whole object.
async fn group_until(
    stage: &FenceStage,
    name: &str,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> DynamicObject {
    let api = groups(stage);
    let mut status = serde_json::Value::Null;
    let reached = testenv::poll::until(MINUTE, async || {
        let vgr = api.get(name).await.unwrap();
        status = vgr.data["status"].clone();
        check(&status).then_some(vgr)
    })
    .await;
    if let Some(vgr) = reached {
        return vgr;
    }
    panic!("VolumeGroupReplication {name} never reached {what}: {status}; manager log:\n{}", stage.manager.log());
}

fn members(status: &serde_json::Value) -> Vec<String> {
    let list = status["persistentVolumeClaimsRefList"].as_array().cloned().unwrap_or_default();
    list.iter().filter_map(|r| r["name"].as_str().map(str::to_owned)).collect()
}

async fn handles(stage: &FenceStage, vgr: &DynamicObject) -> Vec<String> {
    let name = vgr.data["spec"]["volumeGroupReplicationContentName"].as_str().unwrap_or_default().to_owned();
    let content = contents(stage).get(&name).await.unwrap();
    let list = content.data["spec"]["source"]["volumeHandles"].as_array().cloned().unwrap_or_default();
    list.iter().filter_map(|h| h.as_str().map(str::to_owned)).collect()
}

async fn pvc(stage: &FenceStage, name: &str) -> PersistentVolumeClaim {
    Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace).get(name).await.unwrap()
}

/// As upstream's main branch: the content learns where the group and each volume are replicated to, the
/// group says so (`DestinationInfoAvailable`), every condition of the group is at the group's
/// generation (a DR orchestrator compares them with it), and the selector is written as text.
async fn destinations_are_known_and_conditions_are_the_groups(stage: &FenceStage, name: &str) {
    let vgr = group_until(stage, name, "the destination known", |s| {
        condition(s, "DestinationInfoAvailable") == ("True".into(), "DestinationInfoUpdated".into())
    })
    .await;
    let generation = json!(vgr.metadata.generation);
    assert_eq!(vgr.data["status"]["observedGeneration"], generation);
    for c in vgr.data["status"]["conditions"].as_array().unwrap() {
        assert_eq!(c["observedGeneration"], generation, "{c} is not at the group's generation");
    }
    assert_eq!(vgr.metadata.annotations.as_ref().unwrap()["pvcSelector"], "app=db");
    let content_name = vgr.data["spec"]["volumeGroupReplicationContentName"].as_str().unwrap();
    let content = contents(stage).get(content_name).await.unwrap();
    let status = &content.data["status"];
    assert!(status["destinationVolumeGroupID"].as_str().is_some_and(|g| !g.is_empty()), "{status}");
    let mapping = status["persistentVolumeMappingList"].as_array().unwrap();
    assert_eq!(mapping.len(), 2, "{status}");
    for entry in mapping {
        let (source, destination) = (&entry["volumeHandle"], &entry["destinationVolumeHandle"]);
        assert!(destination.as_str().is_some_and(|d| !d.is_empty()) && destination != source, "{entry}");
    }
}

#[tokio::test]
async fn a_group_follows_its_labels_keeps_its_limit_and_cleans_up_on_deletion() {
    let stage = FenceStage::with_flags("vgr-life", &["--max-group-pvcs=2"]).await;
    let (class, group_class) = (create_class(&stage).await, create_group_class(&stage).await);
    for name in ["a", "b", "c"] {
        replicated_pvc(&stage, name, true).await;
    }
    label(&stage, "a", Some("db")).await;
    label(&stage, "b", Some("db")).await;
    create_group(&stage, "g", "db", &group_class, &class).await;

    let vgr =
        group_until(&stage, "g", "two members, replicated", |s| members(s) == ["a", "b"] && s["state"] == "Primary")
            .await;
    assert_eq!(handles(&stage, &vgr).await.len(), 2);
    let vr_name = vgr.data["spec"]["volumeReplicationName"].as_str().unwrap().to_owned();
    let vr = replications(&stage).get(&vr_name).await.unwrap();
    assert_eq!(vr.data["spec"]["dataSource"]["kind"], "VolumeGroupReplication");
    assert_eq!(condition(&vr.data["status"], "Completed"), ("True".into(), "Promoted".into()));
    let a = pvc(&stage, "a").await;
    assert_eq!(a.metadata.annotations.unwrap_or_default().get(VGR_OWNER), Some(&"g".to_owned()));
    assert!(a.metadata.finalizers.unwrap_or_default().contains(&VGR_FINALIZER.to_owned()));
    destinations_are_known_and_conditions_are_the_groups(&stage, "g").await;

    // A third label goes past max-group-pvcs=2: a readable error, members unchanged.
    label(&stage, "c", Some("db")).await;
    let vgr = group_until(&stage, "g", "the limit refused", |s| {
        s["message"].as_str().is_some_and(|m| m.contains("max-group-pvcs"))
    })
    .await;
    assert_eq!(
        vgr.data["status"]["message"],
        "the selector matches 3 PVCs, more than the 2 a group may hold (max-group-pvcs)"
    );
    // Label-only changes move members in and out.
    label(&stage, "b", None).await;
    let vgr = group_until(&stage, "g", "a and c", |s| members(s) == ["a", "c"]).await;
    assert_eq!(handles(&stage, &vgr).await.len(), 2);
    assert!(!pvc(&stage, "b").await.metadata.annotations.unwrap_or_default().contains_key(VGR_OWNER), "b released");
    label(&stage, "c", None).await;
    let vgr = group_until(&stage, "g", "a alone", |s| members(s) == ["a"]).await;
    assert_eq!(handles(&stage, &vgr).await.len(), 1);

    // A member's deletion waits for the group, and says so on the PVC.
    Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace)
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let events = Api::namespaced(stage.client.clone(), &stage.namespace);
    let blocked = warning_in(&events, "a", "PersistentVolumeClaimDeletionBlocked").await;
    assert!(blocked.is_some_and(|m| m.contains("g")), "no Warning event on the member being deleted");

    // Deletion: the VolumeReplication, the content, then every member's marks.
    let content = vgr.data["spec"]["volumeGroupReplicationContentName"].as_str().unwrap().to_owned();
    groups(&stage).delete("g", &DeleteParams::default()).await.unwrap();
    let (api, vrs, cs) = (groups(&stage), replications(&stage), contents(&stage));
    stage
        .manager
        .eventually("the group, its VolumeReplication and its content to go", async |_| {
            api.get_opt("g").await.unwrap().is_none()
                && vrs.get_opt(&vr_name).await.unwrap().is_none()
                && cs.get_opt(&content).await.unwrap().is_none()
        })
        .await;
    // (a is still being deleted: nothing in this control plane removes the PVC protection.)
    for name in ["a", "b", "c"] {
        let claim = pvc(&stage, name).await;
        assert!(!claim.metadata.annotations.unwrap_or_default().contains_key(VGR_OWNER), "{name}");
        assert!(!claim.metadata.finalizers.unwrap_or_default().contains(&VGR_FINALIZER.to_owned()), "{name}");
    }
}

#[tokio::test]
async fn a_failing_group_and_a_replicated_pvc_each_say_why_in_the_groups_status() {
    let stage = FenceStage::new("vgr-fail").await;
    let (class, group_class) = (create_class(&stage).await, create_group_class(&stage).await);
    // A volume the driver does not know: CreateVolumeGroup fails, and the group says so.
    replicated_pvc(&stage, "ghost", false).await;
    label(&stage, "ghost", Some("ghost")).await;
    create_group(&stage, "bad", "ghost", &group_class, &class).await;
    let vgr = group_until(&stage, "bad", "the content's error", |s| {
        s["message"].as_str().is_some_and(|m| m.starts_with("VolumeGroupReplicationContent"))
    })
    .await;
    let message = vgr.data["status"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("NotFound") || message.contains("InvalidArgument"), "the driver's words: {message}");
    let events = Api::namespaced(stage.client.clone(), &stage.namespace);
    assert!(warning_in(&events, "bad", "VolumeGroupFailed").await.is_some(), "a Warning event on the group");

    // A PVC a VolumeReplication replicates is not taken into a group.
    replicated_pvc(&stage, "solo", true).await;
    let patch = json!({"metadata": {"labels": {"app": "solo"},
        "annotations": {"replication.storage.openshift.io/volume-replication-name": "vr-solo"}}});
    Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace)
        .patch("solo", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    create_group(&stage, "taken", "solo", &group_class, &class).await;
    let vgr =
        group_until(&stage, "taken", "refused", |s| s["message"].as_str().is_some_and(|m| m.contains("vr-solo"))).await;
    let message = vgr.data["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("PVC solo is replicated by VolumeReplication vr-solo"), "{message}");
    assert!(!pvc(&stage, "solo").await.metadata.annotations.unwrap_or_default().contains_key(VGR_OWNER));

    // An external group is someone else's: no finalizer, no content, no status, members untouched.
    replicated_pvc(&stage, "outside", true).await;
    label(&stage, "outside", Some("outside")).await;
    let vgr = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeGroupReplication", "metadata": {"name": "ext"},
        "spec": {"volumeGroupReplicationClassName": group_class, "volumeReplicationClassName": class,
                 "replicationState": "primary", "external": true,
                 "source": {"selector": {"matchLabels": {"app": "outside"}}}},
    });
    groups(&stage).create(&PostParams::default(), &serde_json::from_value(vgr).unwrap()).await.unwrap();
    // The failing group above is retried meanwhile: the controller is busy, not stopped.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ext = groups(&stage).get("ext").await.unwrap();
    assert!(ext.metadata.finalizers.unwrap_or_default().is_empty(), "an external group got a finalizer");
    assert!(ext.data["status"].is_null(), "an external group got a status: {}", ext.data["status"]);
    assert!(ext.data["spec"]["volumeGroupReplicationContentName"].is_null());
    assert!(!pvc(&stage, "outside").await.metadata.annotations.unwrap_or_default().contains_key(VGR_OWNER));
}
