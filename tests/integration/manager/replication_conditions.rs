//! The conditions a DR orchestrator (RamenDR) judges a VolumeReplication by, transition by
//! transition, against a recording driver that fails on demand: each condition's type, status
//! and reason, each at the object's current generation, as the status is. The table
//! in docs/volumereplication.md ("Replication conditions") lists the same transitions.
use std::time::Duration;

use api::proto::replication;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::poll::MINUTE;
use tonic::Status;

use crate::harness::manager::{Stage, bound_pvc};
use crate::manager::fence::cluster_of;

const GROUP: &str = "replication.storage.openshift.io";
const CAPABILITIES: [&str; 3] = [
    "service.CONTROLLER_SERVICE",
    "volume_replication.VOLUME_REPLICATION",
    "volume_replication.GET_REPLICATION_DESTINATION_INFO",
];

fn replications(stage: &Stage) -> Api<DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk(GROUP, "v1alpha1", "VolumeReplication");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "volumereplications");
    Api::namespaced_with(stage.client.clone(), &stage.namespace, &resource)
}

async fn create_class(stage: &Stage) -> String {
    let name = format!("{}-vrc", stage.namespace);
    let class = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeReplicationClass", "metadata": {"name": name},
        "spec": {"provisioner": stage.driver_name, "parameters": {"schedulingInterval": "1h"}},
    });
    cluster_of(&stage.client, GROUP, "VolumeReplicationClass")
        .create(&PostParams::default(), &serde_json::from_value(class).unwrap())
        .await
        .unwrap();
    name
}

async fn create_vr(stage: &Stage, name: &str, class: &str, pvc: &str) {
    let vr = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeReplication", "metadata": {"name": name},
        "spec": {"volumeReplicationClass": class, "replicationState": "primary", "autoResync": false,
                 "dataSource": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": pvc}},
    });
    replications(stage).create(&PostParams::default(), &serde_json::from_value(vr).unwrap()).await.unwrap();
}

async fn set_spec(stage: &Stage, name: &str, spec: serde_json::Value) {
    replications(stage).patch(name, &PatchParams::default(), &Patch::Merge(&json!({"spec": spec}))).await.unwrap();
}

fn found<'a>(status: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// Whether the status is of the current generation and each of `want` (type, status, reason)
/// holds at it. (A transition leaves the conditions it does not set as they were, as upstream:
/// `Validated` and `DestinationInfoAvailable` through a demotion, for example.)
fn holds(status: &serde_json::Value, generation: i64, want: &[(&str, &str, &str)]) -> bool {
    status["observedGeneration"] == generation
        && want.iter().all(|(type_, state, reason)| {
            found(status, type_).is_some_and(|c| {
                c["status"] == *state && c["reason"] == *reason && c["observedGeneration"] == generation
            })
        })
}

/// Waits until `want` holds at the current generation; returns the status.
async fn until(stage: &Stage, name: &str, want: &[(&str, &str, &str)], message: &str) -> serde_json::Value {
    let api = replications(stage);
    let mut last = json!(null);
    let reached = testenv::poll::until(MINUTE, async || {
        let vr = api.get(name).await.unwrap();
        let generation = vr.metadata.generation.unwrap_or_default();
        last = vr.data["status"].clone();
        (holds(&last, generation, want) && last["message"] == message).then(|| last.clone())
    })
    .await;
    if let Some(status) = reached {
        return status;
    }
    panic!("{name} never reached {want:?} / {message:?}: {last:#}\nmanager log:\n{}", stage.manager.log());
}

const PROMOTED: [(&str, &str, &str); 4] = [
    ("Completed", "True", "Promoted"),
    ("Degraded", "False", "Healthy"),
    ("Resyncing", "False", "NotResyncing"),
    ("Validated", "True", "PrerequisiteMet"),
];

