//! The Helm chart installs the same manager into a fresh namespace with the same result: Ready,
//! holding its Lease, metrics through its Service to a token bound to its metrics-reader role only.
//! The release-YAML manager is scaled to none meanwhile (two managers would both act on every
//! custom resource), and back to its two afterwards.
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::poll;

use crate::cluster::{self, MANAGER_NAMESPACE, MANAGER_SELECTOR};
use crate::manager_pods::{SCRAPERS, pod_token, scrape};

const RELEASE_NAMESPACE: &str = "csi-addons-helm";
const PREFIX: &str = "helm-csi-addons-";
/// The manager's replicas in deploy/controller/setup-controller.yaml: one leads, one stands by.
const RELEASE_YAML_REPLICAS: i32 = 2;

async fn scale_release_yaml_manager(client: &Client, replicas: i32) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), MANAGER_NAMESPACE);
    let patch = json!({"spec": {"replicas": replicas}});
    deployments.patch("csi-addons-controller-manager", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let settled = poll::until(cluster::POD_START, async || {
        let pods = cluster::running_pods(client, MANAGER_NAMESPACE, MANAGER_SELECTOR).await;
        let ready = pods.iter().filter(|p| cluster::ready(p)).count();
        (usize::try_from(replicas).ok() == Some(ready) && pods.len() == ready).then_some(())
    })
    .await;
    assert!(settled.is_some(), "the release-YAML manager runs {replicas} Pod(s)");
}

fn helm(args: &[&str]) -> String {
    let helm = std::env::var("HELM").expect("HELM names the helm binary (make test-cluster sets it)");
    let out = Command::new(helm).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm {args:?}: {text}");
    text
}

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster"]
async fn the_helm_chart_installs_a_manager_that_is_ready_leads_and_guards_its_metrics() {
    let client = cluster::client().await;
    scale_release_yaml_manager(&client, 0).await;
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/csi-addons");
    helm(&[
        "install",
        "csi-addons",
        chart,
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--set",
        &format!("namePrefix={PREFIX}"),
        "--wait",
        "--timeout",
        "3m",
    ]);

    cluster::ready_leading_manager(&client, RELEASE_NAMESPACE).await;

    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding = json!({
        "metadata": {"name": "test-helm-metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{PREFIX}metrics-reader")},
        "subjects": [{"kind": "ServiceAccount", "name": "helm-reader", "namespace": SCRAPERS}]
    });
    let _ = bindings.create(&PostParams::default(), &serde_json::from_value(binding).unwrap()).await;
    let reader = pod_token(&client, "helm-reader").await;
    let stranger = pod_token(&client, "helm-stranger").await;
    let services: Api<Service> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let service = services.get(&format!("{PREFIX}controller-manager-metrics-service")).await.unwrap();
    let url = format!("https://{}:8443", service.spec.and_then(|s| s.cluster_ip).unwrap());
    let body = poll::until(poll::MINUTE, async || scrape(&url, &reader).await.ok()).await;
    assert!(body.is_some_and(|b| b.contains("controller_runtime_reconcile_total")), "200 with the metrics");
    match scrape(&url, &stranger).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("a token without the chart's metrics-reader is refused with 403, not {other:?}"),
    }

    let _ = bindings.delete("test-helm-metrics-reader", &DeleteParams::default()).await;
    helm(&["uninstall", "csi-addons", "--namespace", RELEASE_NAMESPACE, "--wait"]);
    scale_release_yaml_manager(&client, RELEASE_YAML_REPLICAS).await;
}
