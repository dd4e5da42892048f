//! The reference driver as `deploy/reference-driver/` installs it: registered with the kubelet,
//! its sidecars Connected to the manager through `pod://` endpoints, and a workload's volume attached
//! by csi-attacher, staged and published by the kubelet, and reclaimed node-side then
//! controller-side.
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use testenv::poll;

use crate::cluster::{self, CONTROLLER_PLUGIN_SELECTOR, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR};

pub const DRIVER: &str = "reference.csi-addons-rs.io";
pub const WORKLOADS: &str = "workloads";
/// The StorageClass the workloads claim from: the hand-installed driver's `reference-csi`, or one the
/// driver operator keeps when a suite runs the story on its driver.
pub static STORAGE_CLASS: std::sync::RwLock<&str> = std::sync::RwLock::new("reference-csi");

pub fn csiaddons(client: &Client, kind: &str, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("csiaddons.openshift.io", "v1alpha1", kind);
    let plural = format!("{}s", kind.to_lowercase());
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, &plural))
}

/// The CSIAddonsNodes that are Connected, with their endpoints.
pub async fn connected_nodes(client: &Client) -> Vec<(String, String)> {
    let nodes = csiaddons(client, "CSIAddonsNode", DRIVER_NAMESPACE);
    let list = nodes.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|n| n.data.pointer("/status/state") == Some(&json!("Connected")))
        .map(|n| {
            let endpoint = n.data.pointer("/spec/driver/endpoint").and_then(Value::as_str).unwrap_or_default();
            (n.metadata.name.unwrap_or_default(), endpoint.to_owned())
        })
        .collect()
}

/// Waits for the node plugin's and the controller plugin's sidecars to be Connected: until the
/// controller plugin's sidecar has registered, the manager cannot know the driver reclaims space
/// controller-side too, and reclaims node-side alone, as upstream does.
pub async fn both_sidecars_connected(client: &Client) -> Vec<(String, String)> {
    poll::until(poll::MINUTE, async || {
        let nodes = connected_nodes(client).await;
        (nodes.len() == 2).then_some(nodes)
    })
    .await
    .expect("both sidecars' CSIAddonsNodes are Connected")
}

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster"]
async fn the_plugin_is_registered_and_every_sidecar_connected_through_its_pod() {
    let client = cluster::client().await;
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let registered = poll::until(poll::MINUTE, async || {
        let nodes = csinodes.list(&ListParams::default()).await.ok()?;
        nodes.items.into_iter().flat_map(|n| n.spec.drivers).find(|d| d.name == DRIVER)
    })
    .await
    .expect("the registrar registers the driver with the kubelet: CSINode lists it");
    assert_eq!(registered.topology_keys, Some(vec!["topology.reference.csi-addons-rs.io/node".to_owned()]));

    let mut plugin_pods = cluster::running_pods(&client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
    plugin_pods.extend(cluster::running_pods(&client, DRIVER_NAMESPACE, CONTROLLER_PLUGIN_SELECTOR).await);
    assert_eq!(plugin_pods.len(), 2, "one node plugin and one controller plugin run");
    let connected = both_sidecars_connected(&client).await;
    for pod in &plugin_pods {
        let endpoint = format!("pod://{}.{DRIVER_NAMESPACE}:9070", cluster::name(pod));
        assert!(connected.iter().any(|(_, e)| *e == endpoint), "{endpoint} in {connected:?}");
    }
    // Verified TLS is the hand install's default too: its certificates Job issued the sidecars'
    // certificate and put the CA on the CSIDriver.
    let verified = crate::sidecar_tls::check_verified_tls(&client, &plugin_pods, cluster::MANAGER_NAMESPACE).await;
    println!("the hand-installed driver: {verified}");
}

/// A PVC of the driver's StorageClass and a Pod writing 16 MiB to it and deleting them again, once
/// the deletion is synced (so a reclaim after it finds the blocks free).
pub async fn workload(client: &Client, name: &str) -> Pod {
    workload_labelled(client, name, None).await
}

/// [`workload`] with a label on the PVC.
pub async fn workload_labelled(client: &Client, name: &str, label: Option<(&str, &str)>) -> Pod {
    start_workload(client, name, label).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOADS);
    let pod = poll::until(cluster::POD_START, async || pods.get(name).await.ok().filter(cluster::ready))
        .await
        .unwrap_or_else(|| panic!("the workload {name} starts with its volume mounted"));
    // Ready comes when the shell starts; the line comes after `rm` and the second `sync`.
    let freed = poll::until(poll::MINUTE, async || {
        let log = pods.logs(name, &Default::default()).await.ok()?;
        log.contains(FREED).then_some(())
    })
    .await;
    assert!(freed.is_some(), "the workload {name} wrote 16 MiB to its volume and deleted them again");
    pod
}

