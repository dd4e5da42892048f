//! ReclaimSpaceJob and EncryptionKeyRotationJob end to end: the real manager process, the real
//! sidecar process, and a recording CSI-Addons driver that counts every call.
use std::time::Duration;

use kube::api::Api;
use serde_json::json;

use crate::harness::manager::{Stage, attach, bound_pvc, job_result, set_phase};
use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{Serving, SidecarProcess, Workload, sidecar_pod};
use crate::harness::support::create_job;

const NODE: &str = "node-a";

fn target(pvc: &str) -> serde_json::Value {
    json!({"target": {"persistentVolumeClaim": pvc}})
}

#[tokio::test]
async fn reclaim_space_runs_on_the_attached_node_then_the_controller_and_sums_what_was_freed() {
    let stage =
        Stage::new("rsj-route", &["service.CONTROLLER_SERVICE", "reclaim_space.ONLINE", "reclaim_space.OFFLINE"]).await;
    let _sidecar = stage.sidecar(NODE).await;
    let attached = bound_pvc(&stage.client, &stage.namespace, "attached", &stage.driver_name, None, json!({})).await;
    attach(&stage.client, &attached, NODE, &stage.driver_name).await;
    bound_pvc(&stage.client, &stage.namespace, "detached", &stage.driver_name, None, json!({})).await;

    let status = stage.job("ReclaimSpaceJob", "on-attached", target("attached")).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(status["message"], "Reclaim Space operation successfully completed.");
    // Node 1000 → 900 and controller 100 → 40: pre − post summed.
    assert_eq!(status["reclaimedSpace"], "160", "{status}");
    assert!(status["startTime"].is_string() && status["completionTime"].is_string(), "{status}");
    assert_eq!((stage.driver.count("node_reclaim_space"), stage.driver.count("controller_reclaim_space")), (1, 1));

    let status = stage.job("ReclaimSpaceJob", "on-detached", target("detached")).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(status["reclaimedSpace"], "60", "{status}");
    assert_eq!(
        (stage.driver.count("node_reclaim_space"), stage.driver.count("controller_reclaim_space")),
        (1, 2),
        "an unattached volume gets only the controller-side call"
    );

    let metrics = stage.manager.metrics_text().await;
    for series in [
        "csi_addons_operations_total{kind=\"ReclaimSpaceJob\",result=\"Succeeded\"} 2",
        "csi_addons_reclaimed_bytes_total 220",
        "controller_runtime_reconcile_total{controller=\"reclaimspacejob\",result=\"success\"}",
        "controller_runtime_reconcile_time_seconds_count{controller=\"reclaimspacejob\"}",
        "controller_runtime_active_workers{controller=\"reclaimspacejob\"} 0",
        "workqueue_depth{controller=\"reclaimspacejob\",name=\"reclaimspacejob\"} 0",
        "csi_addons_sidecar_connections{state=\"connected\"} 1",
        "csi_addons_sidecar_rpc_duration_seconds_count{code=\"Ok\",method=\"ReclaimSpace/NodeReclaimSpace\"} 1",
        "leader_election_master_status{name=\"e8cd140a.openshift.io\"} 1",
    ] {
        assert!(metrics.contains(series), "{series} missing from /metrics:\n{metrics}");
    }
    let lint = crate::packaging::alerts::metric_lint(&metrics);
    assert!(lint.is_empty(), "promtool check metrics on the manager's /metrics:\n{lint}");
}

#[tokio::test]
async fn a_node_only_driver_reclaims_without_a_controller_side() {
    let stage = Stage::new("rsj-node-only", &["service.NODE_SERVICE", "reclaim_space.ONLINE"]).await;
    let _sidecar = stage.sidecar(NODE).await;
    let pv = bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    attach(&stage.client, &pv, NODE, &stage.driver_name).await;
    let status = stage.job("ReclaimSpaceJob", "node-only", target("data")).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(status["reclaimedSpace"], "100");
    assert_eq!((stage.driver.count("node_reclaim_space"), stage.driver.count("controller_reclaim_space")), (1, 0));
}

