//! The Helm chart renders what config/default does (and config/prometheus, when enabled), and its
//! output passes a strict server-side dry-run apply.
use std::process::Command;

use kube::api::DynamicObject;

use crate::harness::support::test_peer;
use crate::packaging::config::{NAMESPACE, dry_apply_all, kind, kustomize, objects, packaging_cluster, rendered, root};

/// `helm template csi-addons charts/csi-addons --namespace csi-addons-system --include-crds ARGS`.
fn helm_template(args: &[&str]) -> Vec<DynamicObject> {
    let out = Command::new(test_peer("HELM", "helm.sh"))
        .args(["template", "csi-addons"])
        .arg(root().join("charts/csi-addons"))
        .args(["--namespace", NAMESPACE, "--include-crds"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    // Helm separates each CRD file's own `---` from its `# Source:` comment: skip the empty documents.
    objects(&String::from_utf8(out.stdout).unwrap()).into_iter().filter(|o| o.types.is_some()).collect()
}

/// An object as JSON without the labels Helm adds for its own bookkeeping, keyed for sorting.
fn comparable(object: &DynamicObject) -> (String, serde_json::Value) {
    let mut value = serde_json::to_value(object).unwrap();
    // (Indexing a missing key mutably would insert a null: go through the map.)
    let metadata = value.get_mut("metadata").and_then(|m| m.as_object_mut()).unwrap();
    if let Some(labels) = metadata.get_mut("labels").and_then(|l| l.as_object_mut()) {
        labels.remove("helm.sh/chart");
        labels.remove("app.kubernetes.io/managed-by");
        if labels.is_empty() {
            metadata.remove("labels");
        }
    }
    (format!("{} {}", kind(object), object.metadata.name.as_deref().unwrap_or_default()), value)
}

fn sorted(objects: &[DynamicObject]) -> Vec<(String, serde_json::Value)> {
    let mut all: Vec<_> = objects.iter().map(comparable).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

fn assert_same(helm: &[DynamicObject], kustomize: &[DynamicObject]) {
    let (helm, kustomize) = (sorted(helm), sorted(kustomize));
    let names = |all: &[(String, serde_json::Value)]| all.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(names(&helm), names(&kustomize));
    for ((what, ours), (_, theirs)) in helm.iter().zip(&kustomize) {
        assert!(ours == theirs, "{what} differs:\nhelm: {ours:#}\nkustomize: {theirs:#}");
    }
}

#[test]
fn the_chart_is_released_with_the_workspace() {
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root().join("charts/csi-addons/Chart.yaml")).unwrap()).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"].as_str(), Some(version));
    assert_eq!(chart["appVersion"].as_str(), Some(format!("v{version}").as_str()));
}

#[tokio::test]
async fn the_chart_renders_what_kustomize_does_and_the_api_server_accepts_it() {
    // Helm does not own its release's Namespace (`helm install --create-namespace` makes it).
    let kustomized: Vec<DynamicObject> = rendered().into_iter().filter(|o| kind(o) != "Namespace").collect();
    let helm = helm_template(&[]);
    crate::packaging::config::assert_references_resolve("helm template", &helm);
    assert_same(&helm, &kustomized);

    // With monitoring on: config/prometheus with config/default's prefix and namespace on top.
    let monitoring = ["--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true"];
    let helm = helm_template(&monitoring);
    let mut expected = kustomized;
    for mut object in objects(&kustomize("prometheus")) {
        object.metadata.name = object.metadata.name.map(|n| format!("csi-addons-{n}"));
        object.metadata.namespace = Some(NAMESPACE.to_owned());
        expected.push(object);
    }
    assert_same(&helm, &expected);

    let client = packaging_cluster().await;
    dry_apply_all(&client, helm).await;
}