#[tokio::test]
async fn each_transition_sets_upstreams_conditions_at_the_current_generation() {
    let stage = Stage::new("vr-conditions", &CAPABILITIES).await;
    let _sidecar = stage.sidecar("node-c").await;
    let class = create_class(&stage).await;
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;

    // Create as primary; RamenDR's `apiGroup: ""` is a PVC like any other.
    create_vr(&stage, "vr", &class, "data").await;
    let mut primary: Vec<(&str, &str, &str)> = PROMOTED.to_vec();
    primary.push(("DestinationInfoAvailable", "True", "DestinationInfoUpdated"));
    // The recording driver reports no health: Unknown, with upstream's reason.
    primary.push(("Replicating", "Unknown", "Replicating"));
    let status = until(&stage, "vr", &primary, "volume is marked primary").await;
    assert_eq!(status["state"], "Primary");
    assert_eq!(status["destinationVolumeID"], "remote-7");
    assert_eq!(found(&status, "DestinationInfoAvailable").unwrap()["message"], "volume destination info is available");

    // An unchanged re-apply of the spec: no new generation, nothing moves.
    let before = replications(&stage).get("vr").await.unwrap();
    set_spec(&stage, "vr", json!({"replicationState": "primary", "autoResync": false})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = replications(&stage).get("vr").await.unwrap();
    assert_eq!(after.metadata.generation, before.metadata.generation);
    assert_eq!(after.data["status"]["conditions"], before.data["status"]["conditions"]);
    assert_eq!(stage.driver.count("promote_volume"), 1);

    // Demote with autoResync: degraded at first, then resynced with force and healthy.
    set_spec(&stage, "vr", json!({"replicationState": "secondary", "autoResync": true})).await;
    let demoted = [
        ("Completed", "True", "Demoted"),
        ("Degraded", "True", "VolumeDegraded"),
        ("Resyncing", "False", "NotResyncing"),
    ];
    let status = until(&stage, "vr", &demoted, "volume is marked secondary and is degraded").await;
    assert!(found(&status, "Replicating").is_none(), "{status}");
    let healthy =
        [("Completed", "True", "Demoted"), ("Degraded", "False", "Healthy"), ("Resyncing", "False", "NotResyncing")];
    let status = until(&stage, "vr", &healthy, "volume is marked secondary").await;
    assert_eq!(found(&status, "Degraded").unwrap()["message"], "volume is demoted to secondary");
    assert!(stage.driver.last::<replication::ResyncVolumeRequest>("resync_volume").force, "autoResync is force");

    // Resync.
    set_spec(&stage, "vr", json!({"replicationState": "resync"})).await;
    until(&stage, "vr", &healthy, "volume is marked for resyncing").await;

    // Promote, the driver refusing the first try (FAILED_PRECONDITION): forced on the second.
    let promotes = stage.driver.count("promote_volume");
    stage.driver.fail_times("promote_volume", Status::failed_precondition("the peer still holds it"), 1);
    set_spec(&stage, "vr", json!({"replicationState": "primary"})).await;
    until(&stage, "vr", &PROMOTED, "volume is marked primary").await;
    assert_eq!(stage.driver.count("promote_volume"), promotes + 2);
    assert!(stage.driver.last::<replication::PromoteVolumeRequest>("promote_volume").force);

    // The dataSource's kind decides, whatever its apiGroup says (as upstream).
    bound_pvc(&stage.client, &stage.namespace, "other", &stage.driver_name, None, json!({})).await;
    let vr = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeReplication", "metadata": {"name": "any-group"},
        "spec": {"volumeReplicationClass": class, "replicationState": "primary",
                 "dataSource": {"apiGroup": "core.example.com", "kind": "PersistentVolumeClaim", "name": "other"}},
    });
    replications(&stage).create(&PostParams::default(), &serde_json::from_value(vr).unwrap()).await.unwrap();
    until(&stage, "any-group", &PROMOTED, "volume is marked primary").await;
}