#[tokio::test]
async fn a_job_waits_for_a_sidecar_that_registers_seconds_later() {
    let stage = Stage::new("rsj-late", &["service.NODE_SERVICE", "reclaim_space.ONLINE"]).await;
    let pv = bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    attach(&stage.client, &pv, NODE, &stage.driver_name).await;
    create_job(&stage.client, &stage.namespace, "ReclaimSpaceJob", "early", target("data")).await;
    // Upstream spends all six retries in about 0.3 s; ours wait 5 s, 10 s, …
    tokio::time::sleep(Duration::from_secs(4)).await;
    let _sidecar = stage.sidecar(NODE).await;
    let status = job_result(&stage.manager, &stage.api("ReclaimSpaceJob"), "early").await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert!(status["retries"].as_i64().unwrap() >= 1, "{status}");
    assert_eq!(stage.driver.count("node_reclaim_space"), 1);
}

#[tokio::test]
async fn failed_jobs_say_why_deadline_back_off_limit_and_not_csi() {
    let stage = Stage::new("rsj-fail", &["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE"]).await;
    let _sidecar = stage.sidecar(NODE).await;

    let mut spec = target("missing");
    spec["retryDeadlineSeconds"] = json!(3);
    let status = stage.job("ReclaimSpaceJob", "deadline", spec).await;
    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("Time limit reached") && message.contains("retryDeadlineSeconds (3 s)"), "{message}");

    let mut spec = target("missing");
    spec["backOffLimit"] = json!(1);
    let status = stage.job("ReclaimSpaceJob", "back-off", spec).await;
    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("backOffLimit is 1") && message.contains("PVC") && message.contains("missing"),
        "{message}"
    );
    // The first try and one retry: upstream's count of retries, backOffLimit.
    assert_eq!(status["retries"], 1, "{status}");
    assert!(stage.warning("back-off", "Failed").await.is_some(), "no Warning event for the failed job");

    // A PV that is not CSI cannot be reclaimed: Failed at once, no retries.
    let pv_name = crate::harness::support::unique("nfs-pv");
    let pv = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "nfs": {"server": "nfs.example", "path": "/x"}},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(stage.client.clone())
        .create(&Default::default(), &pv)
        .await
        .unwrap();
    let claim = serde_json::from_value(json!({
        "metadata": {"name": "nfs"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": "", "volumeName": pv_name},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace)
        .create(&Default::default(), &claim)
        .await
        .unwrap();
    set_phase(&stage.client, &stage.namespace, "nfs", &pv_name, "Bound").await;
    let status = stage.job("ReclaimSpaceJob", "not-csi", target("nfs")).await;
    assert_eq!(status["result"], "Failed", "{status}");
    assert!(status["message"].as_str().unwrap().contains("is not a CSI volume"), "{status}");
    assert_eq!(status["retries"], 0, "{status}");
}

#[tokio::test]
async fn key_rotation_runs_where_the_volume_is_attached_and_unimplemented_is_a_failure() {
    let stage = Stage::new("ekr", &["service.NODE_SERVICE", "encryption_key_rotation.ENCRYPTIONKEYROTATION"]).await;
    let _sidecar = stage.sidecar(NODE).await;
    let pv = bound_pvc(&stage.client, &stage.namespace, "secret-data", &stage.driver_name, None, json!({})).await;
    attach(&stage.client, &pv, NODE, &stage.driver_name).await;
    let status = stage.job("EncryptionKeyRotationJob", "rotate", target("secret-data")).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(status["message"], "Key rotation operation successfully completed.");
    assert_eq!(stage.driver.count("encryption_key_rotate"), 1);

    stage.driver.fail("encryption_key_rotate", tonic::Status::unimplemented("no KMS here"));
    let status = stage.job("EncryptionKeyRotationJob", "unimplemented", target("secret-data")).await;
    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("does not implement EncryptionKeyRotate") && message.contains("not rotated"), "{message}");
    assert_eq!(stage.driver.count("encryption_key_rotate"), 2, "UNIMPLEMENTED is not retried");
    let event = stage.warning("unimplemented", "Failed").await.expect("a Warning event");
    assert!(event.contains("does not implement"), "{event}");
}

#[tokio::test]
async fn an_unreachable_sidecar_is_retried_with_growing_waits_then_its_node_object_is_deleted() {
    let stage = Stage::new("node-retry", &["service.NODE_SERVICE"]).await;
    let nodes = stage.api("CSIAddonsNode");
    let dead = crate::harness::sidecar::free_port();
    let node: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "CSIAddonsNode",
        "metadata": {"name": "gone"},
        "spec": {"driver": {"name": stage.driver_name, "endpoint": format!("127.0.0.1:{dead}"), "nodeID": NODE}},
    }))
    .unwrap();
    nodes.create(&Default::default(), &node).await.unwrap();
    let retries = async || {
        let node = nodes.get_opt("gone").await.unwrap()?;
        node.data.pointer("/status/retries").and_then(serde_json::Value::as_i64)
    };
    stage.manager.eventually("a first failed attempt", async |_| retries().await.is_some()).await;
    let status = nodes.get("gone").await.unwrap().data["status"].clone();
    assert_eq!(status["state"], "Retrying", "{status}");
    assert!(status["message"].as_str().unwrap().contains("Retrying attempt 1/3"), "{status}");
    // 2 s, then 4 s, then 8 s between attempts: three seconds in, at most the second has run.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let so_far = retries().await;
    assert!(matches!(so_far, Some(1 | 2)), "the backoff was cut short: retries {so_far:?}");
    let metrics = stage.manager.metrics_text().await;
    assert!(metrics.contains("csi_addons_sidecar_connections{state=\"retrying\"} 1"), "{metrics}");
    stage
        .manager
        .eventually("the CSIAddonsNode deleted after 3 retries", async |_| {
            nodes.get_opt("gone").await.unwrap().is_none()
        })
        .await;
    let event = stage.warning("gone", "ConnectionFailed").await.expect("a Warning event");
    assert!(event.contains("Connection failed 4 times") && event.contains(&dead.to_string()), "{event}");
}

