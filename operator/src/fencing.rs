//! What a NetworkFence and a NetworkFenceClass mean, decided without I/O: validation with
//! upstream's messages, the request sent to the sidecar, and whether the fence is (or may be)
//! applied at the driver.
use std::collections::BTreeMap;
use std::net::IpAddr;

use api::csiaddons::{FenceState, NetworkFence, NetworkFenceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Capability a sidecar must advertise to fence and unfence.
pub const NETWORK_FENCE: &str = "network_fence.NETWORK_FENCE";
/// Capability a sidecar must advertise to list fenceable clients.
pub const GET_CLIENTS_TO_FENCE: &str = "network_fence.GET_CLIENTS_TO_FENCE";
/// Upstream's finalizer on NetworkFences.
pub const FINALIZER: &str = "csiaddons.openshift.io/network-fence";
/// Upstream's annotation on CSIAddonsNodes: a JSON array of NetworkFenceClass names.
pub const CLASS_NAMES_ANNOTATION: &str = "csiaddons.openshift.io/networkfenceclass-names";
/// Ours: `"true"` on a NetworkFence being deleted removes the finalizer without unfencing (for a
/// fence whose class or sidecar is gone for good; the CIDRs may stay fenced at the driver).
pub const DELETE_WITHOUT_UNFENCE: &str = "csiaddons.openshift.io/delete-without-unfence";
/// Condition: whether the CIDRs are fenced at the driver (Unknown after a failed call).
pub const APPLIED_CONDITION: &str = "FenceApplied";
/// Condition: what a deletion waits for before the finalizer goes.
pub const DELETION_CONDITION: &str = "DeletionBlocked";

pub const FENCE_SUCCEEDED: &str = "fencing operation successful";
pub const UNFENCE_SUCCEEDED: &str = "unfencing operation successful";

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

/// Splits a NetworkFenceClass's parameters: only the two secret keys may use the reserved
/// prefix, and neither may be empty.
pub fn class_parameters(parameters: Option<&BTreeMap<String, String>>) -> Result<ClassParameters, String> {
    let mut out = ClassParameters::default();
    let (mut name, mut namespace) = (None, None);
    for (key, value) in parameters.into_iter().flatten() {
        match key.as_str() {
            SECRET_NAME_KEY | SECRET_NAMESPACE_KEY if value.is_empty() => {
                return Err(format!("parameter {key} is empty"));
            }
            SECRET_NAME_KEY => name = Some(value.clone()),
            SECRET_NAMESPACE_KEY => namespace = Some(value.clone()),
            _ if key.starts_with(RESERVED_PREFIX) => {
                return Err(format!(
                    "parameter {key} uses the reserved prefix {RESERVED_PREFIX} (allowed: {SECRET_NAME_KEY}, {SECRET_NAMESPACE_KEY})"
                ));
            }
            _ => {
                out.parameters.insert(key.clone(), value.clone());
            }
        }
    }
    out.secret = match (name, namespace) {
        (Some(name), Some(namespace)) => Some((name, namespace)),
        (None, None) => None,
        (Some(_), None) => return Err(format!("{SECRET_NAME_KEY} is set without {SECRET_NAMESPACE_KEY}")),
        (None, Some(_)) => return Err(format!("{SECRET_NAMESPACE_KEY} is set without {SECRET_NAME_KEY}")),
    };
    Ok(out)
}

/// Checks a NetworkFence's spec; the error is its status message (upstream's prefix).
pub fn validate(spec: &NetworkFenceSpec) -> Result<(), String> {
    let why = |text: String| format!("Failed to validate Networkfence parameters: {text}");
    let has_class = spec.network_fence_class_name.as_deref().is_some_and(|c| !c.is_empty());
    if !has_class && spec.driver.as_deref().is_none_or(str::is_empty) {
        return Err(why("required parameter driver is not specified".into()));
    }
    if spec.cidrs.is_empty() {
        return Err(why("required parameter cidrs is not specified".into()));
    }
    for cidr in &spec.cidrs {
        check_cidr(cidr).map_err(|e| why(format!("cidr {cidr:?}: {e}")))?;
    }
    Ok(())
}

/// An address or an address block (`10.0.0.0/24`, `fd00::/64`, `10.1.2.3`).
fn check_cidr(cidr: &str) -> Result<(), String> {
    let (address, length) = match cidr.split_once('/') {
        Some((address, length)) => (address, Some(length)),
        None => (cidr, None),
    };
    let ip: IpAddr = address.parse().map_err(|_| format!("{address:?} is not an IP address"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if let Some(length) = length {
        match length.parse::<u8>() {
            Ok(n) if n <= max => {}
            _ => return Err(format!("prefix length {length:?} is not a number from 0 to {max}")),
        }
    }
    Ok(())
}

/// The fields of the deprecated inline form a spec uses (a class is the supported way).
pub fn deprecated_fields(spec: &NetworkFenceSpec) -> Vec<&'static str> {
    let mut used = Vec::new();
    if spec.driver.is_some() {
        used.push("spec.driver");
    }
    if spec.secret.as_ref().is_some_and(|s| !s.is_empty()) {
        used.push("spec.secret");
    }
    if spec.parameters.is_some() {
        used.push("spec.parameters");
    }
    used
}

/// What is sent to the sidecar.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceRequest {
    pub parameters: BTreeMap<String, String>,
    pub secret_name: String,
    pub secret_namespace: String,
    pub cidrs: Vec<String>,
}

/// The spec's parameters and secret, with the class's merged over them (the class wins), as
/// upstream.
pub fn request(spec: &NetworkFenceSpec, class: Option<&ClassParameters>) -> FenceRequest {
    let mut parameters = spec.parameters.clone().unwrap_or_default();
    let mut secret = spec.secret.as_ref().filter(|s| !s.is_empty()).map(|s| (s.name.clone(), s.namespace.clone()));
    if let Some(class) = class {
        parameters.extend(class.parameters.clone());
        if class.secret.is_some() {
            secret = class.secret.clone();
        }
    }
    let (secret_name, secret_namespace) = secret.unwrap_or_default();
    FenceRequest { parameters, secret_name, secret_namespace, cidrs: spec.cidrs.clone() }
}

fn applied_condition(fence: &NetworkFence) -> Option<&Condition> {
    fence.status.as_ref()?.conditions.iter().find(|c| c.type_ == APPLIED_CONDITION)
}

/// Whether the driver already holds the spec's state for this generation: nothing to call.
pub fn up_to_date(fence: &NetworkFence) -> bool {
    let Some(condition) = applied_condition(fence) else { return false };
    let wanted = match fence.spec.fence_state {
        FenceState::Fenced => "True",
        FenceState::Unfenced => "False",
    };
    condition.status == wanted && condition.observed_generation == fence.metadata.generation
}

/// Whether the CIDRs may be fenced at the driver, so a deletion must unfence first. A fence
/// written by upstream's manager (no condition) counts when its spec says Fenced and a call was
/// made.
pub fn maybe_applied(fence: &NetworkFence) -> bool {
    match applied_condition(fence) {
        Some(condition) => condition.status != "False",
        None => {
            fence.spec.fence_state == FenceState::Fenced && fence.status.as_ref().is_some_and(|s| s.result.is_some())
        }
    }
}

/// The class names in a CSIAddonsNode's annotation; anything but a JSON array of strings counts
/// as none (and is rewritten when a class is added).
pub fn class_names(annotation: Option<&str>) -> Vec<String> {
    annotation.and_then(|text| serde_json::from_str::<Vec<String>>(text).ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::csiaddons::SecretReference;

    fn spec(class: Option<&str>, driver: Option<&str>, cidrs: &[&str]) -> NetworkFenceSpec {
        NetworkFenceSpec {
            network_fence_class_name: class.map(Into::into),
            driver: driver.map(Into::into),
            cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn validation_speaks_upstreams_words_and_checks_every_cidr() {
        assert_eq!(validate(&spec(Some("c"), None, &["10.0.0.0/24", "fd00::5", "10.1.2.3/32"])), Ok(()));
        assert_eq!(validate(&spec(None, Some("d"), &["10.0.0.1"])), Ok(()));
        let err = |s: NetworkFenceSpec| validate(&s).unwrap_err();
        assert_eq!(
            err(spec(Some("c"), None, &[])),
            "Failed to validate Networkfence parameters: required parameter cidrs is not specified"
        );
        assert!(err(spec(None, None, &["10.0.0.1"])).ends_with("required parameter driver is not specified"));
        assert!(err(spec(None, Some(""), &["10.0.0.1"])).ends_with("required parameter driver is not specified"));
        assert!(
            err(spec(Some("c"), None, &["10.0.0.0/33"])).contains("prefix length \"33\" is not a number from 0 to 32")
        );
        assert!(err(spec(Some("c"), None, &["node-1/24"])).contains("\"node-1\" is not an IP address"));
        assert!(err(spec(Some("c"), None, &["fd00::/129"])).contains("from 0 to 128"));
        assert!(err(spec(Some("c"), None, &["10.0.0.0/"])).contains("prefix length"));
    }

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
        let err = class_parameters(Some(&map(&[("csiaddons.openshift.io/other", "x")]))).unwrap_err();
        assert!(err.contains("reserved prefix"), "{err}");
        assert!(class_parameters(Some(&map(&[(SECRET_NAME_KEY, "")]))).unwrap_err().contains("is empty"));
        assert!(class_parameters(Some(&map(&[(SECRET_NAME_KEY, "s")]))).unwrap_err().contains("without"));
    }

    #[test]
    fn the_class_wins_over_the_deprecated_inline_fields() {
        let mut s = spec(Some("c"), Some("d"), &["10.0.0.1/32"]);
        s.parameters = Some([("a".to_owned(), "spec".to_owned()), ("b".to_owned(), "spec".to_owned())].into());
        s.secret = Some(SecretReference { name: "spec-secret".into(), namespace: "spec-ns".into() });
        let class = ClassParameters {
            parameters: [("a".to_owned(), "class".to_owned())].into(),
            secret: Some(("class-secret".into(), "class-ns".into())),
        };
        let merged = request(&s, Some(&class));
        assert_eq!(merged.parameters.get("a").map(String::as_str), Some("class"));
        assert_eq!(merged.parameters.get("b").map(String::as_str), Some("spec"));
        assert_eq!((merged.secret_name.as_str(), merged.secret_namespace.as_str()), ("class-secret", "class-ns"));
        let inline = request(&s, None);
        assert_eq!(inline.secret_name, "spec-secret");
        assert_eq!(deprecated_fields(&s), ["spec.driver", "spec.secret", "spec.parameters"]);
    }

    #[test]
    fn the_empty_secret_upstreams_manager_writes_back_names_no_secret() {
        let decoded: NetworkFenceSpec =
            serde_json::from_value(serde_json::json!({"networkFenceClassName": "c", "cidrs": [], "secret": {}}))
                .unwrap();
        assert_eq!(decoded.secret, Some(SecretReference::default()));
        assert!(deprecated_fields(&decoded).is_empty());
        let class = ClassParameters { parameters: BTreeMap::new(), secret: None };
        assert_eq!(request(&decoded, Some(&class)).secret_name, "");
    }

    fn fence(state: FenceState, generation: i64, condition: Option<(&str, i64)>) -> NetworkFence {
        let mut fence = NetworkFence::new("f", spec(Some("c"), None, &["10.0.0.1"]));
        fence.spec.fence_state = state;
        fence.metadata.generation = Some(generation);
        if let Some((status, observed)) = condition {
            let mut c = crate::context::condition(APPLIED_CONDITION, true, "r", "", Some(observed));
            c.status = status.into();
            fence.status = Some(api::csiaddons::NetworkFenceStatus { conditions: vec![c], ..Default::default() });
        }
        fence
    }

    #[test]
    fn only_a_matching_state_of_this_generation_skips_the_call() {
        assert!(up_to_date(&fence(FenceState::Fenced, 2, Some(("True", 2)))));
        assert!(up_to_date(&fence(FenceState::Unfenced, 3, Some(("False", 3)))));
        assert!(!up_to_date(&fence(FenceState::Fenced, 3, Some(("True", 2)))));
        assert!(!up_to_date(&fence(FenceState::Fenced, 2, Some(("Unknown", 2)))));
        assert!(!up_to_date(&fence(FenceState::Unfenced, 2, None)));
    }

    #[test]
    fn a_deletion_unfences_unless_the_fence_is_known_not_applied() {
        assert!(maybe_applied(&fence(FenceState::Fenced, 1, Some(("True", 1)))));
        assert!(maybe_applied(&fence(FenceState::Fenced, 1, Some(("Unknown", 1)))));
        assert!(!maybe_applied(&fence(FenceState::Unfenced, 1, Some(("False", 1)))));
        // Never called: nothing to undo.
        assert!(!maybe_applied(&fence(FenceState::Fenced, 1, None)));
        // Left by upstream's manager: Fenced with a result.
        let mut upstream = fence(FenceState::Fenced, 1, None);
        upstream.status = Some(api::csiaddons::NetworkFenceStatus {
            result: Some(api::csiaddons::OperationResult::Succeeded),
            ..Default::default()
        });
        assert!(maybe_applied(&upstream));
    }

    #[test]
    fn class_names_read_a_json_array_and_nothing_else() {
        assert_eq!(class_names(Some(r#"["a","b"]"#)), ["a", "b"]);
        assert!(class_names(Some("a,b")).is_empty());
        assert!(class_names(None).is_empty());
    }
}