#[tokio::test]
async fn failures_set_upstreams_failure_conditions_and_the_drivers_words() {
    let stage = Stage::new("vr-failures", &CAPABILITIES).await;
    let _sidecar = stage.sidecar("node-f").await;
    let class = create_class(&stage).await;
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;

    // A class that does not exist: the failure conditions of a promotion.
    let vr = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"), "kind": "VolumeReplication", "metadata": {"name": "classless"},
        "spec": {"volumeReplicationClass": "no-such-class", "replicationState": "primary",
                 "dataSource": {"kind": "PersistentVolumeClaim", "name": "data"}},
    });
    replications(&stage).create(&PostParams::default(), &serde_json::from_value(vr).unwrap()).await.unwrap();
    let failed = [
        ("Completed", "False", "FailedToPromote"),
        ("Degraded", "True", "Error"),
        ("Resyncing", "False", "NotResyncing"),
    ];
    let status = until(&stage, "classless", &failed, "VolumeReplicationClass no-such-class not found").await;
    assert_eq!(status["state"], "Unknown");
    assert_eq!(found(&status, "Completed").unwrap()["message"], "failed to get volumeReplication class");

    // The driver refuses to enable replication: the prerequisites are not met.
    stage.driver.fail("enable_volume_replication", Status::failed_precondition("mirroring is off in the pool"));
    create_vr(&stage, "vr", &class, "data").await;
    let refused = [
        ("Validated", "False", "PrerequisiteNotMet"),
        ("Completed", "False", "FailedToPromote"),
        ("Degraded", "True", "Error"),
        ("Resyncing", "False", "NotResyncing"),
    ];
    let status = until(&stage, "vr", &refused, "mirroring is off in the pool").await;
    assert_eq!(
        found(&status, "Validated").unwrap()["message"],
        "failed to meet prerequisite: rpc error: code = FailedPrecondition desc = mirroring is off in the pool"
    );
    stage.driver.heal();
    until(&stage, "vr", &PROMOTED, "volume is marked primary").await;

    // Demotion fails.
    stage.driver.fail("demote_volume", Status::internal("the image is locked"));
    set_spec(&stage, "vr", json!({"replicationState": "secondary"})).await;
    let failed = [
        ("Completed", "False", "FailedToDemote"),
        ("Degraded", "True", "Error"),
        ("Resyncing", "False", "NotResyncing"),
    ];
    let status = until(&stage, "vr", &failed, "the image is locked").await;
    assert_eq!(status["state"], "Primary", "the state stays what it was");
    assert_eq!(
        found(&status, "Degraded").unwrap()["message"],
        "volume failed to demote: rpc error: code = Internal desc = the image is locked"
    );
    stage.driver.heal();
    until(&stage, "vr", &[("Completed", "True", "Demoted")], "volume is marked secondary and is degraded").await;

    // A resync that fails takes Completed down with it.
    stage.driver.fail("resync_volume", Status::unavailable("the peer is away"));
    set_spec(&stage, "vr", json!({"replicationState": "resync"})).await;
    let failed = [
        ("Completed", "False", "FailedToResync"),
        ("Degraded", "True", "Error"),
        ("Resyncing", "False", "FailedToResync"),
    ];
    until(&stage, "vr", &failed, "the peer is away").await;

    // A promotion refused even with force.
    stage.driver.fail("promote_volume", Status::failed_precondition("split brain"));
    set_spec(&stage, "vr", json!({"replicationState": "primary"})).await;
    let failed = [
        ("Completed", "False", "FailedToPromote"),
        ("Degraded", "True", "Error"),
        ("Resyncing", "False", "NotResyncing"),
        ("Validated", "True", "PrerequisiteMet"),
    ];
    let status = until(&stage, "vr", &failed, "split brain").await;
    assert_eq!(found(&status, "Completed").unwrap()["message"], "failed to force promote volume");
    assert_eq!(status["state"], "Secondary");
}
