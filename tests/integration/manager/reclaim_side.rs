//! The reclaim side a user chooses (`csi-addons-rs.io/reclaim-side`: node, controller or both) on a
//! ReclaimSpaceJob, its PVC or its StorageClass, with the real manager and sidecar processes and a
//! recording driver that counts each side's calls.
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::harness::manager::{Stage, attach, bound_pvc, job_result};
use crate::harness::support::{dynamic, unique};

const NODE: &str = "node-a";
const SIDE: &str = "csi-addons-rs.io/reclaim-side";
const EVERY_SIDE: [&str; 3] = ["service.CONTROLLER_SERVICE", "reclaim_space.ONLINE", "reclaim_space.OFFLINE"];

/// Creates ReclaimSpaceJob `name` on `pvc`, with `side` as its annotation if given, and waits for
/// its result.
async fn job(stage: &Stage, name: &str, pvc: &str, side: Option<&str>) -> serde_json::Value {
    let annotations = side.map_or_else(|| json!({}), |side| json!({ SIDE: side }));
    let object = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1",
        "kind": "ReclaimSpaceJob",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"target": {"persistentVolumeClaim": pvc}},
    }))
    .unwrap();
    stage.api("ReclaimSpaceJob").create(&PostParams::default(), &object).await.unwrap();
    job_result(&stage.manager, &stage.api("ReclaimSpaceJob"), name).await
}

/// The (node, controller) calls the driver has had.
fn calls(stage: &Stage) -> (usize, usize) {
    (stage.driver.count("node_reclaim_space"), stage.driver.count("controller_reclaim_space"))
}

/// A StorageClass of the stage's driver whose annotation says `side`.
async fn class_saying(stage: &Stage, side: &str) -> String {
    let name = unique("reclaim-side");
    let class = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": { SIDE: side }},
        "provisioner": stage.driver_name,
    }))
    .unwrap();
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(stage.client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn the_job_then_the_pvc_then_the_storage_class_chooses_the_side() {
    let stage = Stage::new("side-choice", &EVERY_SIDE).await;
    let _sidecar = stage.sidecar(NODE).await;
    let class = class_saying(&stage, "controller").await;
    let (client, namespace, driver) = (&stage.client, &stage.namespace, &stage.driver_name);
    let of_class = bound_pvc(client, namespace, "of-class", driver, Some(&class), json!({})).await;
    attach(client, &of_class, NODE, driver).await;
    let pvc_says_node = bound_pvc(client, namespace, "says-node", driver, Some(&class), json!({ SIDE: "node" })).await;
    attach(client, &pvc_says_node, NODE, driver).await;
    let plain = bound_pvc(client, namespace, "plain", driver, None, json!({})).await;
    attach(client, &plain, NODE, driver).await;

    // Nothing anywhere: both sides, as upstream.
    assert_eq!(job(&stage, "default", "plain", None).await["result"], "Succeeded");
    assert_eq!(calls(&stage), (1, 1), "both sides by default");
    // The StorageClass says controller: the attached volume's node is left alone.
    let status = job(&stage, "by-class", "of-class", None).await;
    assert_eq!((&status["result"], &status["reclaimedSpace"]), (&json!("Succeeded"), &json!("60")), "{status}");
    assert_eq!(calls(&stage), (1, 2), "the StorageClass's controller");
    // The PVC's node wins over its StorageClass's controller.
    let status = job(&stage, "by-pvc", "says-node", None).await;
    assert_eq!((&status["result"], &status["reclaimedSpace"]), (&json!("Succeeded"), &json!("100")), "{status}");
    assert_eq!(calls(&stage), (2, 2), "the PVC's node");
    // The job's both wins over the PVC's node; the job's controller over nothing.
    assert_eq!(job(&stage, "by-job", "says-node", Some("both")).await["result"], "Succeeded");
    assert_eq!(calls(&stage), (3, 3), "the job's both");
    assert_eq!(job(&stage, "job-controller", "plain", Some("controller")).await["result"], "Succeeded");
    assert_eq!(calls(&stage), (3, 4), "the job's controller");

    // A ReclaimSpaceCronJob hands its template's annotation to each job it starts.
    let cron = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1",
        "kind": "ReclaimSpaceCronJob",
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "@every 2s", "jobTemplate": {
            "metadata": {"annotations": { SIDE: "node" }},
            "spec": {"target": {"persistentVolumeClaim": "plain"}}}},
    }))
    .unwrap();
    dynamic(client, namespace, "ReclaimSpaceCronJob").create(&PostParams::default(), &cron).await.unwrap();
    stage.manager.eventually("a run of the cron job", async |_| calls(&stage).0 >= 4).await;
    let children = stage.api("ReclaimSpaceJob").list(&Default::default()).await.unwrap();
    let child = children.items.iter().find(|j| j.metadata.name.as_deref().is_some_and(|n| n.starts_with("nightly-")));
    let annotations = child.and_then(|c| c.metadata.annotations.clone()).unwrap_or_default();
    assert_eq!(annotations.get(SIDE).map(String::as_str), Some("node"), "the child's annotations: {annotations:?}");
    dynamic(client, namespace, "ReclaimSpaceCronJob").delete("nightly", &Default::default()).await.unwrap();
    assert_eq!(calls(&stage).1, 4, "the cron job's runs were node-side only");

    // A value it does not take: Failed at once, saying where it is and what it takes.
    let status = job(&stage, "sideways", "plain", Some("sideways")).await;
    assert_eq!((&status["result"], &status["retries"]), (&json!("Failed"), &json!(0)), "{status}");
    assert_eq!(
        status["message"],
        "the ReclaimSpaceJob's annotation csi-addons-rs.io/reclaim-side is \"sideways\": it takes node, controller or both"
    );
    let event = stage.warning("sideways", "Failed").await.expect("a Warning event for the refused side");
    assert!(event.contains("sideways"), "{event}");
}

