//! OLM installs the bundle the way the README says: its "Installing in a cluster" commands are read
//! from README.md and run word for word, apart from this cluster's registry and its opm image as the
//! index image; the registry's certificate is trusted through SSL_CERT_FILE. The CSV reaches Succeeded, the manager is Ready and leads, the CSV owns
//! the twelve CRDs, and every `alm-examples` object is accepted; `operator-sdk cleanup` then removes
//! what OLM installed. `make test-olm` runs these on a cluster with OLM (hack/olm.sh).
use std::collections::BTreeSet;
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::{self, Scope};
use serde_json::Value;
use testenv::poll;

use crate::cluster::{self, MANAGER_NAMESPACE};

const PACKAGE: &str = "csi-addons";
const CSV: &str = "csi-addons.v0.1.0";
const GROUPS: [&str; 2] = ["csiaddons.openshift.io", "replication.storage.openshift.io"];
/// The opm image hack/olm.sh builds, named as the cluster's containerd and operator-sdk reach it.
const INDEX_IMAGE: &str = "quay.io/operator-framework/opm:v1.55.0";

/// The commands of one install path of the README ("OLM", "Helm" or "Plain YAML"), as
/// hack/readme-commands.sh reads them.
pub fn readme_commands(path: &str) -> Vec<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/readme-commands.sh");
    let out = Command::new("bash").arg(script).arg(path).output().expect("bash runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// Runs one command line with `sh`, operator-sdk on PATH and the cluster's CA trusted (its registry's
/// certificate is the CA's); its output, or a panic naming it.
pub fn run(line: &str) -> String {
    let sdk = std::env::var("OPERATOR_SDK_DIR").expect("OPERATOR_SDK_DIR (make test-olm sets it)");
    let ca = std::env::var("CLUSTER_CA_FILE").expect("CLUSTER_CA_FILE (hack/cluster.sh exec sets it)");
    let path = format!("{sdk}:{}", std::env::var("PATH").unwrap_or_default());
    let out =
        Command::new("sh").arg("-c").arg(line).env("PATH", path).env("SSL_CERT_FILE", ca).output().expect("sh runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "`{line}` failed:\n{text}");
    text
}

/// The README's `operator-sdk run bundle` (or `run bundle-upgrade`) line as this cluster needs it:
/// images from its registry, and its opm image as the index.
pub fn for_this_cluster(line: &str) -> String {
    if !line.starts_with("operator-sdk run bundle") {
        return line.to_owned();
    }
    let registry = std::env::var("CLUSTER_REGISTRY").expect("CLUSTER_REGISTRY (hack/cluster.sh exec sets it)");
    let line = line.replace("ghcr.io/", &format!("{registry}/ghcr.io/"));
    // `run bundle-upgrade` keeps the index the install was made from.
    if line.starts_with("operator-sdk run bundle ") {
        format!("{line} --index-image {registry}/{INDEX_IMAGE}")
    } else {
        line
    }
}

pub fn csv_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("operators.coreos.com", "v1alpha1", "ClusterServiceVersion");
    Api::namespaced_with(client.clone(), MANAGER_NAMESPACE, &kube::api::ApiResource::from_gvk(&gvk))
}

pub async fn our_crds(client: &Client) -> Vec<CustomResourceDefinition> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let list = crds.list(&ListParams::default()).await.unwrap().items;
    list.into_iter().filter(|c| GROUPS.contains(&c.spec.group.as_str())).collect()
}

