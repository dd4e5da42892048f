//! The cluster manifests under deploy/ are valid: every object passes a server-side dry-run create
//! on the real API server, with our CRDs installed.
use std::path::PathBuf;

use kube::api::{DynamicObject, GroupVersionKind};
use serde::Deserialize;

fn documents(dir: &str) -> Vec<(String, DynamicObject)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let kustomization: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap()).unwrap();
    let mut out = Vec::new();
    for file in kustomization["resources"].as_sequence().unwrap() {
        let file = file.as_str().unwrap();
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let object = DynamicObject::deserialize(document).unwrap();
            out.push((file.to_owned(), object));
        }
    }
    out
}

#[tokio::test]
async fn reference_driver_manifests_pass_a_server_side_dry_run() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "deploy").await.unwrap();
    let objects = documents("deploy/reference-driver");
    let kinds: Vec<String> = objects.iter().map(|(_, o)| o.types.as_ref().unwrap().kind.clone()).collect();
    for wanted in
        ["CSIDriver", "StatefulSet", "DaemonSet", "StorageClass", "VolumeReplicationClass", "NetworkFenceClass"]
    {
        assert!(kinds.iter().any(|k| k == wanted), "no {wanted} in deploy/reference-driver");
    }
    for (file, object) in objects {
        let kind = object.types.as_ref().unwrap().kind.clone();
        let created = strict_dry_run(&client, &ns, object.clone()).await;
        assert!(created.is_ok(), "{file}: {kind} {:?} rejected: {created:?}", object.metadata.name);
    }
    // The check bites: a misspelt field is an error under strict validation, not a warning.
    let mut typo = documents("deploy/reference-driver")
        .into_iter()
        .find(|(_, o)| o.types.as_ref().unwrap().kind == "StorageClass")
        .unwrap()
        .1;
    typo.data["allowVolumeExpanson"] = serde_json::json!(true);
    let rejected = strict_dry_run(&client, &ns, typo).await;
    assert!(
        matches!(&rejected, Err(kube::Error::Api(s)) if s.message.contains("unknown field \"allowVolumeExpanson\"")),
        "{rejected:?}"
    );
}

/// The driver operator's release YAML (rendered from driver-operator/config/, drift-checked by
/// the packaging suite) passes a strict dry run, its CRD aside (installed already).
#[tokio::test]
async fn the_driver_operators_release_yaml_passes_a_server_side_dry_run() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "deploy-operator").await.unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/driver-operator/driver-operator.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut kinds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let object = DynamicObject::deserialize(document).unwrap();
        let kind = object.types.as_ref().unwrap().kind.clone();
        kinds.push(kind.clone());
        if kind == "CustomResourceDefinition" {
            continue;
        }
        let created = strict_dry_run(&client, &ns, object.clone()).await;
        assert!(created.is_ok(), "{kind} {:?} rejected: {created:?}", object.metadata.name);
    }
    for wanted in ["CustomResourceDefinition", "ClusterRole", "Deployment", "Namespace"] {
        assert!(kinds.iter().any(|k| k == wanted), "no {wanted}: {kinds:?}");
    }
}

/// The driver's manifests run this release's images, as deploy/controller/ does: `latest` would run
/// whatever was pushed last, mixing versions in one cluster.
#[test]
fn reference_driver_manifests_pin_this_releases_images() {
    let tag = format!("v{}", env!("CARGO_PKG_VERSION"));
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/reference-driver");
    let mut ours = 0;
    for file in ["controller.yaml", "node.yaml", "certificates.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for image in text.lines().filter_map(|l| l.trim().strip_prefix("image: ghcr.io/csi-addons-rs/")) {
            assert!(image.ends_with(&format!(":{tag}")), "{file}: {image} is not tagged {tag}");
            ours += 1;
        }
    }
    assert_eq!(ours, 7, "the driver (three containers), its two sidecars, and the certificates Job and CronJob");
}

/// POSTs `object` with `dryRun=All&fieldValidation=Strict` (namespaced objects into `ns`).
async fn strict_dry_run(client: &kube::Client, ns: &str, mut object: DynamicObject) -> Result<String, kube::Error> {
    let given = object.metadata.namespace.replace(ns.to_owned());
    let (collection, namespaced) = collection_path(client, &object, ns).await?;
    if !namespaced {
        object.metadata.namespace = given;
    }
    let request = http::Request::post(format!("{collection}?dryRun=All&fieldValidation=Strict"))
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&object).unwrap())
        .unwrap();
    client.request_text(request).await
}

/// The API path of `object`'s collection (in its namespace, else `ns`, when namespaced) and
/// whether the kind is namespaced.
pub async fn collection_path(
    client: &kube::Client,
    object: &DynamicObject,
    ns: &str,
) -> Result<(String, bool), kube::Error> {
    let types = object.types.clone().unwrap();
    let (group, version) = types.api_version.split_once('/').unwrap_or(("", &types.api_version));
    let gvk = GroupVersionKind::gvk(group, version, &types.kind);
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk).await?;
    let mut path = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    let namespaced = capabilities.scope == kube::discovery::Scope::Namespaced;
    if namespaced {
        path.push_str(&format!("/namespaces/{}", object.metadata.namespace.as_deref().unwrap_or(ns)));
    }
    path.push_str(&format!("/{}", resource.plural));
    Ok((path, namespaced))
}
