//! The hostile custom resources of `make test` (testenv's cases) in the one-node cluster, where the
//! shipped manager Pods meet them with their own ServiceAccount: each is rejected at admission with
//! a message (a fence of every address by the shipped admission policy), or ends Failed with one;
//! meanwhile a manager Pod stays Ready and none restarts.
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::cluster::{self, MANAGER_NAMESPACE, MANAGER_SELECTOR};

const NAMESPACE: &str = "hostile";

async fn manager_pods(client: &Client) -> Vec<Pod> {
    cluster::running_pods(client, MANAGER_NAMESPACE, MANAGER_SELECTOR).await
}

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster"]
async fn hostile_crs_in_the_cluster_are_rejected_or_fail_and_the_manager_pods_stay_up() {
    let client = cluster::client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    namespaces.patch(NAMESPACE, &PatchParams::apply("hostile-test"), &Patch::Apply(&namespace)).await.unwrap();
    let before = cluster::container_restarts(&manager_pods(&client).await);
    let outcome = testenv::hostile::create_all(&client, NAMESPACE, async || {
        let pods = manager_pods(&client).await;
        if cluster::container_restarts(&pods) != before {
            return Err(format!(
                "a manager container restarted ({before} restarts before, {} now)",
                cluster::container_restarts(&pods)
            ));
        }
        if !pods.iter().any(cluster::ready) {
            return Err("no manager Pod is Ready".into());
        }
        Ok(())
    })
    .await;
    for line in &outcome.report {
        println!("{line}");
    }
    // The release YAMLs' admission policy refuses a fence of every address before any manager sees it.
    let everything = outcome.report.iter().find(|l| l.starts_with("fence of every address, not marked as meant:"));
    assert!(
        everything.is_some_and(|l| l.contains(": rejected (422)") && l.contains("csi-addons-network-fence-reach")),
        "{everything:?}"
    );
    testenv::hostile::delete_all(&client, NAMESPACE, &outcome).await;
    namespaces.delete(NAMESPACE, &DeleteParams::default()).await.unwrap();
}
