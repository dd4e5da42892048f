//! How the sidecar names and addresses its CSIAddonsNode, exactly as upstream does, so that an
//! upstream controller and ours find the same objects.
use std::net::IpAddr;

use sha2::{Digest, Sha256};

/// Kubernetes' limit on object names.
const MAX_NAME: usize = 253;
/// Past the limit: this many characters of the full name, `-`, then a hash.
const KEPT_PREFIX: usize = 234;
/// Hex characters of the SHA-256 kept (8 bytes).
const HASH_HEX: usize = 16;

/// `<nodeID>-<namespace>-<lowercase owner kind>-<owner name>`; past 253 characters, its first 234
/// characters, `-`, and 16 hex characters of SHA-256(nodeID + namespace + kind + owner name).
pub fn node_object_name(node_id: &str, namespace: &str, owner_kind: &str, owner_name: &str) -> String {
    let kind = owner_kind.to_lowercase();
    let full = format!("{node_id}-{namespace}-{kind}-{owner_name}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let digest = Sha256::digest(format!("{node_id}{namespace}{kind}{owner_name}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    // The name is ASCII in practice; cut on a character boundary all the same.
    let cut = (0..=KEPT_PREFIX).rev().find(|i| full.is_char_boundary(*i)).unwrap_or(0);
    format!("{}-{}", &full[..cut], &hex[..HASH_HEX])
}

/// The endpoint the controller dials: `pod://<pod>.<namespace>:<port>`, or `<ip>:<port>` when
/// `--controller-ip` is set (IPv6 in brackets).
pub fn endpoint(controller_ip: &str, pod: &str, namespace: &str, port: &str) -> String {
    if controller_ip.is_empty() {
        return format!("pod://{pod}.{namespace}:{port}");
    }
    match controller_ip.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{controller_ip}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_the_plain_concatenation() {
        assert_eq!(
            node_object_name("worker-1", "rook-ceph", "DaemonSet", "csi-rbdplugin"),
            "worker-1-rook-ceph-daemonset-csi-rbdplugin"
        );
    }

    #[test]
    fn long_names_are_cut_and_hashed_as_upstream() {
        let owner = "x".repeat(250);
        let name = node_object_name("node", "ns", "StatefulSet", &owner);
        assert_eq!(name.len(), 251);
        let full = format!("node-ns-statefulset-{owner}");
        assert_eq!(&name[..234], &full[..234]);
        let digest: String =
            Sha256::digest(format!("nodensstatefulset{owner}").as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(&name[234..], format!("-{}", &digest[..16]));
        // Exactly at the limit nothing is cut.
        let at_limit = "y".repeat(253 - "node-ns-daemonset-".len());
        assert_eq!(node_object_name("node", "ns", "DaemonSet", &at_limit).len(), 253);
    }

    #[test]
    fn endpoints() {
        assert_eq!(endpoint("", "csi-rbdplugin-x", "rook-ceph", "9070"), "pod://csi-rbdplugin-x.rook-ceph:9070");
        assert_eq!(endpoint("10.0.0.5", "p", "n", "9070"), "10.0.0.5:9070");
        assert_eq!(endpoint("fd00::5", "p", "n", "9070"), "[fd00::5]:9070");
    }
}