/// Upstream's sidecars register `pod://<pod>.<namespace>:<port>`: the manager dials the Pod's IP
/// (`status.podIP`). While the Pod has none it says so and waits: a Pod still starting is no failed
/// attempt, so however long the wait, the CSIAddonsNode is not deleted as an unreachable one is.
#[tokio::test]
async fn a_pod_endpoint_is_dialled_at_the_pods_ip_and_a_pod_without_one_uses_up_no_retry() {
    // Retries 1 s, 2 s, 4 s apart: counted, the attempts would have ended in deletion in 7 s.
    let flags = ["--csi-addons-node-retry-delay=1"];
    let stage = Stage::with_flags("pod-endpoint", &["service.NODE_SERVICE", "reclaim_space.ONLINE"], &flags).await;
    let sidecar = stage.sidecar(NODE).await;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(stage.client.clone(), &stage.namespace);
    let pod = pods.list(&Default::default()).await.unwrap().items.remove(0).metadata.name.unwrap();
    let nodes = stage.api("CSIAddonsNode");
    let endpoint = format!("pod://{pod}.{}:{}", stage.namespace, sidecar.port);
    let node = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "CSIAddonsNode", "metadata": {"name": "via-pod"},
        "spec": {"driver": {"name": stage.driver_name, "endpoint": endpoint, "nodeID": "node-b"}},
    }))
    .unwrap();
    nodes.create(&Default::default(), &node).await.unwrap();
    let state = async |nodes: &Api<kube::api::DynamicObject>| {
        let status = nodes.get_status("via-pod").await.unwrap().data["status"].clone();
        (status["state"].as_str().unwrap_or_default().to_owned(), status["message"].to_string())
    };
    stage.manager.eventually("no IP yet, said", async |_| state(&nodes).await.1.contains("has no IP yet")).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let waiting = nodes.get_opt("via-pod").await.unwrap().expect("the CSIAddonsNode is kept while its Pod has no IP");
    let status = &waiting.data["status"];
    assert_eq!(status["state"], "Retrying", "{status}");
    assert!(status.get("retries").is_none(), "waiting for an IP counted as failed attempts: {status}");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.contains("phase Pending") && message.contains("not counted as a failed attempt"), "{message}");
    let ip = json!({"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}});
    pods.patch_status(&pod, &Default::default(), &kube::api::Patch::Merge(&ip)).await.unwrap();
    stage.manager.eventually("Connected through the Pod's IP", async |_| state(&nodes).await.0 == "Connected").await;
    // The recovery from Retrying is told as a Normal event.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(stage.client.clone(), &stage.namespace);
    let connected = async || {
        let list = events.list(&Default::default()).await.unwrap().items;
        list.into_iter().any(|e| {
            e.involved_object.name.as_deref() == Some("via-pod")
                && e.reason.as_deref() == Some("Connected")
                && e.type_.as_deref() == Some("Normal")
        })
    };
    stage.manager.eventually("a Connected event after the retries", async |_| connected().await).await;
}

/// `spec.timeout` bounds each call, over `--reclaim-space-timeout`: with the flag at 2 s, a
/// driver answering after 5 s fails a job without a timeout of its own (cut off, retried, failed
/// with the reason) and serves one whose `spec.timeout` is 60 s.
#[tokio::test]
async fn spec_timeout_takes_over_the_managers_reclaim_space_timeout() {
    let capabilities = ["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE"];
    let stage = Stage::with_flags("rsj-timeout", &capabilities, &["--reclaim-space-timeout=2s"]).await;
    let _sidecar = stage.sidecar(NODE).await;
    stage.driver.delay("controller_reclaim_space", Duration::from_secs(5));
    bound_pvc(&stage.client, &stage.namespace, "slow", &stage.driver_name, None, json!({})).await;
    let mut patient = target("slow");
    patient["timeout"] = json!(60);
    let status = stage.job("ReclaimSpaceJob", "patient", patient).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    let mut hasty = target("slow");
    hasty["backOffLimit"] = json!(1);
    let status = stage.job("ReclaimSpaceJob", "hasty", hasty).await;
    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("backOffLimit is 1") && message.contains("controller request"), "{message}");
    assert!(message.contains("DeadlineExceeded") || message.contains("Cancelled"), "{message}");
}