/// The API of one `alm-examples` object's kind, in its namespace.
async fn example_api(client: &Client, example: &DynamicObject) -> Result<Api<DynamicObject>, kube::Error> {
    let types = example.types.clone().expect("an example names its apiVersion and kind");
    let gvk = GroupVersionKind::try_from(&types).expect("apiVersion is group/version");
    let (resource, caps) = discovery::pinned_kind(client, &gvk).await?;
    Ok(match caps.scope {
        Scope::Namespaced => {
            let namespace = example.metadata.namespace.as_deref().unwrap_or("default");
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    })
}

/// Server-side applies one `alm-examples` object, as `kubectl apply --server-side` would.
async fn apply_example(client: &Client, example: &DynamicObject) -> Result<(), kube::Error> {
    let name = example.metadata.name.clone().expect("an example has a name");
    let api = example_api(client, example).await?;
    api.patch(&name, &PatchParams::apply("olm-examples-test"), &Patch::Apply(example)).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs the one-node cluster with OLM: make test-olm"]
async fn operator_sdk_run_bundle_installs_it_as_the_readme_says_and_cleanup_removes_it() {
    let client = cluster::client().await;
    let commands = readme_commands("OLM");
    assert!(commands.iter().any(|c| c.starts_with("operator-sdk run bundle")), "{commands:?}");
    for line in &commands {
        let line = for_this_cluster(line);
        println!("$ {line}\n{}", run(&line));
    }

    let csvs = csv_api(&client);
    let csv = csvs.get(CSV).await.expect("run bundle made the CSV");
    let phase = csv.data.pointer("/status/phase").and_then(Value::as_str);
    assert_eq!(phase, Some("Succeeded"), "{:?}", csv.data.get("status"));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), MANAGER_NAMESPACE);
    let available = poll::until(cluster::POD_START, async || {
        let deployment = deployments.get("csi-addons-controller-manager").await.ok()?;
        (deployment.status?.available_replicas? == 2).then_some(())
    })
    .await;
    assert!(available.is_some(), "the CSV's Deployment has both managers available: one leads, one stands by");
    let manager = cluster::ready_leading_manager(&client, MANAGER_NAMESPACE).await;
    println!("CSV {CSV}: Succeeded; manager {manager} Ready and holding its Lease");
    // operator-sdk's catalog Pod does not meet Pod Security `restricted` (its init container sets
    // nothing), so the namespace cannot enforce it during `run bundle`; the manager's Pod does meet it.
    let verdict = run(&format!(
        "kubectl label --dry-run=server --overwrite namespace {MANAGER_NAMESPACE} pod-security.kubernetes.io/enforce=restricted 2>&1"
    ));
    assert!(!verdict.contains(&manager), "the manager's Pod meets Pod Security restricted: {verdict}");
    println!("Pod Security restricted, tried on the namespace: {}", verdict.trim());

    // The CSV owns the twelve CRDs, and OLM installed each of them for it.
    let owned: BTreeSet<String> = csv.data["spec"]["customresourcedefinitions"]["owned"]
        .as_array()
        .expect("owned CRDs")
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    let installed: BTreeSet<String> = our_crds(&client).await.into_iter().filter_map(|c| c.metadata.name).collect();
    assert_eq!(owned.len(), 12, "{owned:?}");
    assert_eq!(owned, installed, "the CSV owns exactly the CRDs in the cluster");
    for crd in our_crds(&client).await {
        let labels = crd.metadata.labels.unwrap_or_default();
        assert!(labels.contains_key(&format!("operators.coreos.com/{PACKAGE}.{MANAGER_NAMESPACE}")), "{labels:?}");
    }

    // Every example the CSV shows users is accepted by the API server as OLM installed it.
    let annotations = csv.metadata.annotations.clone().unwrap_or_default();
    let examples: Vec<DynamicObject> = serde_json::from_str(&annotations["alm-examples"]).unwrap();
    assert_eq!(examples.len(), 12);
    for example in &examples {
        let refused = apply_example(&client, example).await.err();
        assert!(refused.is_none(), "{:?} {:?}: {refused:?}", example.types, example.metadata.name);
    }
    println!("{} alm-examples objects applied and accepted", examples.len());
    // They go before the operator does: the manager releases what it holds them by.
    for example in &examples {
        let api = example_api(&client, example).await.unwrap();
        api.delete(example.metadata.name.as_deref().unwrap(), &DeleteParams::default()).await.unwrap();
    }
    let mut left = Vec::new();
    for example in &examples {
        let api = example_api(&client, example).await.unwrap();
        let name = example.metadata.name.clone().unwrap();
        let gone =
            poll::until(poll::MINUTE, async || api.get_opt(&name).await.ok().flatten().is_none().then_some(())).await;
        if gone.is_none() {
            left.push(format!("{:?}/{name}", example.types.as_ref().map(|t| &t.kind)));
        }
    }
    assert!(left.is_empty(), "examples still there a minute after their deletion: {left:?}");

    println!("{}", run(&format!("operator-sdk cleanup {PACKAGE} --namespace {MANAGER_NAMESPACE} --timeout 3m")));
    let gone = poll::until(cluster::POD_START, async || {
        let csv_left = csvs.get_opt(CSV).await.ok().flatten().is_some();
        let deployment_left = deployments.get_opt("csi-addons-controller-manager").await.ok().flatten().is_some();
        let crds_left = !our_crds(&client).await.is_empty();
        (!csv_left && !deployment_left && !crds_left).then_some(())
    })
    .await;
    assert!(gone.is_some(), "operator-sdk cleanup removes the CSV, its Deployment and the CRDs");

    // The bundle's ClusterRoles stay behind (the README says so; its namespaced objects go with the
    // CSV, by garbage collection): what is left is listed, then deleted.
    let extras = format!(
        "clusterrole/csi-addons-csiaddons-events-editor-role clusterrole/csi-addons-csiaddons-pvc-editor-role \
         clusterrole/csi-addons-metrics-reader -n {MANAGER_NAMESPACE} networkpolicy/csi-addons-allow-metrics-traffic \
         service/csi-addons-controller-manager-metrics-service poddisruptionbudget/csi-addons-controller-manager"
    );
    let left = run(&format!("kubectl get --ignore-not-found -o name {extras}"));
    println!("left by operator-sdk cleanup: {}", left.split_whitespace().collect::<Vec<_>>().join(", "));
    run(&format!("kubectl delete --ignore-not-found --wait {extras}"));
    assert_eq!(run(&format!("kubectl get --ignore-not-found -o name {extras}")).trim(), "");
}
