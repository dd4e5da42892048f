//! Our CRDs against upstream's, field by field: names, scope, printer columns, and for every schema
//! path its type, format, default, enum, bounds, pattern, required-ness, map/list type and CEL rules.
//! Upstream's generated CRDs come from the Go module proxy (hack/upstream-crds.sh); every deliberate
//! difference is listed below with its reason, and a listed difference that disappears fails too.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// (kind, schema path) whose description differs on purpose, and why.
const INTENDED: &[(&str, &str, &str)] = &[
    (
        "ReclaimSpaceCronJob",
        ".spec.jobTemplate.metadata.annotations",
        "template metadata keeps annotations (upstream prunes them)",
    ),
    (
        "ReclaimSpaceCronJob",
        ".spec.jobTemplate.metadata.labels",
        "template metadata keeps labels (upstream prunes them)",
    ),
    ("EncryptionKeyRotationCronJob", ".spec.jobTemplate.metadata.annotations", "as above"),
    ("EncryptionKeyRotationCronJob", ".spec.jobTemplate.metadata.labels", "as above"),
    (
        "ReclaimSpaceJob",
        ".spec.target.persistentVolumeClaim",
        "required and non-empty: a job without a PVC is rejected at admission",
    ),
    ("EncryptionKeyRotationJob", ".spec.target.persistentVolumeClaim", "as above"),
    ("ReclaimSpaceCronJob", ".spec.jobTemplate.spec.target.persistentVolumeClaim", "as above"),
    ("EncryptionKeyRotationCronJob", ".spec.jobTemplate.spec.target.persistentVolumeClaim", "as above"),
    ("ReclaimSpaceJob", ".status.result", "enum Succeeded/Failed"),
    ("EncryptionKeyRotationJob", ".status.result", "enum Succeeded/Failed"),
    ("NetworkFence", ".status.result", "enum Succeeded/Failed"),
    ("VolumeReplication", ".status.state", "enum Primary/Secondary/Unknown"),
    ("VolumeGroupReplication", ".status.state", "enum Primary/Secondary/Unknown"),
    // Upstream marks these required *and* defaulted; the API server defaults before it validates,
    // so both behave the same. Ours keep a serde default so decoding never fails on them.
    ("CSIAddonsNode", ".status.retries", "failed connection attempts as a number (upstream: text in status.reason)"),
    (
        "VolumeGroupReplicationContent",
        ".status.conditions",
        "Ready with the driver's error (upstream: in its log only, kubernetes-csi-addons#1076)",
    ),
    ("VolumeGroupReplicationContent", ".status.conditions[]", "as above"),
    ("VolumeGroupReplicationContent", ".status.conditions[].lastTransitionTime", "as above"),
    ("VolumeGroupReplicationContent", ".status.conditions[].message", "as above"),
    ("VolumeGroupReplicationContent", ".status.conditions[].observedGeneration", "as above"),
    ("VolumeGroupReplicationContent", ".status.conditions[].reason", "as above"),
    ("VolumeGroupReplicationContent", ".status.conditions[].status", "as above"),
    ("VolumeGroupReplicationContent", ".status.conditions[].type", "as above"),
    ("NetworkFence", ".spec.fenceState", "defaulted to Fenced; not listed as required"),
    ("VolumeReplication", ".spec.autoResync", "defaulted to false; not listed as required"),
    ("VolumeGroupReplication", ".spec.autoResync", "defaulted to false; not listed as required"),
    ("NetworkFence", ".spec.secret", "name and namespace come together (upstream: either alone)"),
    ("NetworkFenceClass", ".spec", "spec required: a class without a provisioner is useless"),
    ("VolumeGroupReplicationClass", ".spec", "spec required, as above"),
    ("VolumeGroupReplication", ".spec", "spec required: its fields are required"),
    ("VolumeGroupReplicationContent", ".spec", "spec required: its fields are required"),
    (
        "VolumeGroupReplication",
        ".spec.external",
        "message says \"external is immutable\" (upstream: \"source is immutable\")",
    ),
    (
        "VolumeGroupReplicationContent",
        ".spec.volumeGroupReplicationRef",
        "the rule sits on the optional field, so it needs no null check",
    ),
    (
        "VolumeGroupReplication",
        ".status.persistentVolumeClaimsRefList[]",
        "k8s-openapi's LocalObjectReference (status, written by us)",
    ),
    ("VolumeGroupReplication", ".status.persistentVolumeClaimsRefList[].name", "as above"),
    ("VolumeGroupReplicationContent", ".status.persistentVolumeRefList[]", "as above"),
    ("VolumeGroupReplicationContent", ".status.persistentVolumeRefList[].name", "as above"),
];

