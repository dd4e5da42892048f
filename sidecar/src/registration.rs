//! The sidecar's CSIAddonsNode: named, owned and addressed exactly as upstream does (so an
//! upstream controller and ours find the same objects), written at start, re-created when
//! deleted, and retried with backoff instead of exiting (upstream's sidecar exits).
//! [differs: sidecar-keeps-running]
use std::net::IpAddr;
use std::time::Duration;

use api::csiaddons::{CSIAddonsNode, CSIAddonsNodeDriver, CSIAddonsNodeSpec};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// Annotations upstream's sidecar sets.
pub const CREATED_BY_POD_UID: &str = "sidecar.csiaddons.openshift.io/createdByPodUID";
pub const LAST_UPDATED_AT: &str = "sidecar.csiaddons.openshift.io/lastUpdatedAt";

/// Why registering failed (every case is retried).
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("reading Pod {namespace}/{name}: {source}")]
    Pod {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Pod {0} has no owner: run the sidecar in a DaemonSet, Deployment or StatefulSet")]
    NoOwner(String),
    #[error("reading ReplicaSet {name}: {source}")]
    ReplicaSet {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("CSIAddonsNode {0} is being deleted; it is re-created once it is gone")]
    BeingDeleted(String),
    #[error("writing CSIAddonsNode {name}: {source}")]
    Write {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Who this sidecar is, from the downward API flags.
#[derive(Debug, Clone)]
pub struct Identity {
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
    pub node_id: String,
    pub endpoint: String,
}

/// What a CSIAddonsNode is named after and owned by.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub kind: String,
    pub name: String,
    pub reference: OwnerReference,
}

fn controller_or_first(refs: Option<&Vec<OwnerReference>>) -> Option<&OwnerReference> {
    let refs = refs?;
    refs.iter().find(|r| r.controller == Some(true)).or_else(|| refs.first())
}

/// A copy of `r` without the controller flags (the CSIAddonsNode is not a managed child).
fn plain(r: &OwnerReference) -> OwnerReference {
    OwnerReference {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
        ..Default::default()
    }
}

/// The owner as upstream resolves it: a ReplicaSet's Deployment names the object but the Pod
/// owns it (Deployment Pods move between nodes); any other owner does both.
pub async fn owner(client: &kube::Client, namespace: &str, pod_name: &str) -> Result<Owner, RegistrationError> {
    // Metadata only: the owner is all that is needed, and whole Pods and ReplicaSets are large
    // types to deserialize (and to carry in the binary).
    let pod = Api::<Pod>::namespaced(client.clone(), namespace).get_metadata(pod_name).await.map_err(|source| {
        RegistrationError::Pod { namespace: namespace.to_owned(), name: pod_name.to_owned(), source }
    })?;
    let first = controller_or_first(pod.metadata.owner_references.as_ref())
        .ok_or_else(|| RegistrationError::NoOwner(format!("{namespace}/{pod_name}")))?;
    if first.kind != "ReplicaSet" {
        return Ok(Owner { kind: first.kind.clone(), name: first.name.clone(), reference: plain(first) });
    }
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), namespace)
        .get_metadata(&first.name)
        .await
        .map_err(|source| RegistrationError::ReplicaSet { name: first.name.clone(), source })?;
    let (kind, name) = match controller_or_first(rs.metadata.owner_references.as_ref()) {
        Some(deployment) => (deployment.kind.clone(), deployment.name.clone()),
        None => (first.kind.clone(), first.name.clone()),
    };
    let reference = OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: pod_name.to_owned(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        ..Default::default()
    };
    Ok(Owner { kind, name, reference })
}

