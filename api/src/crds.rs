//! The CustomResourceDefinitions of every kind, as installed and as written to
//! `config/crd/bases/` by the `crdgen` binary.
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Map, Value, json};

use crate::{csiaddons, driver, replication};

/// Every CRD, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    [
        csiaddons::CSIAddonsNode::crd(),
        csiaddons::EncryptionKeyRotationCronJob::crd(),
        csiaddons::EncryptionKeyRotationJob::crd(),
        csiaddons::NetworkFenceClass::crd(),
        csiaddons::NetworkFence::crd(),
        csiaddons::ReclaimSpaceCronJob::crd(),
        csiaddons::ReclaimSpaceJob::crd(),
        replication::VolumeGroupReplicationClass::crd(),
        replication::VolumeGroupReplicationContent::crd(),
        replication::VolumeGroupReplication::crd(),
        replication::VolumeReplicationClass::crd(),
        replication::VolumeReplication::crd(),
    ]
    .into_iter()
    .map(finish)
    .collect()
}

/// The CRDs of the reference driver's lifecycle operator (its own bundle, not the csi-addons one).
pub fn driver_operator() -> Vec<CustomResourceDefinition> {
    [driver::ReferenceCSIDriver::crd()].into_iter().map(finish).collect()
}

/// The file name kubebuilder would give the CRD: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// The CRD as YAML, as committed under `config/crd/bases/`.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    // The typed schema keeps bounds as f64 (`maximum: 60.0`); write integral ones as integers.
    let mut value = serde_json::to_value(crd).map_err(<serde_yaml::Error as serde::ser::Error>::custom)?;
    integral_bounds(&mut value);
    Ok(format!("---\n{}", serde_yaml::to_string(&value)?))
}

/// Calls `visit` on every object in `value`, each before the objects inside it: the one walk
/// every rewrite of a schema here makes.
pub fn for_each_object(value: &mut Value, visit: &mut impl FnMut(&mut Map<String, Value>)) {
    match value {
        Value::Object(map) => {
            visit(map);
            map.values_mut().for_each(|child| for_each_object(child, visit));
        }
        Value::Array(items) => items.iter_mut().for_each(|item| for_each_object(item, visit)),
        _ => {}
    }
}

fn integral_bounds(value: &mut Value) {
    for_each_object(value, &mut |map| {
        for bound in ["minimum", "maximum"] {
            if let Some(n) = map.get(bound).and_then(Value::as_f64).filter(|n| n.fract() == 0.0) {
                map.insert(bound.to_owned(), Value::from(n as i64));
            }
        }
    });
}

/// Brings the derived CRD in line with what kubebuilder writes for upstream's types.
fn finish(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    crd.spec.names.list_kind.get_or_insert_with(|| format!("{}List", crd.spec.names.kind));
    for version in &mut crd.spec.versions {
        if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
            // The schema is plain data; a round trip through JSON cannot fail, and if it ever did
            // the schema would be left as derived.
            // The derive describes the root as "Auto-generated derived type…"; the spec's own doc
            // comment says what the kind is.
            let spec_doc = schema.properties.as_ref().and_then(|p| p.get("spec")).and_then(|s| s.description.clone());
            if let Some(doc) = spec_doc {
                schema.description = Some(doc);
            }
            let Ok(mut value) = serde_json::to_value(&*schema) else { continue };
            tidy_schema(&mut value);
            add_condition_rules(&mut value);
            add_label_selector_rules(&mut value);
            if let Ok(tidied) = serde_json::from_value(value) {
                *schema = tidied;
            }
        }
    }
    crd
}

/// - Optional fields are `Option`s, which the derive marks `nullable` (and lists `null` among an
///   enum's values). Upstream's CRDs have no nullable fields, so a `null` sent by a client is
///   pruned rather than stored; keep that.
fn tidy_schema(value: &mut Value) {
    for_each_object(value, &mut |map| {
        map.remove("nullable");
        if let Some(Value::Array(values)) = map.get_mut("enum") {
            values.retain(|v| !v.is_null());
        }
    });
}

/// The fields of a `metav1.Condition`, all required but `observedGeneration`.
const CONDITION_FIELDS: [&str; 6] = ["lastTransitionTime", "message", "observedGeneration", "reason", "status", "type"];

