//! Reaching the one-node cluster: its admin kubeconfig (CLUSTER_KUBECONFIG, set by
//! `make test-cluster`) and what the installs put where.
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use testenv::poll;

pub const MANAGER_NAMESPACE: &str = "csi-addons-system";
pub const DRIVER_NAMESPACE: &str = "csi-addons-reference";
/// Where the reference driver keeps its state and volumes on the node (a hostPath in its manifests,
/// and the driver operator's default): a filesystem of its own, which `hack/cluster.sh` mounts.
pub const DRIVER_STATE_DIR: &str = "/var/lib/csi-addons-reference";
pub const MANAGER_SELECTOR: &str = "app.kubernetes.io/name=csi-addons,control-plane=controller-manager";
pub const NODE_PLUGIN_SELECTOR: &str = "app.kubernetes.io/name=reference-driver,app.kubernetes.io/component=node";
pub const CONTROLLER_PLUGIN_SELECTOR: &str =
    "app.kubernetes.io/name=reference-driver,app.kubernetes.io/component=controller";
/// The manager's leader-election Lease, as upstream names it.
pub const MANAGER_LEASE: &str = "e8cd140a.openshift.io";
/// What a workload's Pod and its volume take, at most, on this node.
pub const POD_START: Duration = Duration::from_secs(180);

pub async fn client() -> Client {
    Client::try_from(config().await).unwrap()
}

/// A client that takes each answer as it comes: kube's own retries 429 until the server relents,
/// which would hide a PodDisruptionBudget's refusal.
pub async fn client_without_retries() -> Client {
    let mut config = config().await;
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

async fn config() -> Config {
    let path = std::env::var("CLUSTER_KUBECONFIG")
        .expect("CLUSTER_KUBECONFIG is unset: run these with `make test-cluster`, which starts the cluster");
    let kubeconfig = Kubeconfig::read_from(&path).expect("the cluster's kubeconfig");
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap()
}

/// The running Pods `selector` picks in `namespace`.
pub async fn running_pods(client: &Client, namespace: &str, selector: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods.list(&ListParams::default().labels(selector)).await.unwrap();
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

/// Whether every container of `pod` is ready (the kubelet's probes passed).
pub fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Runs `hack/SCRIPT ARGS...` (`cluster.sh`, `cluster-install.sh`) from inside the cluster's network
/// namespace (where the tests run) and asserts that it succeeds. Blocks: call it from a blocking
/// thread.
pub fn hack_script(script: &str, args: &[&str]) {
    let path = format!("{}/../hack/{script}", env!("CARGO_MANIFEST_DIR"));
    let status = std::process::Command::new(path).args(args).status().unwrap();
    assert!(status.success(), "hack/{script} {}", args.join(" "));
}

/// The log of one container of a Pod, once the kubelet serves it (a kubelet that has just started
/// again answers with an error for a while; an empty log would read as "no calls"). Empty if it is
/// not served within a minute.
pub async fn logs(client: &Client, namespace: &str, pod: &str, container: &str) -> String {
    served_logs(client, namespace, pod, LogParams { container: Some(container.into()), ..LogParams::default() }).await
}

/// The log of `container`'s previous run in `pod`, as [`logs`] (empty when it has none).
pub async fn previous_logs(client: &Client, namespace: &str, pod: &str, container: &str) -> String {
    let params = LogParams { container: Some(container.into()), previous: true, ..LogParams::default() };
    served_logs(client, namespace, pod, params).await
}

async fn served_logs(client: &Client, namespace: &str, pod: &str, params: LogParams) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    poll::until(poll::MINUTE, async || pods.logs(pod, &params).await.ok()).await.unwrap_or_default()
}

/// Waits for a manager Pod in `namespace` to become Ready through the kubelet's probes and to hold
/// the Lease (of two replicas, the other stands by); its name.
pub async fn ready_leading_manager(client: &Client, namespace: &str) -> String {
    let leader = poll::until(POD_START, async || leading_manager(client, namespace).await.filter(ready)).await;
    let leader = leader.unwrap_or_else(|| {
        panic!("a manager Pod in {namespace} becomes Ready through its probes and holds the Lease {MANAGER_LEASE}")
    });
    name(&leader)
}

/// The running manager Pod that holds the Lease in `namespace`, if one does.
pub async fn leading_manager(client: &Client, namespace: &str) -> Option<Pod> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let holder = leases.get_opt(MANAGER_LEASE).await.ok().flatten()?.spec?.holder_identity?;
    let pods = running_pods(client, namespace, MANAGER_SELECTOR).await;
    // The holder identity is the Pod name, "_" and a random part.
    pods.into_iter().find(|pod| holder.starts_with(&format!("{}_", name(pod))))
}

/// The restarts of the containers of `pods`, summed.
pub fn container_restarts(pods: &[Pod]) -> i32 {
    pods.iter()
        .flat_map(|p| p.status.iter().flat_map(|s| s.container_statuses.iter().flatten()))
        .map(|c| c.restart_count)
        .sum()
}

pub fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}
