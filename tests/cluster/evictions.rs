//! Evictions through the Eviction API, as a node drain makes them: the leading manager Pod (the
//! PodDisruptionBudget lets one of the two go, the standby or the Deployment's replacement takes
//! the Lease over, the Deployment brings the second back) and the node plugin's Pod (its DaemonSet
//! brings it back).
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, EvictParams};
use testenv::poll;

use crate::cluster::{self, DRIVER_NAMESPACE, MANAGER_NAMESPACE, MANAGER_SELECTOR, NODE_PLUGIN_SELECTOR};

/// The names of the Ready manager Pods, once there are two.
async fn two_ready_managers(client: &Client) -> Vec<String> {
    let ready = poll::until(cluster::POD_START, async || {
        let pods = cluster::running_pods(client, MANAGER_NAMESPACE, MANAGER_SELECTOR).await;
        let ready: Vec<String> = pods.iter().filter(|p| cluster::ready(p)).map(cluster::name).collect();
        (ready.len() == 2).then_some(ready)
    })
    .await;
    ready.expect("the manager's Deployment runs two Ready Pods")
}

/// Evicts the leading manager; asserts the budget refuses to evict the standby as well while the
/// replacement is not yet Ready, that another manager takes the Lease, and that two managers run
/// again.
pub async fn evict_leading_manager(client: &Client) {
    let managers = two_ready_managers(client).await;
    let leader = cluster::ready_leading_manager(client, MANAGER_NAMESPACE).await;
    let standby = managers.iter().find(|m| **m != leader).cloned().expect("two managers: one leads");
    let pods: Api<Pod> = Api::namespaced(cluster::client_without_retries().await, MANAGER_NAMESPACE);
    let evicted = Instant::now();
    pods.evict(&leader, &EvictParams::default()).await.expect("the budget allows evicting one manager");
    match pods.evict(&standby, &EvictParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 429 => {
            println!("manager eviction: {leader} evicted; {standby} refused: {}", status.message)
        }
        other => panic!("the budget refuses a second manager eviction with 429, not {other:?}"),
    }
    // The evicted leader keeps the Lease until its calls in flight have ended, so the Deployment's
    // replacement may be up by then, and it competes as the standby does: either may take over.
    let took_over = poll::until(poll::MINUTE, async || {
        let holder = cluster::name(&cluster::leading_manager(client, MANAGER_NAMESPACE).await?);
        (holder != leader).then_some((holder, evicted.elapsed().as_secs_f64()))
    })
    .await;
    let (holder, seconds) =
        took_over.unwrap_or_else(|| panic!("another manager takes the Lease over from {leader} within a minute"));
    let which = if holder == standby { "the standby" } else { "the replacement" };
    println!("manager eviction: {which} {holder} leads {seconds:.1} s after the eviction");
    two_ready_managers(client).await;
}

/// Evicts the node plugin's Pod and waits for its DaemonSet's replacement to be Ready.
pub async fn evict_node_plugin(client: &Client) {
    let before = cluster::running_pods(client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
    let [old] = &before[..] else { panic!("one node plugin Pod runs, found {}", before.len()) };
    let old = cluster::name(old);
    let pods: Api<Pod> = Api::namespaced(client.clone(), DRIVER_NAMESPACE);
    pods.evict(&old, &EvictParams::default()).await.expect("the node plugin's Pod may be evicted");
    let replaced = poll::until(cluster::POD_START, async || {
        let pods = cluster::running_pods(client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
        pods.into_iter().find(|p| cluster::ready(p) && cluster::name(p) != old).map(|p| cluster::name(&p))
    })
    .await;
    let new = replaced.unwrap_or_else(|| panic!("the DaemonSet replaces the evicted node plugin {old}"));
    println!("node plugin eviction: {old} evicted, {new} Ready");
}