/// What the workload prints once the 16 MiB it wrote are deleted and the deletion synced.
const FREED: &str = "blob freed";

/// Creates the PVC and the Pod of [`workload`] without waiting for them.
pub async fn start_workload(client: &Client, name: &str, label: Option<(&str, &str)>) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = json!({"metadata": {"name": WORKLOADS}});
    let _ = namespaces.create(&PostParams::default(), &serde_json::from_value(namespace).unwrap()).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), WORKLOADS);
    let labels = label.map(|(k, v)| json!({k: v})).unwrap_or_else(|| json!({}));
    let class = *STORAGE_CLASS.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let claim = json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "64Mi"}}}
    });
    claims.create(&PostParams::default(), &serde_json::from_value(claim).unwrap()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOADS);
    let pod = json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36.0",
            "command": ["/bin/sh", "-c", format!("dd if=/dev/zero of=/data/blob bs=1M count=16 && sync && rm /data/blob && sync && echo written > /data/done && echo '{FREED}' && exec sleep 3600")],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
          "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}]}
    });
    pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster"]
async fn a_workloads_volume_is_attached_staged_published_and_reclaimed() {
    let client = cluster::client().await;
    workload(&client, "app").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), WORKLOADS);
    let pv = claims.get("app").await.unwrap().spec.and_then(|s| s.volume_name).unwrap();
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attached = attachments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|a| a.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str()));
    let attached = attached.expect("the attach-detach controller made a VolumeAttachment");
    assert_eq!(attached.spec.attacher, DRIVER);
    assert_eq!(attached.status.map(|s| s.attached), Some(true), "csi-attacher attached it (ControllerPublishVolume)");
    // The Pod wrote, so the kubelet staged and published the volume.
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOADS);
    let log = pods.logs("app", &Default::default()).await.unwrap_or_default();
    assert!(log.contains("16+0 records out"), "the workload wrote 16 MiB to its volume: {log}");

    // Right after the install the controller plugin's sidecar may not have registered yet.
    both_sidecars_connected(&client).await;
    let jobs = csiaddons(&client, "ReclaimSpaceJob", WORKLOADS);
    let job: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "ReclaimSpaceJob",
        "metadata": {"name": "reclaim-app"}, "spec": {"target": {"persistentVolumeClaim": "app"}}
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let status = poll::until(poll::MINUTE, async || {
        let job = jobs.get("reclaim-app").await.ok()?;
        job.data.pointer("/status/result").is_some().then(|| job.data["status"].clone())
    })
    .await
    .expect("the ReclaimSpaceJob ends");
    assert_eq!(status["result"], "Succeeded", "{status}");
    let reclaimed: i64 = status["reclaimedSpace"].as_str().and_then(|s| s.parse().ok()).unwrap_or_default();
    assert!(reclaimed >= 16 << 20, "the 16 MiB the workload freed came back: {status}");

    // Node side through the node plugin's sidecar, then controller side.
    let handle = volume_handle(&client, &pv).await;
    let node_pod = cluster::running_pods(&client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
    let node_log = cluster::logs(&client, DRIVER_NAMESPACE, &cluster::name(&node_pod[0]), "driver").await;
    let controller_log = cluster::logs(&client, DRIVER_NAMESPACE, "reference-driver-controller-0", "driver").await;
    let line = |log: &str, call: &str| log.lines().position(|l| l.contains(call) && l.contains(&handle));
    assert!(line(&node_log, "NodeReclaimSpace").is_some(), "the node plugin trimmed {handle}");
    assert!(line(&controller_log, "ControllerReclaimSpace").is_some(), "the controller plugin reclaimed {handle}");
}

pub async fn volume_handle(client: &Client, pv: &str) -> String {
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let pv = pvs.get(pv).await.unwrap();
    pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).unwrap()
}
