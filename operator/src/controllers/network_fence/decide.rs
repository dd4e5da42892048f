//! What a NetworkFence means, decided without I/O: validation with upstream's messages, the
//! request sent to the sidecar (a class's parameters merged in), and whether the fence is (or may
//! be) applied at the driver.
use std::collections::BTreeMap;
use std::net::IpAddr;

use api::csiaddons::{FenceState, NetworkFence, NetworkFenceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::controllers::network_fence_class::decide::ClassParameters;

/// Capability a sidecar must advertise to fence and unfence.
pub const NETWORK_FENCE: &str = "network_fence.NETWORK_FENCE";
/// Upstream's finalizer on NetworkFences.
pub const FINALIZER: &str = "csiaddons.openshift.io/network-fence";
/// Ours: `"true"` on a NetworkFence being deleted removes the finalizer without unfencing (for a
/// fence whose class or sidecar is gone for good; the CIDRs may stay fenced at the driver).
pub const DELETE_WITHOUT_UNFENCE: &str = "csiaddons.openshift.io/delete-without-unfence";
/// Condition: whether the CIDRs are fenced at the driver (Unknown after a failed call).
pub const APPLIED_CONDITION: &str = "FenceApplied";
/// Condition: what a deletion waits for before the finalizer goes.
pub const DELETION_CONDITION: &str = "DeletionBlocked";

pub const FENCE_SUCCEEDED: &str = "fencing operation successful";
pub const UNFENCE_SUCCEEDED: &str = "unfencing operation successful";

/// Why a NetworkFence's spec cannot be carried out; shown as its status message, in upstream's
/// words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSpec {
    #[error("Failed to validate Networkfence parameters: required parameter driver is not specified")]
    NoDriver,
    #[error("Failed to validate Networkfence parameters: required parameter cidrs is not specified")]
    NoCidrs,
    #[error("Failed to validate Networkfence parameters: cidr {cidr:?}: {why}")]
    BadCidr { cidr: String, why: CidrError },
}

/// What is wrong with one CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("{0:?} is not an IP address")]
    NotAnAddress(String),
    #[error("prefix length {length:?} is not a number from 0 to {max} (digits alone, no leading zero)")]
    PrefixLength { length: String, max: u8 },
}

/// Checks a NetworkFence's spec.
pub fn validate(spec: &NetworkFenceSpec) -> Result<(), InvalidSpec> {
    let has_class = spec.network_fence_class_name.as_deref().is_some_and(|c| !c.is_empty());
    if !has_class && spec.driver.as_deref().is_none_or(str::is_empty) {
        return Err(InvalidSpec::NoDriver);
    }
    if spec.cidrs.is_empty() {
        return Err(InvalidSpec::NoCidrs);
    }
    for cidr in &spec.cidrs {
        check_cidr(cidr).map_err(|why| InvalidSpec::BadCidr { cidr: cidr.clone(), why })?;
    }
    Ok(())
}

/// The annotation a NetworkFence needs to fence every address (`0.0.0.0/0` or `::/0`); upstream
/// fences every address without one. [differs: fence-everything]
pub const FENCE_EVERYTHING_ANNOTATION: &str = "csi-addons-rs.io/fence-everything";

/// A fence of every address cuts every client off the storage, the cluster's own nodes too: a slip
/// of the keyboard away from an outage. It is refused unless the object says it means it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cidr {cidr:?} fences every address, every node of the cluster included; set the annotation \
     {FENCE_EVERYTHING_ANNOTATION}: \"true\" on the NetworkFence if that is meant"
)]
pub struct FencesEverything {
    pub cidr: String,
}

/// Checks that a fence of every address is meant (unfencing is always allowed).
pub fn check_reach(spec: &NetworkFenceSpec, annotations: &BTreeMap<String, String>) -> Result<(), FencesEverything> {
    let meant = annotations.get(FENCE_EVERYTHING_ANNOTATION).is_some_and(|v| v == "true");
    if spec.fence_state != FenceState::Fenced || meant {
        return Ok(());
    }
    // The same test as the admission policy's (`endsWith('/0')`): `validate` admits no other way
    // of writing a prefix length of 0.
    let everything = |cidr: &&String| cidr.ends_with("/0");
    match spec.cidrs.iter().find(everything) {
        Some(cidr) => Err(FencesEverything { cidr: cidr.clone() }),
        None => Ok(()),
    }
}

