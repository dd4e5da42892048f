//! OLM moves a running install to the next version: `operator-sdk run bundle-upgrade` with the bundle
//! `make bundle VERSION=<next>` builds from this tree (its CSV replaces this release's), while 200
//! ReclaimSpaceJobs run on the reference driver. The new CSV succeeds, the old one goes, every
//! custom resource keeps its status, and every job ends.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::Value;
use testenv::poll;

use crate::cluster::{self, MANAGER_NAMESPACE};
use crate::driver_pods::{connected_nodes, csiaddons, workload};
use crate::failover::batch_of_jobs_all_end;
use crate::olm::{csv_api, for_this_cluster, our_crds, run};

const RELEASED: &str = env!("CARGO_PKG_VERSION");

/// The status of every ReclaimSpaceJob and CSIAddonsNode, by kind and name.
async fn statuses(client: &Client) -> BTreeMap<String, Value> {
    let mut all = BTreeMap::new();
    for (kind, namespace) in [("ReclaimSpaceJob", "workloads"), ("CSIAddonsNode", cluster::DRIVER_NAMESPACE)] {
        for object in csiaddons(client, kind, namespace).list(&ListParams::default()).await.unwrap().items {
            let name = object.metadata.name.clone().unwrap_or_default();
            all.insert(format!("{kind}/{name}"), object.data["status"].clone());
        }
    }
    all
}

async fn csv_phase(client: &Client, name: &str) -> Option<String> {
    let csv = csv_api(client).get_opt(name).await.ok().flatten()?;
    csv.data.pointer("/status/phase").and_then(Value::as_str).map(str::to_owned)
}

#[tokio::test]
#[ignore = "needs the one-node cluster with OLM: make test-olm"]
async fn run_bundle_upgrade_moves_a_busy_install_to_the_next_version_and_keeps_everything() {
    let client = cluster::client().await;
    let next = std::env::var("NEXT_VERSION").expect("NEXT_VERSION (make test-olm sets it)");
    let (old_csv, new_csv) = (format!("csi-addons.v{RELEASED}"), format!("csi-addons.v{next}"));
    let install = format!(
        "operator-sdk run bundle ghcr.io/csi-addons-rs/csi-addons-bundle:v{RELEASED} --namespace {MANAGER_NAMESPACE}"
    );
    run(&format!("kubectl create namespace {MANAGER_NAMESPACE} --dry-run=client -o yaml | kubectl apply -f -"));
    println!("$ {install}\n{}", run(&for_this_cluster(&install)));
    let driver = concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/cluster-install.sh driver");
    run(driver);
    workload(&client, "upgrade").await;

    let mut kept = BTreeMap::new();
    batch_of_jobs_all_end(&client, "upgrade", "upgrade", async || {
        kept = statuses(&client).await;
        let upgrade = format!(
            "operator-sdk run bundle-upgrade ghcr.io/csi-addons-rs/csi-addons-bundle:v{next} --namespace {MANAGER_NAMESPACE}"
        );
        let line = for_this_cluster(&upgrade);
        let out = tokio::task::spawn_blocking(move || run(&line)).await.unwrap();
        println!("$ {upgrade}\n{out}");
    })
    .await;

    assert_eq!(csv_phase(&client, &new_csv).await.as_deref(), Some("Succeeded"), "the new CSV succeeds");
    let old_gone = poll::until(poll::MINUTE, async || csv_phase(&client, &old_csv).await.is_none().then_some(())).await;
    assert!(old_gone.is_some(), "the CSV {old_csv} is replaced and removed");
    let manager = cluster::ready_leading_manager(&client, MANAGER_NAMESPACE).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), MANAGER_NAMESPACE);
    let image = pods.get(&manager).await.unwrap().spec.unwrap().containers[0].image.clone().unwrap_or_default();
    assert!(image.ends_with(&format!(":v{next}")), "the manager runs the next version's image: {image}");
    assert_eq!(our_crds(&client).await.len(), 12, "the twelve CRDs stay");

    // What existed before the upgrade is still there with its status; what had ended stays ended.
    let after = statuses(&client).await;
    let mut changed = Vec::new();
    for (name, before) in &kept {
        let ended = before.get("result").is_some();
        match after.get(name) {
            None => changed.push(format!("{name}: gone")),
            Some(now) if ended && now != before => changed.push(format!("{name}: {before} → {now}")),
            Some(_) => {}
        }
    }
    assert!(changed.is_empty(), "custom resources changed by the upgrade: {changed:?}");
    // Each stored object still passes the new CRDs' validation as it is (a server-side dry run).
    for (kind, namespace) in [("ReclaimSpaceJob", "workloads"), ("CSIAddonsNode", cluster::DRIVER_NAMESPACE)] {
        let api = csiaddons(&client, kind, namespace);
        for object in api.list(&ListParams::default()).await.unwrap().items {
            let name = object.metadata.name.clone().unwrap_or_default();
            let params = PostParams { dry_run: true, ..PostParams::default() };
            let accepted = api.replace(&name, &params, &object).await;
            assert!(accepted.is_ok(), "{kind}/{name} under the new CRDs: {accepted:?}");
        }
    }
    let connected = poll::until(poll::MINUTE, async || (connected_nodes(&client).await.len() == 2).then_some(())).await;
    assert!(connected.is_some(), "both sidecars are Connected under the upgraded manager");
    println!(
        "{old_csv} → {new_csv} (Succeeded) with 200 jobs in flight; manager {manager} runs {image}; {} resources kept",
        kept.len()
    );
    println!("{}", run(&format!("operator-sdk cleanup csi-addons --namespace {MANAGER_NAMESPACE} --timeout 3m")));
}