/// Key rotation runs where the volume is attached: a volume attached nowhere is retried with that
/// reason and fails with it; the driver is never called.
#[tokio::test]
async fn key_rotation_of_a_volume_attached_nowhere_fails_with_the_reason() {
    let stage =
        Stage::new("ekr-detached", &["service.NODE_SERVICE", "encryption_key_rotation.ENCRYPTIONKEYROTATION"]).await;
    let _sidecar = stage.sidecar(NODE).await;
    bound_pvc(&stage.client, &stage.namespace, "idle", &stage.driver_name, None, json!({})).await;
    let mut spec = target("idle");
    spec["backOffLimit"] = json!(1);
    let status = stage.job("EncryptionKeyRotationJob", "rotate-idle", spec).await;
    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("is not attached to any node"), "{message}");
    assert_eq!(status["retries"], 1, "{status}");
    assert_eq!(stage.driver.count("encryption_key_rotate"), 0);
}

/// A driver whose sidecar stops answering holds up only its own jobs: of four workers its passes
/// take three, and another driver's job runs on the fourth while those calls still hang. Its jobs
/// over the share wait without a call, and each runs as soon as one of its driver's calls ends.
#[tokio::test]
async fn a_driver_that_stops_answering_leaves_workers_for_another_drivers_jobs() {
    const CALL: &str = "controller_reclaim_space";
    let capabilities = ["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE"];
    let stage = Stage::with_flags("rsj-shares", &capabilities, &["--max-concurrent-reconciles=4"]).await;
    let _sidecar = stage.sidecar(NODE).await;
    let other_name = "rsj-shares-other.csi-addons-rs.io";
    let other = RecordingDriver::start(other_name, true, false);
    other.advertise(&capabilities);
    let pod = sidecar_pod(&stage.client, &stage.namespace, NODE, Workload::DaemonSet, "other").await;
    let other_sidecar = SidecarProcess::start(&pod, NODE, &other.endpoint(), Serving::Plain, &[]);
    other_sidecar.wait_leader(true).await;
    let nodes = stage.api("CSIAddonsNode");
    stage
        .manager
        .eventually("both CSIAddonsNodes to be Connected", async |_| {
            let list = nodes.list(&Default::default()).await.unwrap();
            list.items.iter().filter(|n| n.data.pointer("/status/state") == Some(&json!("Connected"))).count() == 2
        })
        .await;

    stage.driver.hold(CALL);
    for i in 0..5 {
        let pvc = format!("stalled-{i}");
        bound_pvc(&stage.client, &stage.namespace, &pvc, &stage.driver_name, None, json!({})).await;
        create_job(&stage.client, &stage.namespace, "ReclaimSpaceJob", &pvc, target(&pvc)).await;
    }
    stage
        .manager
        .eventually("three of the stalled driver's calls to hang", async |_| stage.driver.in_flight(CALL) == 3)
        .await;

    bound_pvc(&stage.client, &stage.namespace, "other", other_name, None, json!({})).await;
    let status = stage.job("ReclaimSpaceJob", "other", target("other")).await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(other.count(CALL), 1);
    assert_eq!(stage.driver.in_flight(CALL), 3, "the other driver's job ended while the stalled calls hung");
    assert_eq!(stage.driver.count(CALL), 0, "no held call has answered");

    stage.driver.release(CALL);
    let jobs = stage.api("ReclaimSpaceJob");
    for i in 0..5 {
        let status = job_result(&stage.manager, &jobs, &format!("stalled-{i}")).await;
        assert_eq!(status["result"], "Succeeded", "stalled-{i}: {status}");
        assert_eq!(status["retries"], 0, "stalled-{i} waited for its share without a failed attempt: {status}");
    }
    assert_eq!(stage.driver.count(CALL), 5, "one call per job");
    assert_eq!(stage.driver.max_in_flight(CALL), 3, "never more than the driver's share at once");
}