/// Whether `schema` is that of a `metav1.Condition`: an object with exactly its fields.
pub fn is_condition(schema: &Map<String, Value>) -> bool {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return false };
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    properties.len() == CONDITION_FIELDS.len()
        && CONDITION_FIELDS.iter().all(|f| properties.contains_key(*f))
        && CONDITION_FIELDS.iter().filter(|f| **f != "observedGeneration").all(|f| required.contains(f))
}

/// The validation the Kubernetes API gives a `metav1.Condition`'s fields (the markers on the Go
/// type, which upstream's CRDs carry; k8s-openapi's schema of the type has none), added to every
/// condition in `value`. Without it our CRDs would store conditions upstream's refuse: a status
/// other than True, False or Unknown, an empty reason, a message past 32 KiB.
fn add_condition_rules(value: &mut Value) {
    for_each_object(value, &mut |map| {
        if !is_condition(map) {
            return;
        }
        let Some(Value::Object(fields)) = map.get_mut("properties") else { return };
        let rules = [
            ("message", json!({"maxLength": 32768})),
            ("observedGeneration", json!({"minimum": 0})),
            ("reason", json!({"maxLength": 1024, "minLength": 1, "pattern": CONDITION_REASON_PATTERN})),
            ("status", json!({"enum": ["True", "False", "Unknown"]})),
            ("type", json!({"maxLength": 316, "pattern": CONDITION_TYPE_PATTERN})),
        ];
        for (field, rule) in rules {
            if let (Some(Value::Object(schema)), Value::Object(rule)) = (fields.get_mut(field), rule) {
                schema.extend(rule);
            }
        }
    });
}

/// A `metav1.LabelSelector`'s lists as the Kubernetes API types mark them (atomic: replaced whole
/// by a merge, never merged item by item), which k8s-openapi's schema of the type leaves out.
fn add_label_selector_rules(value: &mut Value) {
    for_each_object(value, &mut |map| {
        let is_selector = map
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| p.len() == 2 && p.contains_key("matchExpressions") && p.contains_key("matchLabels"));
        let expressions = map.get_mut("properties").and_then(|p| p.get_mut("matchExpressions"));
        if is_selector && let Some(expressions) = expressions.filter(|e| e.is_object()) {
            expressions["x-kubernetes-list-type"] = json!("atomic");
            if let Some(values) = expressions.pointer_mut("/items/properties/values").filter(|v| v.is_object()) {
                values["x-kubernetes-list-type"] = json!("atomic");
            }
        }
    });
}

