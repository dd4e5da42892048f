//! What a CSIAddonsNode asks, decided without I/O: whether its spec can be used, the Pod its
//! sidecar runs in, and what a failed connection attempt leads to (a retry after a growing wait,
//! or, after the last, the object's deletion so that the sidecar registers again). Unlike
//! upstream, the retry delay is read as seconds and the count is a status field.
//! [differs: node-retries]
use std::time::Duration;

use api::csiaddons::{CSIAddonsNode, SIDECAR_POD_ANNOTATION};
use kube::ResourceExt;

use crate::core::backoff::Policy;
use crate::sidecars::pool::{EndpointError, Target, parse_endpoint};

/// A connected sidecar is re-checked this often (upstream: 1 hour); no retry waits longer.
pub const RECHECK: Duration = Duration::from_secs(3600);
/// Failed attempts before the CSIAddonsNode is deleted (the sidecar registers it again).
pub const MAX_RETRIES: u32 = 3;

/// What to do after a failed connection attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterFailure {
    /// Retry attempt `attempt` of MAX_RETRIES after `delay`.
    Retry { attempt: u32, delay: Duration },
    /// Give up: delete the CSIAddonsNode (a live sidecar re-creates it).
    Delete,
}

/// The backoff of connection attempts: from `csi-addons-node-retry-delay`, doubling (2 s, 4 s,
/// 8 s with upstream's default of 2 s), at most an hour whatever the setting.
pub fn retry_policy(base: Duration) -> Policy {
    Policy { first: base, longest: RECHECK }
}

/// `failures_so_far` failed before this one.
pub fn after_failure(failures_so_far: u32, base: Duration) -> AfterFailure {
    if failures_so_far >= MAX_RETRIES {
        return AfterFailure::Delete;
    }
    let attempt = failures_so_far + 1;
    AfterFailure::Retry { attempt, delay: retry_policy(base).delay(attempt) }
}

/// The Pod a CSIAddonsNode's sidecar runs in: named by a `pod://` endpoint, or by our sidecar's
/// annotation for `ip:port` ones; the CSIAddonsNode's own name when neither says.
pub fn sidecar_pod(node: &CSIAddonsNode, target: &Target) -> String {
    match target {
        Target::Pod { name, .. } => name.clone(),
        Target::Address { .. } => {
            node.annotations().get(SIDECAR_POD_ANNOTATION).cloned().unwrap_or_else(|| node.name_any())
        }
    }
}

/// Why a CSIAddonsNode's spec cannot be used: its status message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSpec {
    #[error("spec.driver.name is empty")]
    NoDriverName,
    #[error("spec.driver.endpoint is empty")]
    NoEndpoint,
    #[error("spec.driver.endpoint {endpoint:?}: {source}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: EndpointError,
    },
    #[error(
        "spec.driver.endpoint names a Pod in namespace {named:?}: a CSIAddonsNode may only name a Pod of its own \
         namespace ({own:?}), as a sidecar registers itself"
    )]
    ForeignNamespace { named: String, own: String },
}

/// Checks the spec.
pub fn validate(node: &CSIAddonsNode) -> Result<Target, InvalidSpec> {
    let driver = &node.spec.driver;
    if driver.name.is_empty() {
        return Err(InvalidSpec::NoDriverName);
    }
    if driver.endpoint.is_empty() {
        return Err(InvalidSpec::NoEndpoint);
    }
    let target = parse_endpoint(&driver.endpoint)
        .map_err(|source| InvalidSpec::Endpoint { endpoint: driver.endpoint.clone(), source })?;
    // Whoever may create a CSIAddonsNode in one namespace must not have the manager dial (and send
    // its token to) a Pod of another.
    let own = node.metadata.namespace.as_deref().unwrap_or_default();
    match &target {
        Target::Pod { namespace, .. } if namespace != own => {
            Err(InvalidSpec::ForeignNamespace { named: namespace.clone(), own: own.to_owned() })
        }
        _ => Ok(target),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::csiaddons::{CSIAddonsNodeDriver, CSIAddonsNodeSpec};

    fn node(endpoint: &str) -> CSIAddonsNode {
        let mut node = CSIAddonsNode::new(
            "n1-ns-daemonset-plugin",
            CSIAddonsNodeSpec {
                driver: CSIAddonsNodeDriver { name: "d".into(), endpoint: endpoint.into(), node_id: "n1".into() },
            },
        );
        node.metadata.namespace = Some("ns".into());
        node
    }

    #[test]
    fn retries_wait_seconds_and_end_in_deletion() {
        let base = Duration::from_secs(2);
        assert_eq!(after_failure(0, base), AfterFailure::Retry { attempt: 1, delay: Duration::from_secs(2) });
        assert_eq!(after_failure(2, base), AfterFailure::Retry { attempt: 3, delay: Duration::from_secs(8) });
        assert_eq!(after_failure(3, base), AfterFailure::Delete);
        // A base of 0 still waits (upstream's main branch reads the setting as nanoseconds: no wait).
        assert_eq!(after_failure(0, Duration::ZERO), AfterFailure::Retry { attempt: 1, delay: Duration::from_secs(1) });
        // Any setting is safe: the delay is capped at an hour.
        assert_eq!(after_failure(2, Duration::from_secs(u64::MAX)), AfterFailure::Retry { attempt: 3, delay: RECHECK });
    }

    #[test]
    fn the_pool_key_names_the_sidecar_pod_for_both_endpoint_forms() {
        let pod = node("pod://csi-plugin-x.ns:9070");
        assert_eq!(sidecar_pod(&pod, &validate(&pod).unwrap()), "csi-plugin-x");
        let mut address = node("127.0.0.1:9070");
        let target = validate(&address).unwrap();
        assert_eq!(sidecar_pod(&address, &target), "n1-ns-daemonset-plugin", "no annotation: the object's name");
        address.metadata.annotations = Some([(SIDECAR_POD_ANNOTATION.to_owned(), "csi-plugin-y".to_owned())].into());
        assert_eq!(sidecar_pod(&address, &target), "csi-plugin-y");
    }

    #[test]
    fn bad_specs_are_named() {
        assert!(validate(&node("")).unwrap_err().to_string().contains("endpoint is empty"));
        assert!(validate(&node("dns:///x:1")).unwrap_err().to_string().contains("only pod://"));
        let mut nameless = node("pod://p.ns:1");
        nameless.spec.driver.name.clear();
        assert!(validate(&nameless).unwrap_err().to_string().contains("name is empty"));
        let foreign = validate(&node("pod://p.kube-system:1")).unwrap_err().to_string();
        assert!(foreign.contains("\"kube-system\"") && foreign.contains("its own namespace (\"ns\")"), "{foreign}");
    }
}