/// An address or an address block (`10.0.0.0/24`, `fd00::/64`, `10.1.2.3`).
fn check_cidr(cidr: &str) -> Result<(), CidrError> {
    let (address, length) = match cidr.split_once('/') {
        Some((address, length)) => (address, Some(length)),
        None => (cidr, None),
    };
    let ip: IpAddr = address.parse().map_err(|_| CidrError::NotAnAddress(address.to_owned()))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if let Some(length) = length
        && prefix_length(length).is_none_or(|n| n > max)
    {
        return Err(CidrError::PrefixLength { length: length.to_owned(), max });
    }
    Ok(())
}

/// A prefix length written as Go's `netip.ParsePrefix` accepts it: decimal digits without a sign
/// or a leading zero, which every driver's parser reads alike. Rust's own parse would also take
/// `+0`, and Go's older `net.ParseCIDR` `00`: other spellings of 0 that the admission policy's test
/// for a fence of every address would not see.
fn prefix_length(length: &str) -> Option<u8> {
    let digits = !length.is_empty() && length.bytes().all(|b| b.is_ascii_digit());
    if !digits || (length.len() > 1 && length.starts_with('0')) {
        return None;
    }
    length.parse().ok()
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

/// Whether the driver already holds the spec's state for this generation, as the `FenceApplied`
/// condition records it: nothing to call (upstream's manager calls the driver for every fence each
/// time it starts). [differs: fence-applied]
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
    fn a_fence_of_every_address_needs_the_annotation_and_unfencing_does_not() {
        let none = BTreeMap::new();
        let everything = spec(Some("c"), None, &["10.0.0.1/32", "0.0.0.0/0"]);
        let refused = check_reach(&everything, &none).unwrap_err().to_string();
        assert!(refused.contains("\"0.0.0.0/0\"") && refused.contains(FENCE_EVERYTHING_ANNOTATION), "{refused}");
        assert!(check_reach(&spec(Some("c"), None, &["::/0"]), &none).is_err());
        assert!(check_reach(&spec(Some("c"), None, &["10.0.0.0/8", "fd00::/64"]), &none).is_ok());
        let meant = BTreeMap::from([(FENCE_EVERYTHING_ANNOTATION.to_owned(), "true".to_owned())]);
        assert!(check_reach(&everything, &meant).is_ok());
        let unfence = NetworkFenceSpec { fence_state: FenceState::Unfenced, ..everything };
        assert!(check_reach(&unfence, &none).is_ok(), "taking a fence of everything away is always allowed");
    }

    #[test]
    fn validation_speaks_upstreams_words_and_checks_every_cidr() {
        assert_eq!(validate(&spec(Some("c"), None, &["10.0.0.0/24", "fd00::5", "10.1.2.3/32"])), Ok(()));
        assert_eq!(validate(&spec(None, Some("d"), &["10.0.0.1"])), Ok(()));
        let err = |s: NetworkFenceSpec| validate(&s).unwrap_err().to_string();
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
        // Other spellings of a prefix length, 0 among them, that would slip past the test for a
        // fence of every address.
        for odd in ["0.0.0.0/00", "0.0.0.0/+0", "::/-0", "10.0.0.0/08", "10.0.0.0/ 8", "10.0.0.0/8 "] {
            assert!(err(spec(Some("c"), None, &[odd])).contains("no leading zero"), "{odd}");
        }
        assert_eq!(validate(&spec(Some("c"), None, &["0.0.0.0/0", "10.0.0.0/10", "fd00::/128"])), Ok(()));
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
            let mut c = crate::core::status::condition(APPLIED_CONDITION, true, "r", "", Some(observed));
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
}
