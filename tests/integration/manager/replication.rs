//! VolumeReplication end to end: the real manager, the real sidecar and the reference driver,
//! which replicates a real volume it created to its second site.

use api::proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::poll::MINUTE;

use crate::harness::driver::mount_capability;
use crate::harness::manager::{Stage, bound_pvc, set_phase};
use crate::harness::support::unix_channel;
use crate::manager::fence::{FenceStage, cluster_of};

const GROUP: &str = "replication.storage.openshift.io";
const VR_OWNER: &str = "replication.storage.openshift.io/volume-replication-name";

/// A PVC bound to a PV of the driver: a volume the driver really created (`real`), or a handle
/// it does not know.
pub async fn replicated_pvc(stage: &FenceStage, pvc: &str, real: bool) {
    let handle = if real {
        let channel = unix_channel(&stage.driver.endpoint).await.unwrap();
        let request = csi::CreateVolumeRequest {
            name: format!("{}-{pvc}", stage.namespace),
            capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 20, limit_bytes: 0 }),
            volume_capabilities: vec![mount_capability()],
            ..Default::default()
        };
        let answer = csi::controller_client::ControllerClient::new(channel).create_volume(request).await.unwrap();
        answer.into_inner().volume.unwrap().volume_id
    } else {
        "no-such-volume".to_owned()
    };
    let pv = format!("pv-{}-{pvc}", stage.namespace);
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": pvc},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}},
                 "storageClassName": "", "volumeName": pv},
    }))
    .unwrap();
    let claim = pvcs.create(&PostParams::default(), &claim).await.unwrap();
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv},
        "spec": {
            "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": stage.driver_name, "volumeHandle": handle},
            "claimRef": {"namespace": stage.namespace, "name": pvc, "uid": claim.metadata.uid},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(stage.client.clone()).create(&PostParams::default(), &volume).await.unwrap();
    set_phase(&stage.client, &stage.namespace, pvc, &pv, "Bound").await;
}

pub async fn create_class(stage: &FenceStage) -> String {
    let name = format!("{}-vrc", stage.namespace);
    let class = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeReplicationClass",
        "metadata": {"name": name},
        "spec": {"provisioner": stage.driver_name, "parameters": {"schedulingInterval": "1m"}},
    });
    cluster_of(&stage.client, GROUP, "VolumeReplicationClass")
        .create(&PostParams::default(), &serde_json::from_value(class).unwrap())
        .await
        .unwrap();
    name
}

pub fn replications(stage: &FenceStage) -> Api<DynamicObject> {
    dynamic_vr(&stage.client, &stage.namespace)
}

async fn create_vr(stage: &FenceStage, name: &str, class: &str, pvc: &str, state: &str) {
    let vr = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeReplication",
        "metadata": {"name": name},
        "spec": {"volumeReplicationClass": class, "replicationState": state, "autoResync": false,
                 "dataSource": {"kind": "PersistentVolumeClaim", "name": pvc}},
    });
    replications(stage).create(&PostParams::default(), &serde_json::from_value(vr).unwrap()).await.unwrap();
}

pub fn condition(status: &serde_json::Value, type_: &str) -> (String, String) {
    let found = status["conditions"].as_array().and_then(|a| a.iter().find(|c| c["type"] == type_));
    let field = |f: &str| found.and_then(|c| c[f].as_str()).unwrap_or_default().to_owned();
    (field("status"), field("reason"))
}

/// Waits until the VR's status satisfies `check` for its current generation; returns it.
async fn vr_status(
    stage: &FenceStage,
    name: &str,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let api = replications(stage);
    let mut status = json!(null);
    let reached = testenv::poll::until(MINUTE, async || {
        let vr = api.get(name).await.unwrap();
        status = vr.data["status"].clone();
        (status["observedGeneration"] == json!(vr.metadata.generation) && check(&status)).then(|| status.clone())
    })
    .await;
    if let Some(status) = reached {
        return status;
    }
    panic!("VolumeReplication {name} never reached {what}: {status}; manager log:\n{}", stage.manager.log());
}