fn upstream_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("UPSTREAM_CRDS") {
        return PathBuf::from(dir);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/upstream-crds.sh");
    let out = Command::new("bash").arg(&script).output().unwrap();
    assert!(out.status.success(), "{}: {}", script.display(), String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// path → canonical description of the schema node at that path.
fn flatten(schema: &Value, path: &str, required: bool, out: &mut BTreeMap<String, String>) {
    let mut desc = vec![schema["type"].as_str().unwrap_or("").to_owned()];
    if required {
        desc.push("REQ".into());
    }
    for key in [
        "format",
        "default",
        "enum",
        "minimum",
        "maximum",
        "pattern",
        "minLength",
        "maxLength",
        "x-kubernetes-int-or-string",
        "x-kubernetes-map-type",
        "x-kubernetes-list-type",
        "x-kubernetes-preserve-unknown-fields",
    ] {
        if let Some(v) = schema.get(key) {
            // Integral bounds compare as integers whichever way they were written.
            let v = v
                .as_f64()
                .filter(|f| f.fract() == 0.0 && !v.is_boolean())
                .map_or_else(|| v.to_string(), |f| (f as i64).to_string());
            desc.push(format!("{key}={v}"));
        }
    }
    if let Some(Value::Object(ap)) = schema.get("additionalProperties") {
        desc.push(format!("map of {}", ap["type"].as_str().unwrap_or("?")));
    }
    for rule in schema["x-kubernetes-validations"].as_array().into_iter().flatten() {
        desc.push(format!(
            "CEL[{} :: {}]",
            rule["rule"].as_str().unwrap_or(""),
            rule["message"].as_str().unwrap_or("")
        ));
    }
    out.insert(path.to_owned(), desc.join(" "));
    let required: Vec<&str> = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for (name, child) in schema["properties"].as_object().into_iter().flatten() {
        // kube's derive leaves out the root's apiVersion/kind/metadata; the API server adds them.
        if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
            continue;
        }
        flatten(child, &format!("{path}.{name}"), required.contains(&name.as_str()), out);
    }
    if let Some(items) = schema.get("items") {
        flatten(items, &format!("{path}[]"), false, out);
    }
}

/// Everything compared for one CRD, keyed by what it describes.
fn describe(crd: &Value) -> BTreeMap<String, String> {
    let spec = &crd["spec"];
    let mut out = BTreeMap::new();
    let names = &spec["names"];
    out.insert(
        "names".into(),
        format!(
            "{} {} {} {} {}",
            names["kind"], names["listKind"], names["plural"], names["singular"], names["shortNames"]
        ),
    );
    out.insert("scope".into(), spec["scope"].to_string());
    let version = &spec["versions"][0];
    out.insert(
        "version".into(),
        format!(
            "{} served={} storage={} status={}",
            version["name"], version["served"], version["storage"], version["subresources"]["status"]
        ),
    );
    let columns: Vec<String> = version["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!("{}:{}:{}:{}", c["name"], c["type"], c["jsonPath"], c.get("priority").unwrap_or(&Value::from(0)))
        })
        .collect();
    out.insert("columns".into(), columns.join(", "));
    let mut schema = BTreeMap::new();
    flatten(&version["schema"]["openAPIV3Schema"], "", false, &mut schema);
    out.extend(schema);
    out
}

#[test]
fn our_crds_match_upstreams_field_by_field_except_the_listed_fixes() {
    let dir = upstream_dir();
    let mut unexpected = Vec::new();
    let mut intended_seen = Vec::new();
    for crd in api::crds::all() {
        let kind = crd.spec.names.kind.clone();
        let file = dir.join(api::crds::file_name(&crd));
        let upstream: Value = serde_yaml::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let ours = describe(&serde_json::to_value(&crd).unwrap());
        let theirs = describe(&upstream);
        let keys: std::collections::BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
        for key in keys {
            let (a, b) = (theirs.get(key), ours.get(key));
            if a == b {
                continue;
            }
            if INTENDED.iter().any(|(k, p, _)| *k == kind && p == key) {
                intended_seen.push((kind.clone(), key.clone()));
            } else {
                unexpected.push(format!("{kind} {key}:\n    upstream: {a:?}\n    ours:     {b:?}"));
            }
        }
    }
    assert!(
        unexpected.is_empty(),
        "{} unexpected difference(s) from upstream:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
    let stale: Vec<_> =
        INTENDED.iter().filter(|(k, p, _)| !intended_seen.iter().any(|(sk, sp)| sk == k && sp == p)).collect();
    assert!(stale.is_empty(), "listed as intended differences but now equal to upstream: {stale:?}");
}
