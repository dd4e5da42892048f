//! What the Deployment and the DaemonSet do for the product when its Pods go: the manager's Pod
//! deleted in the middle of 200 ReclaimSpaceJobs, and the node plugin's Pod deleted.
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::DynamicObject;
use serde_json::json;
use testenv::poll;

use crate::cluster::{self, DRIVER_NAMESPACE, MANAGER_NAMESPACE, MANAGER_SELECTOR, NODE_PLUGIN_SELECTOR};
use crate::driver_pods::{connected_nodes, csiaddons, workload};

const JOBS: usize = 200;

/// Creates 200 ReclaimSpaceJobs on the claim `claim` in `workloads`, labelled `batch=<batch>`, and
/// runs `midway` after the first quarter; then waits until each has ended and checks that it ended
/// Succeeded, or Failed with a message.
pub async fn batch_of_jobs_all_end(client: &Client, claim: &str, batch: &str, midway: impl AsyncFnOnce()) {
    let jobs = csiaddons(client, "ReclaimSpaceJob", "workloads");
    let mut midway = Some(midway);
    for i in 0..JOBS {
        let job: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "ReclaimSpaceJob",
            "metadata": {"name": format!("{batch}-{i}"), "labels": {"batch": batch}},
            // All on one volume, so most collide with another in flight and retry (the driver
            // answers ABORTED); a two-minute deadline keeps the retries' tail short.
            "spec": {"target": {"persistentVolumeClaim": claim}, "retryDeadlineSeconds": 120}
        }))
        .unwrap();
        jobs.create(&PostParams::default(), &job).await.unwrap();
        if i == JOBS / 4
            && let Some(midway) = midway.take()
        {
            midway().await;
        }
    }
    let selector = ListParams::default().labels(&format!("batch={batch}"));
    // The last listing is kept: a batch that does not end says which jobs are open and where each
    // stands, so a failure names its cause.
    let mut open = Vec::new();
    let ended = poll::until(5 * poll::MINUTE, async || {
        let list = jobs.list(&selector).await.ok()?.items;
        let (ended, still): (Vec<_>, Vec<_>) =
            list.into_iter().partition(|j| j.data.pointer("/status/result").is_some());
        open = still;
        (ended.len() == JOBS).then_some(ended)
    })
    .await;
    let Some(ended) = ended else {
        let shown: Vec<String> = open
            .iter()
            .take(10)
            .map(|j| format!("{}: {}", j.metadata.name.as_deref().unwrap_or("?"), j.data["status"]))
            .collect();
        panic!("every one of the {JOBS} jobs ends; {} still open, first ones:\n{}", open.len(), shown.join("\n"));
    };
    for job in &ended {
        let status = &job.data["status"];
        match status["result"].as_str() {
            Some("Succeeded") => {}
            Some("Failed") => {
                assert!(status["message"].as_str().is_some_and(|m| !m.is_empty()), "a failed job says why: {status}")
            }
            other => panic!("unknown result {other:?}: {status}"),
        }
    }
}

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster"]
async fn deleting_the_manager_pod_mid_batch_loses_no_job() {
    let client = cluster::client().await;
    workload(&client, "batch").await;
    // The leader: the standby then takes over, and the Deployment replaces the deleted Pod.
    let first = cluster::ready_leading_manager(&client, MANAGER_NAMESPACE).await;
    batch_of_jobs_all_end(&client, "batch", "failover", async || {
        let pods: Api<Pod> = Api::namespaced(client.clone(), MANAGER_NAMESPACE);
        pods.delete(&first, &DeleteParams::default()).await.unwrap();
        let replaced = poll::until(cluster::POD_START, async || {
            let pods = cluster::running_pods(&client, MANAGER_NAMESPACE, MANAGER_SELECTOR).await;
            pods.into_iter().find(|p| cluster::ready(p) && cluster::name(p) != first)
        })
        .await;
        assert!(replaced.is_some(), "the Deployment replaces the deleted manager Pod {first}");
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster"]
async fn a_deleted_node_plugin_pod_comes_back_and_its_sidecar_connects_again() {
    let client = cluster::client().await;
    let before = cluster::running_pods(&client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
    let old = cluster::name(&before[0]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), DRIVER_NAMESPACE);
    pods.delete(&old, &DeleteParams::default()).await.unwrap();
    let new = poll::until(cluster::POD_START, async || {
        let pods = cluster::running_pods(&client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
        pods.into_iter().find(|p| cluster::ready(p) && cluster::name(p) != old).map(|p| cluster::name(&p))
    })
    .await
    .expect("the DaemonSet brings the node plugin back");
    let endpoint = format!("pod://{new}.{DRIVER_NAMESPACE}:9070");
    let connected =
        poll::until(poll::MINUTE, async || connected_nodes(&client).await.into_iter().find(|(_, e)| *e == endpoint))
            .await;
    assert!(connected.is_some(), "the new sidecar re-registers and is Connected at {endpoint}");
}
