//! What a NetworkFenceClass means, decided without I/O: its parameters (the secret taken out of
//! the reserved keys), and the class names a CSIAddonsNode's annotation holds.
use std::collections::BTreeMap;

/// Capability a sidecar must advertise to list fenceable clients.
pub const GET_CLIENTS_TO_FENCE: &str = "network_fence.GET_CLIENTS_TO_FENCE";
/// Upstream's annotation on CSIAddonsNodes: a JSON array of NetworkFenceClass names.
pub const CLASS_NAMES_ANNOTATION: &str = "csiaddons.openshift.io/networkfenceclass-names";
const RESERVED_PREFIX: &str = "csiaddons.openshift.io/";
const SECRET_NAME_KEY: &str = "csiaddons.openshift.io/networkfence-secret-name";
const SECRET_NAMESPACE_KEY: &str = "csiaddons.openshift.io/networkfence-secret-namespace";

/// A class's parameters with its reserved keys taken out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassParameters {
    /// Passed to the driver.
    pub parameters: BTreeMap<String, String>,
    /// From the reserved keys: (name, namespace).
    pub secret: Option<(String, String)>,
}

/// What is wrong with a NetworkFenceClass's parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassParameterError {
    #[error("parameter {0} is empty")]
    Empty(String),
    #[error(
        "parameter {0} uses the reserved prefix {RESERVED_PREFIX} (allowed: {SECRET_NAME_KEY}, {SECRET_NAMESPACE_KEY})"
    )]
    Reserved(String),
    #[error("{0} is set without {1}")]
    HalfSecret(&'static str, &'static str),
}

/// Splits a NetworkFenceClass's parameters: only the two secret keys may use the reserved
/// prefix, and neither may be empty.
pub fn class_parameters(parameters: Option<&BTreeMap<String, String>>) -> Result<ClassParameters, ClassParameterError> {
    let mut out = ClassParameters::default();
    let (mut name, mut namespace) = (None, None);
    for (key, value) in parameters.into_iter().flatten() {
        match key.as_str() {
            SECRET_NAME_KEY | SECRET_NAMESPACE_KEY if value.is_empty() => {
                return Err(ClassParameterError::Empty(key.clone()));
            }
            SECRET_NAME_KEY => name = Some(value.clone()),
            SECRET_NAMESPACE_KEY => namespace = Some(value.clone()),
            _ if key.starts_with(RESERVED_PREFIX) => return Err(ClassParameterError::Reserved(key.clone())),
            _ => {
                out.parameters.insert(key.clone(), value.clone());
            }
        }
    }
    out.secret = match (name, namespace) {
        (Some(name), Some(namespace)) => Some((name, namespace)),
        (None, None) => None,
        (Some(_), None) => return Err(ClassParameterError::HalfSecret(SECRET_NAME_KEY, SECRET_NAMESPACE_KEY)),
        (None, Some(_)) => return Err(ClassParameterError::HalfSecret(SECRET_NAMESPACE_KEY, SECRET_NAME_KEY)),
    };
    Ok(out)
}

/// The class names in a CSIAddonsNode's annotation; anything but a JSON array of strings counts
/// as none (and is rewritten when a class is added).
pub fn class_names(annotation: Option<&str>) -> Vec<String> {
    annotation.and_then(|text| serde_json::from_str::<Vec<String>>(text).ok()).unwrap_or_default()
}

/// The annotation's new value when `class` is to be named (`present`) or not; None when it
/// already is so.
pub fn annotation_change(current: Option<&str>, class: &str, present: bool) -> Option<String> {
    let mut names = class_names(current);
    let has = names.iter().any(|n| n == class);
    if has == present && current.is_some_and(|c| serde_json::from_str::<Vec<String>>(c).is_ok()) {
        return None;
    }
    if !present && !has {
        return None;
    }
    names.retain(|n| n != class);
    if present {
        names.push(class.to_owned());
    }
    names.sort();
    Some(serde_json::to_string(&names).unwrap_or_else(|_| "[]".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_parameters_take_out_the_secret_and_refuse_other_reserved_keys() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        let split =
            class_parameters(Some(&map(&[("clusterID", "c1"), (SECRET_NAME_KEY, "s"), (SECRET_NAMESPACE_KEY, "ns")])))
                .unwrap();
        assert_eq!(split.parameters, map(&[("clusterID", "c1")]));
        assert_eq!(split.secret, Some(("s".into(), "ns".into())));
        assert_eq!(class_parameters(None), Ok(ClassParameters::default()));
        let err = class_parameters(Some(&map(&[("csiaddons.openshift.io/other", "x")]))).unwrap_err().to_string();
        assert!(err.contains("reserved prefix"), "{err}");
        assert!(class_parameters(Some(&map(&[(SECRET_NAME_KEY, "")]))).unwrap_err().to_string().contains("is empty"));
        assert!(class_parameters(Some(&map(&[(SECRET_NAME_KEY, "s")]))).unwrap_err().to_string().contains("without"));
    }

    #[test]
    fn the_annotation_gains_and_loses_one_name_and_is_left_alone_when_right() {
        assert_eq!(annotation_change(None, "a", true).as_deref(), Some(r#"["a"]"#));
        assert_eq!(annotation_change(Some(r#"["b"]"#), "a", true).as_deref(), Some(r#"["a","b"]"#));
        assert_eq!(annotation_change(Some(r#"["a","b"]"#), "a", true), None);
        assert_eq!(annotation_change(Some(r#"["a","b"]"#), "a", false).as_deref(), Some(r#"["b"]"#));
        assert_eq!(annotation_change(Some(r#"["b"]"#), "a", false), None);
        assert_eq!(annotation_change(None, "a", false), None);
        // Not a JSON array: rewritten when a class is added.
        assert_eq!(annotation_change(Some("a"), "a", true).as_deref(), Some(r#"["a"]"#));
    }

    #[test]
    fn class_names_read_a_json_array_and_nothing_else() {
        assert_eq!(class_names(Some(r#"["a","b"]"#)), ["a", "b"]);
        assert!(class_names(Some("a,b")).is_empty());
        assert!(class_names(None).is_empty());
    }
}
