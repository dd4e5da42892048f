//! The manager's connections to sidecars: a node's check keeps none open, one that calls use is
//! kept across passes (one TCP connection, not a dial per pass), one unused for
//! `--sidecar-idle-timeout` closes and the next call dials again, a status write starts no pass, and one is pooled before the fence clients are
//! asked for, so a failing GetFenceClients leaves it usable.
use std::time::Duration;

use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::manager::{Stage, bound_pvc};

/// The local ports of the established TCP connections to 127.0.0.1:`port` (the clients' ends),
/// from the kernel's table.
fn clients_of(port: u16) -> Vec<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let loopback = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, state) = (fields.get(1)?, fields.get(2)?, fields.get(3)?);
            // 01: ESTABLISHED.
            (*remote == loopback && *state == "01").then(|| u16::from_str_radix(local.rsplit(':').next()?, 16).ok())?
        })
        .collect()
}

/// `GetCapabilities` calls the sidecar has answered, from its metrics.
async fn capability_calls(sidecar: &crate::harness::sidecar::SidecarProcess) -> u64 {
    let (_, body) = sidecar.http("/metrics").await.unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with("csi_addons_sidecar_rpcs_total{") && l.contains("/identity.Identity/GetCapabilities"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn a_check_keeps_no_connection_open_and_one_in_use_is_kept_across_passes() {
    let stage = Stage::new("conn-reuse", &["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE"]).await;
    let sidecar = stage.sidecar("node-k").await;
    stage.manager.eventually("the check's connection closes", async |_| clients_of(sidecar.port).is_empty()).await;
    // A job's call opens one, kept while calls use it (and `--sidecar-idle-timeout`, 2 minutes).
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    let status = stage.job("ReclaimSpaceJob", "opens", json!({"target": {"persistentVolumeClaim": "data"}})).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    let first = clients_of(sidecar.port);
    assert_eq!(first.len(), 1, "the manager holds one connection to the sidecar: {first:?}");
    let asked = capability_calls(&sidecar).await;
    // Each change of the CSIAddonsNode is a pass that reads the capabilities again, through it.
    let nodes = stage.api("CSIAddonsNode");
    let name = nodes.list(&ListParams::default()).await.unwrap().items[0].metadata.name.clone().unwrap();
    for i in 0..3 {
        let patch = json!({"metadata": {"annotations": {"example.com/poke": i.to_string()}}});
        nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stage.manager.eventually("three more passes", async |_| capability_calls(&sidecar).await >= asked + 3).await;
    assert_eq!(clients_of(sidecar.port), first, "a pass dialled the sidecar again");
}

#[tokio::test]
async fn an_unused_connection_closes_and_the_next_call_dials_again() {
    let capabilities = ["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE"];
    let stage = Stage::with_flags("conn-idle", &capabilities, &["--sidecar-idle-timeout=2s"]).await;
    let sidecar = stage.sidecar("node-i").await;
    stage.manager.eventually("the idle connection closes", async |_| clients_of(sidecar.port).is_empty()).await;
    // Closed for idleness, the node is still Connected, and a job's call dials again.
    let nodes = stage.api("CSIAddonsNode");
    let node = nodes.list(&ListParams::default()).await.unwrap().items.remove(0);
    assert_eq!(node.data["status"]["state"], "Connected", "{:?}", node.data["status"]);
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    let status = stage.job("ReclaimSpaceJob", "after-idle", json!({"target": {"persistentVolumeClaim": "data"}})).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    stage.manager.eventually("the connection closes again", async |_| clients_of(sidecar.port).is_empty()).await;
}

#[tokio::test]
async fn a_status_write_starts_no_pass_an_annotation_does() {
    let stage = Stage::new("conn-quiet", &["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE"]).await;
    let sidecar = stage.sidecar("node-q").await;
    let nodes = stage.api("CSIAddonsNode");
    let name = nodes.list(&ListParams::default()).await.unwrap().items[0].metadata.name.clone().unwrap();
    // The manager's own Connected write and then someone else's status write: neither is a
    // change of what a pass acts on, so the one pass that connected stays the only one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(capability_calls(&sidecar).await, 1, "the manager's own status write started a second pass");
    let status = json!({"status": {"message": "written by someone else"}});
    nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let poke = json!({"metadata": {"annotations": {"example.com/poke": "1"}}});
    nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&poke)).await.unwrap();
    stage.manager.eventually("the annotation's pass", async |_| capability_calls(&sidecar).await >= 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(capability_calls(&sidecar).await, 2, "the status write started a pass");
    // That pass wrote the status back as the manager has it.
    let node = nodes.get(&name).await.unwrap();
    assert_eq!(node.data["status"]["message"], "Successfully established connection with sidecar");
    // A first connection is told by the status alone, not by an Event per node.
    let events = kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(stage.client.clone(), &stage.namespace);
    let events = events.list(&ListParams::default()).await.unwrap().items;
    let told: Vec<_> = events.iter().filter(|e| e.involved_object.name.as_deref() == Some(name.as_str())).collect();
    assert!(told.is_empty(), "events on a node that connected at the first attempt: {told:?}");
}

#[tokio::test]
async fn a_failing_get_fence_clients_leaves_the_connection_pooled() {
    let capabilities = ["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE", "network_fence.GET_CLIENTS_TO_FENCE"];
    let stage = Stage::new("conn-fence", &capabilities).await;
    stage.driver.fail("get_fence_clients", tonic::Status::unavailable("the cluster map is stale"));
    let class: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "NetworkFenceClass",
        "metadata": {"name": crate::harness::support::unique("conn-fence")},
        "spec": {"provisioner": stage.driver_name, "parameters": {"clusterID": "c1"}},
    }))
    .unwrap();
    let classes = crate::harness::support::dynamic_api(&stage.client, "NetworkFenceClass", "");
    let class = classes.create(&PostParams::default(), &class).await.unwrap();
    let _sidecar = stage.sidecar("node-f").await;
    let nodes = stage.api("CSIAddonsNode");
    let name = nodes.list(&ListParams::default()).await.unwrap().items[0].metadata.name.clone().unwrap();
    let warning = stage.warning(&name, "FenceClientsFailed").await;
    assert!(warning.is_some_and(|m| m.contains("the cluster map is stale")), "no FenceClientsFailed event");
    // The connection is in the pool all the same: a job goes through it.
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    let status = stage.job("ReclaimSpaceJob", "through", json!({"target": {"persistentVolumeClaim": "data"}})).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert!(stage.manager.metrics_text().await.contains("csi_addons_sidecar_connections{state=\"connected\"} 1"));
    classes.delete(&class.metadata.name.unwrap(), &Default::default()).await.unwrap();
}
