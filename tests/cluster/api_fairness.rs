//! The API server shedding the manager's load: API Priority and Fairness puts the manager's
//! requests in a priority level of their own with the smallest share, no borrowing and no queue,
//! so what does not fit is answered 429 at once. Its Lease renewals keep to the leader-election
//! level (a leader that cannot renew hands over, which is the eviction row's subject). The manager
//! retries after the server's Retry-After, and counts each answer in `rest_client_requests_total`.
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::poll;

use crate::cluster::{self, MANAGER_NAMESPACE};
use crate::manager_pods::{SCRAPERS, pod_token, scrape};

const LEVEL: &str = "faults-manager-small-share";
const LEASES: &str = "faults-manager-leases";
const EVERYTHING_ELSE: &str = "faults-manager";
const READER: &str = "faults-metrics-reader";

fn manager_subject() -> serde_json::Value {
    json!([{"kind": "ServiceAccount",
            "serviceAccount": {"namespace": MANAGER_NAMESPACE, "name": "csi-addons-controller-manager"}}])
}

/// The level and the two FlowSchemas, applied.
async fn squeeze(client: &Client) {
    let apply = PatchParams::apply("faults-test").force();
    let level: PriorityLevelConfiguration = serde_json::from_value(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": LEVEL},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"}}}
    }))
    .unwrap();
    Api::<PriorityLevelConfiguration>::all(client.clone()).patch(LEVEL, &apply, &Patch::Apply(&level)).await.unwrap();
    let schemas: Api<FlowSchema> = Api::all(client.clone());
    // Lower precedence numbers match first: the Lease rule, then everything else of the manager.
    for (name, precedence, level, rules) in [
        (
            LEASES,
            400,
            "leader-election",
            json!([{"subjects": manager_subject(), "resourceRules": [{"verbs": ["*"],
                "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "namespaces": ["*"]}]}]),
        ),
        (
            EVERYTHING_ELSE,
            401,
            LEVEL,
            json!([{"subjects": manager_subject(), "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                "resources": ["*"], "namespaces": ["*"], "clusterScope": true}]}]),
        ),
    ] {
        let schema: FlowSchema = serde_json::from_value(json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": name},
            "spec": {"matchingPrecedence": precedence, "priorityLevelConfiguration": {"name": level},
                     "distinguisherMethod": {"type": "ByUser"}, "rules": rules}
        }))
        .unwrap();
        schemas.patch(name, &apply, &Patch::Apply(&schema)).await.unwrap();
    }
}

async fn release(client: &Client) {
    let schemas: Api<FlowSchema> = Api::all(client.clone());
    for name in [EVERYTHING_ELSE, LEASES] {
        let _ = schemas.delete(name, &DeleteParams::default()).await;
    }
    let _ = Api::<PriorityLevelConfiguration>::all(client.clone()).delete(LEVEL, &DeleteParams::default()).await;
}

/// The leading manager's `rest_client_requests_total` answered 429, summed over methods and hosts.
async fn throttled_requests(client: &Client, token: &str) -> u64 {
    let leader = cluster::ready_leading_manager(client, MANAGER_NAMESPACE).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), MANAGER_NAMESPACE);
    let ip = pods.get(&leader).await.unwrap().status.and_then(|s| s.pod_ip).expect("the manager Pod's IP");
    let body = poll::until(poll::MINUTE, async || scrape(&format!("https://{ip}:8443"), token).await.ok()).await;
    let body = body.expect("the leading manager serves its metrics to a metrics reader");
    body.lines()
        .filter(|l| l.starts_with("rest_client_requests_total{") && l.contains("code=\"429\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Jobs created while the manager's share is squeezed, so it has requests to make then whatever
/// is left of the batch (ours can finish a batch within a second of its first result): each fails
/// at its first attempt (no such claim), with a status write and an Event, and no driver call.
const PROBES: usize = 32;
const PROBE_LABEL: &str = "faults-shed-probe";

/// Squeezes the manager's share for `hold`, then lets go; asserts the API server answered some of
/// its requests 429 and the manager counted them. Prints how many.
pub async fn shed_manager_load(client: &Client, namespace: &str, hold: Duration) {
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": READER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "csi-addons-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": SCRAPERS}]
    }))
    .unwrap();
    bindings.patch(READER, &PatchParams::apply("faults-test").force(), &Patch::Apply(&binding)).await.unwrap();
    let token = pod_token(client, READER).await;
    let before = throttled_requests(client, &token).await;
    squeeze(client).await;
    // The API server takes up a new FlowSchema within a moment.
    let settle = Duration::from_secs(2);
    tokio::time::sleep(settle).await;
    let jobs = crate::driver_pods::csiaddons(client, "ReclaimSpaceJob", namespace);
    futures::future::join_all((0..PROBES).map(|i| {
        let job: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "ReclaimSpaceJob",
            "metadata": {"name": format!("shed-probe-{i}"), "labels": {PROBE_LABEL: "true"}},
            "spec": {"target": {"persistentVolumeClaim": format!("no-such-claim-{i}")}, "backOffLimit": 0}
        }))
        .unwrap();
        let jobs = jobs.clone();
        async move { jobs.create(&PostParams::default(), &job).await.unwrap() }
    }))
    .await;
    tokio::time::sleep(hold.saturating_sub(settle)).await;
    // Scraped after the release: the manager's check of the scraper's token is a request too.
    release(client).await;
    let during = throttled_requests(client, &token).await;
    let _ = bindings.delete(READER, &DeleteParams::default()).await;
    let probes = kube::api::ListParams::default().labels(PROBE_LABEL);
    let _ = jobs.delete_collection(&DeleteParams::default(), &probes).await;
    println!("API server shedding load: the manager counted {} requests answered 429", during.saturating_sub(before));
    assert!(
        during > before,
        "the API server answered some of the manager's requests 429, and the manager counted them"
    );
}