#[tokio::test]
async fn a_stopping_leader_keeps_the_lease_until_its_call_in_flight_has_ended() {
    const CALL: &str = "controller_reclaim_space";
    let capabilities = ["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE"];
    let stage = Stage::with_flags("rsj-handover", &capabilities, &["--leader-elect"]).await;
    stage.manager.eventually("the first manager to lead", async |m| m.leading().await == Some(true)).await;
    let _sidecar = stage.sidecar(NODE).await;
    let standby = stage.another_manager();
    standby.eventually("the second manager to stand by", async |m| m.leading().await == Some(false)).await;

    stage.driver.hold(CALL);
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    create_job(&stage.client, &stage.namespace, "ReclaimSpaceJob", "data", target("data")).await;
    stage
        .manager
        .eventually("the leader's call to reach the driver", async |_| stage.driver.in_flight(CALL) == 1)
        .await;
    // The leader is told to stop (as an eviction does) while its call is out. Two seconds on,
    // within the time a stopping manager gives its passes, the call is still held: the Lease must
    // still be the stopping manager's, or the standby would call the same volume meanwhile.
    testenv::process::signal("-TERM", stage.manager.child.id());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leading = standby.leading().await;
    stage.driver.release(CALL);
    assert_eq!(
        leading,
        Some(false),
        "the standby led while the stopping leader's call was out; its log:\n{}",
        standby.log()
    );
    standby.eventually("the standby to take over", async |m| m.leading().await == Some(true)).await;
    let status = job_result(&standby, &stage.api("ReclaimSpaceJob"), "data").await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(stage.driver.count(CALL), 1, "the stopping leader's call finished the job; no second one");
    let log = stage.manager.log();
    let (stopped, released) = (log.find("the reconcilers stopped"), log.find("Lease released"));
    assert!(stopped.is_some() && stopped < released, "the Lease goes after the reconcilers; log:\n{log}");
    // Still holding the Lease while it stops, it must not take that for a reason to start again.
    assert_eq!(log.matches("leading: starting the reconcilers").count(), 1, "started again on the way out:\n{log}");
}
