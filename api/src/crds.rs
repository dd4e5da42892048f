//! The CustomResourceDefinitions of every kind, as installed and as written to
//! `config/crd/bases/` by the `crdgen` binary.
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

use crate::{csiaddons, replication};

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

fn integral_bounds(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for bound in ["minimum", "maximum"] {
                if let Some(n) = map.get(bound).and_then(Value::as_f64).filter(|n| n.fract() == 0.0) {
                    map.insert(bound.to_owned(), Value::from(n as i64));
                }
            }
            map.values_mut().for_each(integral_bounds);
        }
        Value::Array(items) => items.iter_mut().for_each(integral_bounds),
        _ => {}
    }
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
    match value {
        Value::Object(map) => {
            map.remove("nullable");
            if let Some(Value::Array(values)) = map.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            map.values_mut().for_each(tidy_schema);
        }
        Value::Array(items) => items.iter_mut().for_each(tidy_schema),
        _ => {}
    }
}