/// The object to write.
pub fn desired(identity: &Identity, owner: &Owner, driver: &str, now: &str) -> CSIAddonsNode {
    let name = node_object_name(&identity.node_id, &identity.namespace, &owner.kind, &owner.name);
    let mut node = CSIAddonsNode::new(
        &name,
        CSIAddonsNodeSpec {
            driver: CSIAddonsNodeDriver {
                name: driver.to_owned(),
                endpoint: identity.endpoint.clone(),
                node_id: identity.node_id.clone(),
            },
        },
    );
    node.metadata.namespace = Some(identity.namespace.clone());
    node.metadata.owner_references = Some(vec![owner.reference.clone()]);
    node.metadata.annotations = Some(
        [
            (CREATED_BY_POD_UID.to_owned(), identity.pod_uid.clone()),
            (LAST_UPDATED_AT.to_owned(), now.to_owned()),
            (api::csiaddons::SIDECAR_POD_ANNOTATION.to_owned(), identity.pod.clone()),
        ]
        .into(),
    );
    node
}

/// Creates the object, or updates spec, owner and annotations of the existing one (other
/// annotations, finalizers and status are left alone).
pub async fn write(client: &kube::Client, node: &CSIAddonsNode) -> Result<(), RegistrationError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let namespace = node.metadata.namespace.clone().unwrap_or_default();
    let api = Api::<CSIAddonsNode>::namespaced(client.clone(), &namespace);
    let err = |source| RegistrationError::Write { name: format!("{namespace}/{name}"), source };
    match api.get_opt(&name).await.map_err(err)? {
        None => api.create(&PostParams::default(), node).await.map(drop).map_err(err),
        Some(existing) if existing.metadata.deletion_timestamp.is_some() => {
            Err(RegistrationError::BeingDeleted(format!("{namespace}/{name}")))
        }
        Some(_) => {
            let patch = serde_json::json!({
                "metadata": {"annotations": node.metadata.annotations, "ownerReferences": node.metadata.owner_references},
                "spec": node.spec,
            });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop).map_err(err)
        }
    }
}

/// Backoff between failed registrations.
const RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Keeps the CSIAddonsNode in place until `stop`: writes it, watches it, writes it again when
/// it is deleted; `registered` says whether it currently exists.
pub async fn keep_registered(
    client: kube::Client,
    identity: Identity,
    driver: String,
    registered: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut wait = RETRY.0;
    loop {
        let attempt = async {
            let owner = owner(&client, &identity.namespace, &identity.pod).await?;
            let node = desired(&identity, &owner, &driver, &now_rfc3339());
            write(&client, &node).await?;
            Ok::<_, RegistrationError>(node.metadata.name.unwrap_or_default())
        };
        let result = tokio::select! {
            r = attempt => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match result {
            Ok(name) => {
                tracing::info!(csiaddonsnode = %format!("{}/{name}", identity.namespace), "registered");
                registered.send_replace(true);
                wait = RETRY.0;
                tokio::select! {
                    () = watch_until_gone(&client, &identity.namespace, &name) => {
                        tracing::warn!(csiaddonsnode = %name, "CSIAddonsNode was deleted; registering again");
                    }
                    _ = stop.wait_for(|s| *s) => return,
                }
                registered.send_replace(false);
            }
            Err(e) => {
                registered.send_replace(false);
                tracing::warn!(error = %e, retry_in = ?wait, "registration failed");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                wait = (wait * 2).min(RETRY.1);
            }
        }
    }
}

/// Returns once the object no longer exists (a delete event, or a relist that misses it).
async fn watch_until_gone(client: &kube::Client, namespace: &str, name: &str) {
    let api = Api::<CSIAddonsNode>::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher::watcher(api, config));
    let mut seen = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => seen = false,
            Ok(watcher::Event::InitApply(_) | watcher::Event::Apply(_)) => seen = true,
            Ok(watcher::Event::InitDone) if !seen => return,
            Ok(watcher::Event::Delete(_)) => return,
            Ok(watcher::Event::InitDone) => {}
            Err(e) => {
                tracing::debug!(error = %e, "watching the CSIAddonsNode; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Now, as Kubernetes writes timestamps.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

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
    // A cut right after a `.` or `-` (node names are often FQDNs) would not be a valid name.
    format!("{}-{}", full[..cut].trim_end_matches(['.', '-']), &hex[..HASH_HEX])
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