async fn set_state(stage: &FenceStage, name: &str, state: &str) {
    let patch = json!({"spec": {"replicationState": state}});
    replications(stage).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

#[tokio::test]
async fn a_volume_goes_primary_secondary_resync_primary_and_is_released_on_deletion() {
    let stage = FenceStage::new("vr-cycle").await;
    let class = create_class(&stage).await;
    replicated_pvc(&stage, "data", true).await;
    create_vr(&stage, "vr", &class, "data", "primary").await;

    let status = vr_status(&stage, "vr", "Primary", |s| s["state"] == "Primary").await;
    assert_eq!(condition(&status, "Completed"), ("True".into(), "Promoted".into()), "{status}");
    assert_eq!(condition(&status, "Degraded"), ("False".into(), "Healthy".into()), "{status}");
    assert_eq!(status["message"], "volume is marked primary");
    // The driver copied the volume to its second site on enabling: the info says so.
    assert!(status["lastSyncTime"].is_string(), "{status}");
    assert_eq!(condition(&status, "Replicating"), ("True".into(), "Replicating".into()), "{status}");
    assert_eq!(condition(&status, "DestinationInfoAvailable").0, "True", "{status}");
    assert!(status["destinationVolumeID"].as_str().is_some_and(|id| !id.is_empty()), "{status}");
    let pvc =
        Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace).get("data").await.unwrap();
    assert_eq!(pvc.metadata.annotations.unwrap_or_default().get(VR_OWNER), Some(&"vr".to_owned()));
    assert!(
        pvc.metadata.finalizers.unwrap_or_default().contains(&"replication.storage.openshift.io/pvc-protection".into())
    );

    set_state(&stage, "vr", "secondary").await;
    let status = vr_status(&stage, "vr", "Secondary", |s| s["state"] == "Secondary").await;
    assert_eq!(condition(&status, "Completed"), ("True".into(), "Demoted".into()), "{status}");
    assert_eq!(condition(&status, "Degraded"), ("True".into(), "VolumeDegraded".into()), "{status}");
    assert_eq!(status["message"], "volume is marked secondary and is degraded");
    assert!(status["lastSyncTime"].is_null(), "a secondary has no sync time: {status}");

    set_state(&stage, "vr", "resync").await;
    let status = vr_status(&stage, "vr", "resynced", |s| s["message"] == "volume is marked for resyncing").await;
    assert_eq!(status["state"], "Secondary");
    // The driver copies the site's data back at once and answers ready.
    assert_eq!(condition(&status, "Degraded"), ("False".into(), "Healthy".into()), "{status}");
    assert_eq!(condition(&status, "Resyncing").0, "False", "{status}");

    set_state(&stage, "vr", "primary").await;
    let status = vr_status(&stage, "vr", "Primary again", |s| s["state"] == "Primary").await;
    assert_eq!(condition(&status, "Completed"), ("True".into(), "Promoted".into()), "{status}");

    replications(&stage).delete("vr", &DeleteParams::default()).await.unwrap();
    let api = replications(&stage);
    stage.manager.eventually("the VolumeReplication to go", async |_| api.get_opt("vr").await.unwrap().is_none()).await;
    let pvc =
        Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace).get("data").await.unwrap();
    assert!(!pvc.metadata.annotations.unwrap_or_default().contains_key(VR_OWNER));
    assert!(
        !pvc.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"replication.storage.openshift.io/pvc-protection".into())
    );
}

#[tokio::test]
async fn a_replication_whose_class_is_gone_lets_go_of_its_pvc_on_deletion() {
    let stage = FenceStage::new("vr-orphan").await;
    let class = create_class(&stage).await;
    replicated_pvc(&stage, "data", true).await;
    create_vr(&stage, "vr", &class, "data", "primary").await;
    vr_status(&stage, "vr", "Primary", |s| s["state"] == "Primary").await;
    // Nothing is left to disable through: the replication goes, and so does its claim on the PVC
    // (else the PVC, and its namespace, could never be deleted).
    cluster_of(&stage.client, GROUP, "VolumeReplicationClass").delete(&class, &DeleteParams::default()).await.unwrap();
    replications(&stage).delete("vr", &DeleteParams::default()).await.unwrap();
    let api = replications(&stage);
    stage.manager.eventually("the VolumeReplication to go", async |_| api.get_opt("vr").await.unwrap().is_none()).await;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace);
    let pvc = pvcs.get("data").await.unwrap();
    assert!(!pvc.metadata.annotations.unwrap_or_default().contains_key(VR_OWNER));
    let finalizers = pvc.metadata.finalizers.unwrap_or_default();
    assert!(!finalizers.contains(&"replication.storage.openshift.io/pvc-protection".into()), "{finalizers:?}");
}