#[tokio::test]
async fn a_side_that_cannot_be_served_fails_the_job_saying_why() {
    let stage = Stage::new("side-refused", &EVERY_SIDE).await;
    let _sidecar = stage.sidecar(NODE).await;
    let (client, namespace, driver) = (&stage.client, &stage.namespace, &stage.driver_name);
    bound_pvc(client, namespace, "unattached", driver, None, json!({})).await;
    let attached = bound_pvc(client, namespace, "attached", driver, None, json!({})).await;
    attach(client, &attached, NODE, driver).await;

    // node on a volume attached nowhere: Failed at once, without a call.
    let status = job(&stage, "nowhere", "unattached", Some("node")).await;
    assert_eq!((&status["result"], &status["retries"]), (&json!("Failed"), &json!(0)), "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("is not attached to any node") && message.contains("reclaim side is node"), "{message}");
    assert_eq!(calls(&stage), (0, 0));

    // The chosen side answers UNIMPLEMENTED: Failed, naming the side and the driver. With both
    // sides (the default) the same answer reclaims nothing there, as upstream.
    stage.driver.fail("node_reclaim_space", tonic::Status::unimplemented("no trim here"));
    let status = job(&stage, "unimplemented", "attached", Some("node")).await;
    assert_eq!((&status["result"], &status["retries"]), (&json!("Failed"), &json!(0)), "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("reclaim side is node")
            && message.contains(driver.as_str())
            && message.contains("NodeReclaimSpace"),
        "{message}"
    );
    assert_eq!(job(&stage, "both-unimplemented", "attached", None).await["result"], "Succeeded");
    stage.driver.heal();
}

#[tokio::test]
async fn a_side_the_driver_does_not_offer_fails_the_job_naming_side_and_driver() {
    let stage = Stage::new("side-lacking", &["service.NODE_SERVICE", "reclaim_space.ONLINE"]).await;
    let _sidecar = stage.sidecar(NODE).await;
    let (client, namespace, driver) = (&stage.client, &stage.namespace, &stage.driver_name);
    let pv = bound_pvc(client, namespace, "data", driver, None, json!({})).await;
    attach(client, &pv, NODE, driver).await;
    let status = job(&stage, "controller-side", "data", Some("controller")).await;
    assert_eq!((&status["result"], &status["retries"]), (&json!("Failed"), &json!(0)), "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("reclaim side is controller")
            && message.contains(&format!("driver {driver}"))
            && message.contains("reclaim_space.OFFLINE"),
        "{message}"
    );
    assert_eq!(calls(&stage), (0, 0));
    // The node side it does offer still works when asked for.
    assert_eq!(job(&stage, "node-side", "data", Some("node")).await["result"], "Succeeded");
    assert_eq!(calls(&stage), (1, 0));
}
