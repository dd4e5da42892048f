//! An upgrade must not break what users stored. The CRDs and samples of every release are frozen in
//! config/released/<version>/ (`make freeze-release`); against each, the current CRDs must keep every
//! served version and every field, require nothing new inside objects that already exist, narrow no
//! enum and change no type, and each frozen sample must pass a server-side dry run on the real API
//! server with the current CRDs installed.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kube::api::{DynamicObject, PostParams};
use serde_json::Value;

use crate::harness::support::{dynamic_api, is_namespaced};

/// One schema node, as far as compatibility goes.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    kind: String,
    required: bool,
    /// Has a `default`: the API server fills it in before it validates, and in every stored object
    /// it reads, so requiring it binds nothing stored.
    defaulted: bool,
    allowed: Option<Vec<Value>>,
    /// `x-kubernetes-preserve-unknown-fields`: anything under it is accepted.
    open: bool,
}

fn walk(schema: &Value, path: &str, required: bool, out: &mut BTreeMap<String, Node>) {
    out.insert(
        path.to_owned(),
        Node {
            kind: schema["type"].as_str().unwrap_or_default().to_owned(),
            required,
            defaulted: schema.get("default").is_some(),
            allowed: schema["enum"].as_array().cloned(),
            open: schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true),
        },
    );
    let names: Vec<&str> = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for (name, child) in schema["properties"].as_object().into_iter().flatten() {
        walk(child, &format!("{path}.{name}"), names.contains(&name.as_str()), out);
    }
    if let Some(items) = schema.get("items") {
        walk(items, &format!("{path}[]"), false, out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        walk(values, &format!("{path}{{}}"), false, out);
    }
}

/// A released schema with the values its stored objects can really hold where the schema did not
/// spell them out: a `metav1.Condition`'s status is True, False or Unknown. That is the Kubernetes
/// API's definition of the type; a kind's status is written only through its status subresource,
/// which no role this project ships grants but the manager's; and every release's manager sets
/// conditions through runtime-support's `condition`, which writes only those three. So no stored
/// condition holds another value, and a schema that now lists the three narrows nothing stored,
/// while one that lists fewer does.
fn as_stored(schema: &Value) -> Value {
    let mut schema = schema.clone();
    api::crds::for_each_object(&mut schema, &mut |map| {
        let condition = api::crds::is_condition(map);
        if let Some(status) = map.get_mut("properties").and_then(|p| p.get_mut("status")).and_then(Value::as_object_mut)
            && condition
        {
            status.entry("enum").or_insert_with(|| serde_json::json!(["True", "False", "Unknown"]));
        }
    });
    schema
}

fn parent(path: &str) -> &str {
    path.rfind(['.', '[', '{']).map_or("", |i| &path[..i])
}