#[tokio::test]
async fn a_driver_error_and_a_group_member_each_fail_with_a_clear_message() {
    let stage = FenceStage::new("vr-fail").await;
    let class = create_class(&stage).await;
    // A PV whose volume the driver does not know: EnableVolumeReplication fails.
    replicated_pvc(&stage, "ghost", false).await;
    create_vr(&stage, "ghost-vr", &class, "ghost", "primary").await;
    let status =
        vr_status(&stage, "ghost-vr", "FailedToPromote", |s| condition(s, "Completed").1 == "FailedToPromote").await;
    // The driver's words in the message; the code too in the Degraded condition, as upstream.
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.contains("not found"), "the driver's words: {status}");
    assert_eq!(condition(&status, "Degraded"), ("True".into(), "Error".into()), "{status}");
    let degraded = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Degraded").unwrap();
    assert!(degraded["message"].as_str().unwrap_or_default().contains("rpc error: code = NotFound"), "{status}");

    // A terminating PVC (held here by a finalizer of someone else's) is never replicated.
    replicated_pvc(&stage, "leaving", true).await;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace);
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    pvcs.patch("leaving", &PatchParams::default(), &Patch::Merge(&hold)).await.unwrap();
    pvcs.delete("leaving", &DeleteParams::default()).await.unwrap();
    create_vr(&stage, "leaving-vr", &class, "leaving", "primary").await;
    let status = vr_status(&stage, "leaving-vr", "refused", |s| {
        s["message"].as_str().is_some_and(|m| m.contains("a terminating PVC is not replicated"))
    })
    .await;
    assert_eq!(status["state"], "Unknown", "{status}");
    let release = json!({"metadata": {"finalizers": null}});
    pvcs.patch("leaving", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();

    // A PVC that a VolumeGroupReplication owns is not taken by a VolumeReplication.
    replicated_pvc(&stage, "member", true).await;
    let patch = json!({"metadata": {"annotations": {"replication.storage.openshift.io/volume-group-replication-name": "group-1"}}});
    pvcs.patch("member", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    create_vr(&stage, "member-vr", &class, "member", "primary").await;
    let status =
        vr_status(&stage, "member-vr", "refused", |s| s["message"].as_str().is_some_and(|m| m.contains("group-1")))
            .await;
    assert!(
        status["message"].as_str().unwrap_or_default().contains("member of VolumeGroupReplication group-1"),
        "{status}"
    );
    let pvc = pvcs.get("member").await.unwrap();
    assert!(!pvc.metadata.annotations.unwrap_or_default().contains_key(VR_OWNER), "the PVC was not claimed");
}

#[tokio::test]
async fn a_sidecar_without_destination_info_means_not_supported_and_is_not_asked_again() {
    let stage = Stage::new(
        "vr-nodest",
        &[
            "service.CONTROLLER_SERVICE",
            "volume_replication.VOLUME_REPLICATION",
            "volume_replication.GET_REPLICATION_DESTINATION_INFO",
        ],
    )
    .await;
    let _sidecar = stage.sidecar("node-r").await;
    // As upstream's v0.14.0 sidecar answers.
    stage.driver.fail("get_replication_destination_info", tonic::Status::unimplemented("unknown method"));
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    let class = format!("{}-vrc", stage.namespace);
    let body = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeReplicationClass", "metadata": {"name": class},
        "spec": {"provisioner": stage.driver_name, "parameters": {"schedulingInterval": "1s"}},
    });
    cluster_of(&stage.client, GROUP, "VolumeReplicationClass")
        .create(&PostParams::default(), &serde_json::from_value(body).unwrap())
        .await
        .unwrap();
    let vr = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeReplication", "metadata": {"name": "vr"},
        "spec": {"volumeReplicationClass": class, "replicationState": "primary", "autoResync": false,
                 "dataSource": {"kind": "PersistentVolumeClaim", "name": "data"}},
    });
    let api = dynamic_vr(&stage.client, &stage.namespace);
    api.create(&PostParams::default(), &serde_json::from_value(vr).unwrap()).await.unwrap();
    let mut status = json!(null);
    testenv::poll::until(MINUTE, async || {
        status = api.get("vr").await.unwrap().data["status"].clone();
        (condition(&status, "DestinationInfoAvailable").1 == "NotSupported").then_some(())
    })
    .await;
    assert_eq!(condition(&status, "DestinationInfoAvailable"), ("False".into(), "NotSupported".into()), "{status}");
    assert_eq!(status["state"], "Primary", "{status}");
    assert_eq!(status["lastSyncBytes"], 4096, "replication info still read: {status}");
    // The info is polled every second; the unsupported call is not repeated.
    let polls = stage.driver.count("get_volume_replication_info");
    stage
        .manager
        .eventually("three more info polls", async |_| stage.driver.count("get_volume_replication_info") >= polls + 3)
        .await;
    assert_eq!(stage.driver.count("get_replication_destination_info"), 1);
}

fn dynamic_vr(client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk(GROUP, "v1alpha1", "VolumeReplication");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "volumereplications");
    Api::namespaced_with(client.clone(), namespace, &resource)
}