/// A condition's reason: CamelCase, as the API requires.
pub const CONDITION_REASON_PATTERN: &str = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";
/// A condition's type: CamelCase, optionally under a DNS-subdomain prefix (`example.com/Ready`).
pub const CONDITION_TYPE_PATTERN: &str =
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$";

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn bases_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/crd/bases")
    }

    /// The CRDs whose committed file in `dir` differs from what their type generates, and the file
    /// names the types generate (sorted).
    fn drift(dir: &std::path::Path, crds: Vec<CustomResourceDefinition>) -> (Vec<String>, Vec<String>) {
        let mut stale = Vec::new();
        let mut expected_files = Vec::new();
        for crd in crds {
            let file = file_name(&crd);
            let committed = std::fs::read_to_string(dir.join(&file)).unwrap_or_default();
            if committed != to_yaml(&crd).unwrap() {
                stale.push(file.clone());
            }
            expected_files.push(file);
        }
        expected_files.sort();
        (stale, expected_files)
    }

    #[test]
    fn committed_crd_yaml_matches_the_types() {
        let (stale, expected_files) = drift(&bases_dir(), all());
        assert!(stale.is_empty(), "config/crd/bases is out of date for {stale:?}: run `make manifests` and commit");
        let mut present: Vec<String> = std::fs::read_dir(bases_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        present.sort();
        assert_eq!(present, expected_files, "config/crd/bases holds files no type generates");
    }

    #[test]
    fn the_driver_operators_committed_crd_matches_its_type() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../driver-operator/config/crd/bases");
        let (stale, _) = drift(&dir, driver_operator());
        assert!(stale.is_empty(), "{stale:?} out of date: run `make manifests` and commit");
    }

    /// Every condition of every kind carries the API's validation of a condition.
    #[test]
    fn every_condition_is_validated_as_the_api_validates_one() {
        fn conditions<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
            if value.as_object().is_some_and(is_condition) {
                out.push(value);
            }
            match value {
                Value::Object(map) => map.values().for_each(|v| conditions(v, out)),
                Value::Array(items) => items.iter().for_each(|v| conditions(v, out)),
                _ => {}
            }
        }
        let mut kinds_with_conditions = 0;
        for crd in all() {
            let value = serde_json::to_value(&crd).unwrap();
            let mut found = Vec::new();
            conditions(&value, &mut found);
            kinds_with_conditions += usize::from(!found.is_empty());
            for condition in found {
                let fields = &condition["properties"];
                assert_eq!(fields["status"]["enum"], json!(["True", "False", "Unknown"]), "{}", crd.spec.names.kind);
                assert_eq!(fields["reason"]["minLength"], json!(1));
                assert_eq!(fields["message"]["maxLength"], json!(32768));
                assert_eq!(fields["type"]["pattern"], json!(CONDITION_TYPE_PATTERN));
            }
        }
        assert_eq!(kinds_with_conditions, 6, "the kinds whose status has conditions");
        // An object that only looks like a condition in part is left alone.
        let mut partial = json!({"properties": {"status": {"type": "string"}, "type": {"type": "string"}}});
        add_condition_rules(&mut partial);
        assert!(partial["properties"]["status"].get("enum").is_none());
    }

    #[test]
    fn schemas_have_no_nullable_fields_and_enums_have_no_null() {
        for crd in all().into_iter().chain(driver_operator()) {
            let yaml = to_yaml(&crd).unwrap();
            assert!(!yaml.contains("nullable"), "{}", crd.spec.names.kind);
            assert!(!yaml.contains("- null"), "{}", crd.spec.names.kind);
            assert!(!yaml.contains(".0\n"), "{}: float bounds", crd.spec.names.kind);
        }
    }

    #[test]
    fn names_scopes_and_short_names_are_upstreams() {
        let got: Vec<(String, String, Vec<String>)> = all()
            .into_iter()
            .map(|c| (c.metadata.name.unwrap(), c.spec.scope, c.spec.names.short_names.unwrap_or_default()))
            .collect();
        let expected = [
            ("csiaddonsnodes.csiaddons.openshift.io", "Namespaced", vec![]),
            ("encryptionkeyrotationcronjobs.csiaddons.openshift.io", "Namespaced", vec![]),
            ("encryptionkeyrotationjobs.csiaddons.openshift.io", "Namespaced", vec![]),
            ("networkfenceclasses.csiaddons.openshift.io", "Cluster", vec![]),
            ("networkfences.csiaddons.openshift.io", "Cluster", vec![]),
            ("reclaimspacecronjobs.csiaddons.openshift.io", "Namespaced", vec![]),
            ("reclaimspacejobs.csiaddons.openshift.io", "Namespaced", vec![]),
            ("volumegroupreplicationclasses.replication.storage.openshift.io", "Cluster", vec!["vgrc"]),
            ("volumegroupreplicationcontents.replication.storage.openshift.io", "Cluster", vec!["vgrcontent"]),
            ("volumegroupreplications.replication.storage.openshift.io", "Namespaced", vec!["vgr"]),
            ("volumereplicationclasses.replication.storage.openshift.io", "Cluster", vec!["vrc"]),
            ("volumereplications.replication.storage.openshift.io", "Namespaced", vec!["vr"]),
        ];
        let expected: Vec<(String, String, Vec<String>)> = expected
            .into_iter()
            .map(|(n, s, short)| (n.to_owned(), s.to_owned(), short.into_iter().map(str::to_owned).collect()))
            .collect();
        assert_eq!(got, expected);
    }
}

#[cfg(test)]
mod project_file {
    use std::path::PathBuf;

    /// PROJECT (read by operator-sdk) lists every kind with the scope its CRD really has.
    #[test]
    fn project_file_lists_every_kind_with_its_scope() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../PROJECT");
        let project: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(project["version"], serde_yaml::Value::from("3"));
        assert!(
            project.get("layout").is_none(),
            "a layout operator-sdk cannot resolve breaks every operator-sdk command"
        );
        let mut listed: Vec<(String, String, bool)> = project["resources"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|r| {
                let group = format!("{}.{}", r["group"].as_str().unwrap(), r["domain"].as_str().unwrap());
                (group, r["kind"].as_str().unwrap().to_owned(), r["api"]["namespaced"].as_bool().unwrap())
            })
            .collect();
        let mut expected: Vec<(String, String, bool)> =
            super::all().into_iter().map(|c| (c.spec.group, c.spec.names.kind, c.spec.scope == "Namespaced")).collect();
        listed.sort();
        expected.sort();
        assert_eq!(listed, expected);
    }
}
