//! The volume-condition reporter in the real sidecar process: a Node that does not exist yet is
//! retried (upstream exits), then the driver's conditions reach the PVC as events (on change) and
//! as the `csiaddons.openshift.io/volumehealth.<node uid>` annotation, in upstream's words, whose
//! `since` a restarted sidecar keeps.
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{Serving, SidecarProcess, Workload, sidecar_pod};
use crate::harness::support::unique;

const DRIVER: &str = "condition.csi-addons-rs.io";

async fn health(pvcs: &Api<PersistentVolumeClaim>, key: &str) -> Option<Value> {
    let pvc = pvcs.get("data").await.ok()?;
    serde_json::from_str(pvc.metadata.annotations?.get(key)?).ok()
}

async fn events(client: &kube::Client, namespace: &str, reason: &str) -> Vec<Event> {
    let list = Api::<Event>::namespaced(client.clone(), namespace).list(&ListParams::default()).await.unwrap();
    list.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect()
}

#[tokio::test]
async fn conditions_reach_the_pvc_and_a_missing_node_is_retried() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-condition").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, true);
    driver.set_condition(false, "volume is healthy");
    let node_name = unique("condition-node");
    let pod = sidecar_pod(&client, &namespace, &node_name, Workload::DaemonSet, "csi-plugin").await;

    // A PVC bound to a PV of the driver, published by the kubelet for an application Pod.
    let (pv_name, handle) = (unique("condition-pv"), unique("handle"));
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": pv_name}
    }))
    .unwrap();
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &namespace);
    let pvc = pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": handle},
            "claimRef": {"namespace": namespace, "name": "data", "uid": pvc.metadata.uid},
        }
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();
    let kubelet = tempfile::tempdir().unwrap();
    let volume_dir = kubelet.path().join(format!("pods/app-uid-1/volumes/kubernetes.io~csi/{pv_name}"));
    std::fs::create_dir_all(&volume_dir).unwrap();
    let vol_data = json!({"driverName": DRIVER, "volumeHandle": handle, "specVolID": pv_name});
    std::fs::write(volume_dir.join("vol_data.json"), vol_data.to_string()).unwrap();

    let start = || {
        SidecarProcess::start(
            &pod,
            &node_name,
            &driver.endpoint(),
            Serving::Plain,
            &[
                "--enable-volume-condition".to_owned(),
                "--volume-condition-interval=1s".to_owned(),
                format!("--csi-address={}", driver.endpoint()),
                format!("--kubelet-dir={}", kubelet.path().display()),
            ],
        )
    };
    let mut sidecar = start();
    sidecar.wait_ready().await;
    // The Node does not exist yet: the reporter says so and retries; the sidecar keeps serving.
    sidecar
        .wait_for("a retried Node read", async |s| s.log().contains("volume conditions not checked this time"))
        .await;
    sidecar.wait_ready().await;

    let nodes = Api::<Node>::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap();
    let node = nodes.create(&PostParams::default(), &node).await.unwrap();
    let attached = json!({"status": {"volumesAttached": [
        {"name": format!("kubernetes.io/csi/{DRIVER}^{handle}"), "devicePath": ""},
        {"name": "kubernetes.io/csi/other.example.com^not-ours", "devicePath": ""}
    ]}});
    nodes.patch_status(&node_name, &PatchParams::default(), &Patch::Merge(&attached)).await.unwrap();
    let key = format!("csiaddons.openshift.io/volumehealth.{}", node.metadata.uid.unwrap());

    sidecar
        .wait_for("a healthy annotation", async |_| health(&pvcs, &key).await.is_some_and(|h| h["state"] == "healthy"))
        .await;
    let asked: api::proto::csi::v1::NodeGetVolumeStatsRequest = driver.last("node_get_volume_stats");
    assert_eq!(asked.volume_id, handle);
    assert_eq!(asked.volume_path, volume_dir.join("mount").display().to_string());
    let healthy = health(&pvcs, &key).await.unwrap();
    assert_eq!(healthy["node"], node_name.as_str());

    driver.set_condition(true, "I/O errors on the backing device");
    sidecar
        .wait_for("an unhealthy annotation", async |_| {
            health(&pvcs, &key).await.is_some_and(|h| h["state"] == "unhealthy")
        })
        .await;
    let unhealthy = health(&pvcs, &key).await.unwrap();
    assert_eq!(unhealthy["message"], "I/O errors on the backing device");
    assert_ne!(unhealthy["since"], healthy["since"]);
    sidecar
        .wait_for("a Warning event", async |_| !events(&client, &namespace, "VolumeConditionAbnormal").await.is_empty())
        .await;
    let warning = events(&client, &namespace, "VolumeConditionAbnormal").await.remove(0);
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(warning.message.as_deref(), Some("I/O errors on the backing device"));
    assert_eq!(warning.involved_object.name.as_deref(), Some("data"));
    // Events on changes only: one healthy event however many ticks passed.
    assert_eq!(events(&client, &namespace, "VolumeConditionHealthy").await.len(), 1);
    // Only this driver's volume was asked about.
    assert!(driver.count("node_get_volume_stats") >= 2);

    // A restarted sidecar carries the condition's start on from the annotation. The clock has
    // moved a second on (the annotation's times have seconds), so a new start would show.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    sidecar.terminate();
    let before_restart = health(&pvcs, &key).await.unwrap();
    let sidecar = start();
    sidecar
        .wait_for("the restarted sidecar's check", async |_| {
            health(&pvcs, &key).await.is_some_and(|h| h["lastChecked"] != before_restart["lastChecked"])
        })
        .await;
    let after_restart = health(&pvcs, &key).await.unwrap();
    assert_eq!(after_restart["state"], "unhealthy");
    assert_eq!(after_restart["since"], unhealthy["since"], "the restart kept when the volume became unhealthy");
}
