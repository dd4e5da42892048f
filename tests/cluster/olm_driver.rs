//! The driver operator the OperatorHub way: a CatalogSource holding both packages, and one
//! Subscription, to reference-driver-operator. OLM installs it and, from its bundle's dependency,
//! the csi-addons package too. One ReferenceCSIDriver then gives a driver whose sidecars the
//! manager reaches over verified TLS, and the story runs on it. Everything is removed afterwards,
//! so the suites after this one find the cluster as OLM left it.
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use testenv::poll;

use crate::cluster::{self, POD_START};
use crate::driver_operator::{self, STORAGE_CLASSES};
use crate::driver_pods::{STORAGE_CLASS, WORKLOADS};
use crate::olm::run;
use crate::olm_hub::{object, olm_api, serve_catalog};

/// The namespace OLM installs with its global OperatorGroup (every namespace watched).
const HUB_NAMESPACE: &str = "operators";
const CATALOG: &str = "csi-addons-drivers";
const PACKAGE: &str = "reference-driver-operator";
const RELEASED: &str = env!("CARGO_PKG_VERSION");

/// The phase of the CSV whose name starts with `package.v`, with its name.
async fn csv_of(client: &Client, package: &str) -> Option<(String, String)> {
    let csvs = olm_api(client, "ClusterServiceVersion", HUB_NAMESPACE).list(&ListParams::default()).await.ok()?;
    csvs.items.into_iter().find_map(|csv| {
        let name = csv.metadata.name.clone()?;
        let phase = csv.data.pointer("/status/phase")?.as_str()?.to_owned();
        name.starts_with(&format!("{package}.v")).then_some((name, phase))
    })
}

#[tokio::test]
#[ignore = "needs the one-node cluster with OLM: make test-olm"]
async fn one_subscription_brings_both_packages_and_one_object_gives_a_verified_driver() {
    let client = cluster::client().await;
    let next = std::env::var("NEXT_VERSION").expect("NEXT_VERSION (make test-olm sets it)");
    serve_catalog(&client, CATALOG, &next).await;

    // One Subscription, to the driver operator alone.
    let subscriptions = olm_api(&client, "Subscription", HUB_NAMESPACE);
    let subscription = json!({
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription",
        "metadata": {"name": PACKAGE},
        "spec": {"channel": "stable", "name": PACKAGE, "source": CATALOG, "sourceNamespace": "olm",
                 "installPlanApproval": "Automatic"}
    });
    subscriptions.create(&PostParams::default(), &object(subscription)).await.unwrap();
    let installed = poll::until(2 * POD_START, async || {
        let operator = csv_of(&client, PACKAGE).await.filter(|(_, phase)| phase == "Succeeded")?;
        let addons = csv_of(&client, "csi-addons").await.filter(|(_, phase)| phase == "Succeeded")?;
        Some((operator.0, addons.0))
    })
    .await;
    let (operator_csv, addons_csv) = installed.expect("OLM installs the driver operator and the csi-addons package");
    assert_eq!(operator_csv, format!("{PACKAGE}.v{RELEASED}"));
    let resolved = subscriptions.list(&ListParams::default()).await.unwrap().items;
    let by_olm: Vec<&str> =
        resolved.iter().filter_map(|s| s.data.pointer("/spec/name").and_then(Value::as_str)).collect();
    assert!(by_olm.contains(&"csi-addons"), "OLM subscribed to the dependency itself: {by_olm:?}");
    let manager = cluster::ready_leading_manager(&client, HUB_NAMESPACE).await;
    println!(
        "one Subscription: OLM installed {operator_csv} and, for its dependency, {addons_csv} (manager {manager})"
    );

    driver_operator::create(&client).await;
    println!("one ReferenceCSIDriver: {}", driver_operator::check_installed(&client, HUB_NAMESPACE).await);

    *STORAGE_CLASS.write().unwrap_or_else(std::sync::PoisonError::into_inner) = STORAGE_CLASSES[0];
    let steps = crate::story::tell(&client).await;
    println!("the story on the operator's driver: {} steps", steps.len());

    remove_everything(&client).await;
}

/// The story's workloads (their volumes deleted by the driver), the driver (the ReferenceCSIDriver
/// deleted: its removal), its StorageClasses, then both packages and the catalog.
async fn remove_everything(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(WORKLOADS, &DeleteParams::default()).await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let clean = poll::until(POD_START, async || {
        let left = namespaces.get_opt(WORKLOADS).await.ok()?.is_some()
            || !pvs.list(&ListParams::default()).await.ok()?.items.is_empty();
        (!left).then_some(())
    })
    .await;
    assert!(clean.is_some(), "the workloads and their volumes go while the driver runs");

    let drivers = driver_operator::drivers(client);
    drivers.delete(api::driver::DRIVER_NAME, &DeleteParams::default()).await.unwrap();
    let removed =
        poll::until(POD_START, async || drivers.get_opt(api::driver::DRIVER_NAME).await.ok()?.is_none().then_some(()))
            .await;
    assert!(removed.is_some(), "deleting the ReferenceCSIDriver removes the driver, then the object");
    let classes: Api<StorageClass> = Api::all(client.clone());
    for name in STORAGE_CLASSES {
        assert!(classes.get_opt(name).await.unwrap().is_some(), "the removal keeps StorageClass {name}");
        classes.delete(name, &DeleteParams::default()).await.unwrap();
    }

    for package in [PACKAGE, "csi-addons"] {
        println!("{}", run(&format!("operator-sdk cleanup {package} --namespace {HUB_NAMESPACE} --timeout 3m")));
    }
    let catalogs = olm_api(client, "CatalogSource", "olm");
    let _ = catalogs.delete(CATALOG, &DeleteParams::default()).await;
    let gone = poll::until(poll::MINUTE, async || catalogs.get_opt(CATALOG).await.ok()?.is_none().then_some(())).await;
    assert!(gone.is_some(), "the CatalogSource goes");
}