/// Every way `new` (a CRD) breaks objects valid under `old`, in words.
fn breaking_changes(old: &Value, new: &Value) -> Vec<String> {
    let kind = old["spec"]["names"]["kind"].as_str().unwrap_or_default();
    let served = |crd: &Value| -> BTreeMap<String, Value> {
        crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["served"] == Value::Bool(true))
            .map(|v| (v["name"].as_str().unwrap_or_default().to_owned(), v["schema"]["openAPIV3Schema"].clone()))
            .collect()
    };
    let (before, after) = (served(old), served(new));
    let mut found = Vec::new();
    for (version, old_schema) in &before {
        let Some(new_schema) = after.get(version) else {
            found.push(format!("{kind} {version}: no longer served"));
            continue;
        };
        let (mut was, mut is) = (BTreeMap::new(), BTreeMap::new());
        walk(&as_stored(old_schema), "", false, &mut was);
        walk(new_schema, "", false, &mut is);
        for (path, node) in &was {
            match is.get(path) {
                None if !is.get(parent(path)).is_some_and(|p| p.open) => {
                    found.push(format!("{kind} {version} {path}: removed"))
                }
                None => {}
                Some(now) => {
                    if now.kind != node.kind {
                        found.push(format!("{kind} {version} {path}: type {} became {}", node.kind, now.kind));
                    }
                    if let Some(allowed) = &now.allowed {
                        let lost: Vec<&Value> =
                            node.allowed.iter().flatten().filter(|v| !allowed.contains(v)).collect();
                        if node.allowed.is_none() || !lost.is_empty() {
                            found.push(format!("{kind} {version} {path}: enum narrowed (no longer allows {lost:?})"));
                        }
                    }
                }
            }
        }
        for (path, node) in &is {
            let newly = node.required && !node.defaulted && !was.get(path).is_some_and(|n| n.required);
            // A required field inside an object that did not exist before binds no stored object.
            if newly && !path.is_empty() && was.contains_key(parent(path)) {
                found.push(format!("{kind} {version} {path}: newly required"));
            }
        }
    }
    found
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml_files(dir: &Path) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if file.ends_with(".yaml") && file != "kustomization.yaml" {
            out.push((file, serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The frozen releases: config/released/<version>/ with `crds/` and `samples/`.
fn releases() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("config/released"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn current_crds() -> BTreeMap<String, Value> {
    yaml_files(&root().join("config/crd/bases"))
        .into_iter()
        .map(|(_, crd)| (crd["metadata"]["name"].as_str().unwrap().to_owned(), crd))
        .collect()
}

#[test]
fn the_current_crds_break_nothing_a_released_version_stored() {
    let releases = releases();
    assert!(!releases.is_empty(), "config/released holds at least this release");
    let current = current_crds();
    for release in releases {
        let frozen = yaml_files(&release.join("crds"));
        assert_eq!(frozen.len(), 12, "{}", release.display());
        for (file, old) in frozen {
            let name = old["metadata"]["name"].as_str().unwrap();
            let new = current.get(name).unwrap_or_else(|| panic!("{}: CRD {name} removed", release.display()));
            let broken = breaking_changes(&old, new);
            assert!(broken.is_empty(), "{}/{file}: {broken:#?}", release.display());
        }
    }
}

/// The check bites: each kind of break in a copy of a current CRD is found, and nothing else.
#[test]
fn each_kind_of_break_is_found() {
    let current = current_crds();
    let old = &current["reclaimspacejobs.csiaddons.openshift.io"];
    assert_eq!(breaking_changes(old, old), Vec::<String>::new());
    let schema = "/spec/versions/0/schema/openAPIV3Schema/properties";
    let mut cases: Vec<(&str, Value)> = Vec::new();

    let mut removed = old.clone();
    removed.pointer_mut(&format!("{schema}/spec/properties")).unwrap().as_object_mut().unwrap().remove("backOffLimit");
    cases.push((".spec.backOffLimit: removed", removed));

    let mut required = old.clone();
    let spec = required.pointer_mut(&format!("{schema}/spec")).unwrap();
    spec["required"].as_array_mut().unwrap().push("timeout".into());
    cases.push((".spec.timeout: newly required", required));

    // Requiring a field that has a default binds nothing: the API server defaults it first.
    let mut defaulted = old.clone();
    let spec = defaulted.pointer_mut(&format!("{schema}/spec")).unwrap();
    assert!(spec["properties"]["backOffLimit"].get("default").is_some(), "backOffLimit has a default");
    spec["required"].as_array_mut().unwrap().push("backOffLimit".into());
    assert_eq!(breaking_changes(old, &defaulted), Vec::<String>::new(), "a defaulted field made required");

    let mut narrowed = old.clone();
    narrowed.pointer_mut(&format!("{schema}/status/properties/result/enum")).unwrap().as_array_mut().unwrap().pop();
    cases.push((".status.result: enum narrowed", narrowed));

    // A condition's status listing fewer values than the API's three is a narrowing; listing the
    // three is not, even against a release whose schema listed none (`as_stored`).
    let conditions = format!("{schema}/status/properties/conditions/items/properties/status");
    let mut unlisted = old.clone();
    unlisted.pointer_mut(&conditions).unwrap().as_object_mut().unwrap().remove("enum");
    assert_eq!(breaking_changes(&unlisted, old), Vec::<String>::new(), "the API's three values narrow nothing");
    let mut fewer = old.clone();
    fewer.pointer_mut(&format!("{conditions}/enum")).unwrap().as_array_mut().unwrap().pop();
    cases.push((".status.conditions[].status: enum narrowed", fewer.clone()));
    let found = breaking_changes(&unlisted, &fewer);
    assert!(found.len() == 1 && found[0].contains("no longer allows [String(\"Unknown\")]"), "{found:?}");

    let mut retyped = old.clone();
    retyped.pointer_mut(&format!("{schema}/spec/properties/backOffLimit")).unwrap()["type"] = "string".into();
    cases.push((".spec.backOffLimit: type integer became string", retyped));

    let mut unserved = old.clone();
    unserved.pointer_mut("/spec/versions/0").unwrap()["served"] = false.into();
    cases.push(("v1alpha1: no longer served", unserved));

    for (expected, new) in cases {
        let found = breaking_changes(old, &new);
        assert!(found.len() == 1 && found[0].contains(expected), "{expected}: {found:?}");
    }
}

#[tokio::test]
async fn every_released_sample_passes_a_dry_run_against_the_current_crds() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "released-samples").await.unwrap();
    for release in releases() {
        let samples = yaml_files(&release.join("samples"));
        assert_eq!(samples.len(), 12, "{}", release.display());
        for (file, sample) in samples {
            let mut object: DynamicObject = serde_json::from_value(sample).unwrap();
            let kind = object.types.as_ref().unwrap().kind.clone();
            if is_namespaced(&kind) {
                object.metadata.namespace = Some(ns.clone());
            }
            let params = PostParams { dry_run: true, ..PostParams::default() };
            let accepted = dynamic_api(&client, &kind, &ns).create(&params, &object).await;
            assert!(accepted.is_ok(), "{}/{file}: {accepted:?}", release.display());
        }
    }
}
