//! Schema pieces the custom resources' types name in their `schemars` attributes, where the derived
//! schema is not the one upstream's CRDs have and users' objects are written for.
use schemars::transform::Transform;
use schemars::{Schema, SchemaGenerator, json_schema};

/// Lists a property as required although its type gives it a default.
///
/// Upstream's schema lists a few defaulted fields as required too (their Go fields have no
/// `omitempty`). The API server fills a default before it validates, so either listing admits the
/// same objects; listing it keeps our schema equal to upstream's, which tools that compare schemas
/// (and users reading `kubectl explain`) see.
pub struct AlsoRequired(pub &'static str);

impl Transform for AlsoRequired {
    fn transform(&mut self, schema: &mut Schema) {
        let Some(object) = schema.as_object_mut() else { return };
        let required = object.entry("required").or_insert_with(|| serde_json::Value::Array(Vec::new()));
        if let Some(names) = required.as_array_mut()
            && !names.iter().any(|name| name == self.0)
        {
            names.push(self.0.into());
        }
    }
}

/// A `resource.Quantity` as the Kubernetes API validates one (a number, or a string such as `1Gi`),
/// as upstream's schema has it; k8s-openapi's schema of the type has no pattern.
pub fn quantity(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        "x-kubernetes-int-or-string": true,
    })
}

/// A list of `LocalObjectReference`s as the Kubernetes API's own schema of the type has it, and so
/// upstream's: `name` defaults to "" rather than being required, and each entry is atomic (replaced
/// whole by a server-side apply). k8s-openapi's schema requires `name`.
pub fn local_object_references(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {
            "description": "LocalObjectReference contains enough information to let you locate the referenced object inside the same namespace.",
            "type": "object",
            "properties": {
                "name": {
                    "description": "Name of the referent.",
                    "type": "string",
                    "default": "",
                },
            },
            "x-kubernetes-map-type": "atomic",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn also_required_adds_a_name_once_and_keeps_the_others() {
        let mut schema = json_schema!({"type": "object", "required": ["cidrs"]});
        AlsoRequired("fenceState").transform(&mut schema);
        AlsoRequired("fenceState").transform(&mut schema);
        assert_eq!(schema.get("required"), Some(&serde_json::json!(["cidrs", "fenceState"])));
        let mut bare = json_schema!({"type": "object"});
        AlsoRequired("autoResync").transform(&mut bare);
        assert_eq!(bare.get("required"), Some(&serde_json::json!(["autoResync"])));
    }
}
