//! Our CRDs against upstream's, field by field: names, scope, printer columns, and for every schema
//! path its type, format, default, enum, bounds, pattern, required-ness, map/list type and CEL rules.
//! Upstream's generated CRDs come from the Go module proxy (hack/upstream-crds.sh); every deliberate
//! difference is listed below with the entry of docs/upstream.md that gives its reason, and a listed
//! difference that disappears fails too.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// (kind, schema path, entry): a path whose description differs on purpose, with the id of the
/// docs/upstream.md entry that says how and why (`<a id="differs-<entry>">`). The test fails on a
/// difference not listed here, on a listed one that is gone, and on an entry the page lacks, so no
/// schema difference is kept without the page telling users.
const INTENDED: &[(&str, &str, &str)] = &[
    ("ReclaimSpaceCronJob", ".spec.jobTemplate.metadata.annotations", "template-metadata"),
    ("ReclaimSpaceCronJob", ".spec.jobTemplate.metadata.labels", "template-metadata"),
    ("EncryptionKeyRotationCronJob", ".spec.jobTemplate.metadata.annotations", "template-metadata"),
    ("EncryptionKeyRotationCronJob", ".spec.jobTemplate.metadata.labels", "template-metadata"),
    ("ReclaimSpaceJob", ".spec.target.persistentVolumeClaim", "pvc-target-required"),
    ("EncryptionKeyRotationJob", ".spec.target.persistentVolumeClaim", "pvc-target-required"),
    ("ReclaimSpaceCronJob", ".spec.jobTemplate.spec.target.persistentVolumeClaim", "pvc-target-required"),
    ("EncryptionKeyRotationCronJob", ".spec.jobTemplate.spec.target.persistentVolumeClaim", "pvc-target-required"),
    ("ReclaimSpaceJob", ".status.result", "status-enums"),
    ("EncryptionKeyRotationJob", ".status.result", "status-enums"),
    ("NetworkFence", ".status.result", "status-enums"),
    ("VolumeReplication", ".status.state", "status-enums"),
    ("VolumeGroupReplication", ".status.state", "status-enums"),
    ("CSIAddonsNode", ".status.retries", "node-retries"),
    ("VolumeGroupReplicationContent", ".status.conditions", "group-content-errors"),
    ("VolumeGroupReplicationContent", ".status.conditions[]", "group-content-errors"),
    ("VolumeGroupReplicationContent", ".status.conditions[].lastTransitionTime", "group-content-errors"),
    ("VolumeGroupReplicationContent", ".status.conditions[].message", "group-content-errors"),
    ("VolumeGroupReplicationContent", ".status.conditions[].observedGeneration", "group-content-errors"),
    ("VolumeGroupReplicationContent", ".status.conditions[].reason", "group-content-errors"),
    ("VolumeGroupReplicationContent", ".status.conditions[].status", "group-content-errors"),
    ("VolumeGroupReplicationContent", ".status.conditions[].type", "group-content-errors"),
    ("NetworkFence", ".spec.secret", "fence-secret-pair"),
    ("NetworkFenceClass", ".spec", "spec-required"),
    ("VolumeGroupReplicationClass", ".spec", "spec-required"),
    ("VolumeGroupReplication", ".spec", "spec-required"),
    ("VolumeGroupReplicationContent", ".spec", "spec-required"),
    ("VolumeGroupReplication", ".spec.external", "external-message"),
];

/// The INTENDED entries whose id docs/upstream.md does not give.
fn entries_missing_from(page: &str) -> Vec<String> {
    INTENDED
        .iter()
        .filter(|(_, _, id)| !page.contains(&format!("<a id=\"differs-{id}\"></a>")))
        .map(|(kind, path, id)| format!("{kind} {path}: docs/upstream.md has no entry differs-{id}"))
        .collect()
}

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

#[test]
fn every_intended_schema_difference_is_on_the_differences_page() {
    let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/upstream.md")).unwrap();
    let missing = entries_missing_from(&page);
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    // The check itself: a page without one of the ids is reported, naming the kind and path.
    let without = page.replace("<a id=\"differs-status-enums\"></a>", "");
    let found = entries_missing_from(&without);
    assert_eq!(found.len(), 5, "{found:?}");
    assert!(found[0].contains(".status.result: docs/upstream.md has no entry differs-status-enums"), "{found:?}");
}
