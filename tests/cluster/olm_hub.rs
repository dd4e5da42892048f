//! The OperatorHub way: a CatalogSource of the file-based catalog hack/catalog.sh builds (one channel
//! holding this release and the next), and a Subscription with automatic approval starting at this
//! release. OLM installs this release, then upgrades to the next by itself.
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::{Value, json};
use testenv::poll;

use crate::cluster;
use crate::olm::run;

/// The namespace OLM installs with its global OperatorGroup (every namespace watched).
const HUB_NAMESPACE: &str = "operators";
const CATALOG: &str = "csi-addons-hub";
const RELEASED: &str = env!("CARGO_PKG_VERSION");

pub fn olm_api(client: &Client, kind: &str, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("operators.coreos.com", "v1alpha1", kind);
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}

pub fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a well-formed object")
}

/// A CatalogSource `name` in namespace olm serving hack/catalog.sh's catalog of tag v`next`, once
/// its Pod serves it; the CatalogSources.
pub async fn serve_catalog(client: &Client, name: &str, next: &str) -> Api<DynamicObject> {
    let catalogs = olm_api(client, "CatalogSource", "olm");
    let source = json!({
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "CatalogSource",
        "metadata": {"name": name},
        "spec": {"sourceType": "grpc", "image": format!("ghcr.io/csi-addons-rs/csi-addons-catalog:v{next}"),
                 "displayName": "CSI-Addons (this tree)", "grpcPodConfig": {"securityContextConfig": "restricted"}}
    });
    catalogs.create(&PostParams::default(), &object(source)).await.unwrap();
    let ready = poll::until(cluster::POD_START, async || {
        let source = catalogs.get(name).await.ok()?;
        (source.data.pointer("/status/connectionState/lastObservedState") == Some(&json!("READY"))).then_some(())
    })
    .await;
    assert!(ready.is_some(), "the catalog's Pod serves it");
    catalogs
}

#[tokio::test]
#[ignore = "needs the one-node cluster with OLM: make test-olm"]
async fn a_subscription_installs_this_release_and_olm_upgrades_it_to_the_next() {
    let client = cluster::client().await;
    let next = std::env::var("NEXT_VERSION").expect("NEXT_VERSION (make test-olm sets it)");
    let catalogs = serve_catalog(&client, CATALOG, &next).await;

    let subscriptions = olm_api(&client, "Subscription", HUB_NAMESPACE);
    let subscription = json!({
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription",
        "metadata": {"name": "csi-addons"},
        "spec": {"channel": "stable", "name": "csi-addons", "source": CATALOG, "sourceNamespace": "olm",
                 "installPlanApproval": "Automatic", "startingCSV": format!("csi-addons.v{RELEASED}")}
    });
    subscriptions.create(&PostParams::default(), &object(subscription)).await.unwrap();

    let csvs = olm_api(&client, "ClusterServiceVersion", HUB_NAMESPACE);
    let latest = format!("csi-addons.v{next}");
    let upgraded = poll::until(2 * cluster::POD_START, async || {
        let installed = subscriptions.get("csi-addons").await.ok()?.data.pointer("/status/installedCSV")?.clone();
        let phase = csvs.get(&latest).await.ok()?.data.pointer("/status/phase")?.clone();
        (installed == json!(latest) && phase == json!("Succeeded")).then_some(())
    })
    .await;
    assert!(upgraded.is_some(), "the Subscription ends at {latest}, Succeeded");

    // Two install plans, approved by OLM alone: the starting CSV, then the one replacing it.
    let plans = olm_api(&client, "InstallPlan", HUB_NAMESPACE).list(&ListParams::default()).await.unwrap().items;
    let mut planned: Vec<String> = plans
        .iter()
        .flat_map(|p| p.data["spec"]["clusterServiceVersionNames"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    planned.sort();
    assert_eq!(planned, vec![format!("csi-addons.v{RELEASED}"), latest.clone()], "{plans:?}");
    let old = format!("csi-addons.v{RELEASED}");
    let gone = poll::until(poll::MINUTE, async || csvs.get_opt(&old).await.ok()?.is_none().then_some(())).await;
    assert!(gone.is_some(), "{old} is replaced and removed");
    let manager = cluster::ready_leading_manager(&client, HUB_NAMESPACE).await;
    println!("Subscription from {old}: OLM installed it, then upgraded to {latest} (Succeeded); manager {manager}");

    // cleanup removes the Subscription, the CSV, the CRDs and the CatalogSource it was installed from.
    println!("{}", run(&format!("operator-sdk cleanup csi-addons --namespace {HUB_NAMESPACE} --timeout 3m")));
    let gone = poll::until(poll::MINUTE, async || catalogs.get_opt(CATALOG).await.ok()?.is_none().then_some(())).await;
    assert!(gone.is_some(), "operator-sdk cleanup removes the CatalogSource too");
}
