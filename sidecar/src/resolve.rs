//! From Kubernetes references to what a driver call needs: a PV's volume handle, attributes,
//! capability and staging path, and a Secret's data. The controller sends references, never
//! secret data; only the sidecar (and the CLI) read Secrets.
use std::collections::HashMap;

use api::proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use sha2::{Digest, Sha256};

use crate::csi_pv::CsiPv;

/// Why a reference could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("getting PersistentVolume {name}: {source}")]
    GetPv {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("PersistentVolume {0} is not a CSI volume (no spec.csi)")]
    NotCsi(String),
    /// A name no object can have: refused before any API request is made with it.
    #[error("{what} {name:?} is not a valid Kubernetes name: {why}")]
    BadName { what: &'static str, name: String, why: &'static str },
    #[error("getting Secret {namespace}/{name}: {source}")]
    GetSecret {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// A CSI PersistentVolume, as the driver knows it.
#[derive(Debug, Clone)]
pub struct Volume {
    pub pv_name: String,
    pub driver: String,
    pub handle: String,
    pub attributes: HashMap<String, String>,
    /// `spec.csi.nodeStageSecretRef` as (namespace, name).
    pub node_stage_secret: Option<(String, String)>,
    pub block: bool,
    pub access_modes: Vec<String>,
    /// `spec.claimRef` as (namespace, name), when bound.
    pub claim: Option<(String, String)>,
}

/// Checks `name` as a DNS-1123 subdomain (`label`: a DNS-1123 label, as namespaces are), the
/// names Kubernetes gives objects. A name from a request goes into a URL path: anything else is
/// refused here, so that a malformed name is the caller's error and not an API failure to retry.
pub fn check_name(what: &'static str, name: &str, label: bool) -> Result<(), ResolveError> {
    match api::names::dns1123_problem(name, label) {
        None => Ok(()),
        Some(why) => Err(ResolveError::BadName { what, name: name.chars().take(300).collect(), why }),
    }
}

pub async fn volume(client: &Client, pv_name: &str) -> Result<Volume, ResolveError> {
    check_name("PersistentVolume", pv_name, false)?;
    let pv = Api::<CsiPv>::all(client.clone())
        .get(pv_name)
        .await
        .map_err(|source| ResolveError::GetPv { name: pv_name.to_owned(), source })?;
    let spec = pv.spec.unwrap_or_default();
    let source = spec.csi.ok_or_else(|| ResolveError::NotCsi(pv_name.to_owned()))?;
    let node_stage_secret =
        source.node_stage_secret_ref.map(|r| (r.namespace.unwrap_or_default(), r.name.unwrap_or_default()));
    Ok(Volume {
        pv_name: pv_name.to_owned(),
        driver: source.driver,
        handle: source.volume_handle,
        attributes: source.volume_attributes.unwrap_or_default(),
        node_stage_secret,
        block: spec.volume_mode.as_deref() == Some("Block"),
        access_modes: spec.access_modes.unwrap_or_default(),
        claim: spec.claim_ref.and_then(|c| Some((c.namespace?, c.name?))),
    })
}

/// The Secret's data as strings (what CSI calls secrets). Never logged.
pub async fn secret(client: &Client, namespace: &str, name: &str) -> Result<HashMap<String, String>, ResolveError> {
    check_name("Secret namespace", namespace, true)?;
    check_name("Secret", name, false)?;
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|source| ResolveError::GetSecret { namespace: namespace.to_owned(), name: name.to_owned(), source })?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .chain(secret.string_data.unwrap_or_default())
        .collect())
}

/// The CSI access mode for a PV's access modes, as the kubelet maps them (single-node
/// multi-writer allowed): the widest mode wins.
pub fn access_mode(pv_modes: &[String]) -> csi::volume_capability::access_mode::Mode {
    use csi::volume_capability::access_mode::Mode;
    let has = |m: &str| pv_modes.iter().any(|x| x == m);
    if has("ReadWriteMany") {
        Mode::MultiNodeMultiWriter
    } else if has("ReadOnlyMany") {
        Mode::MultiNodeReaderOnly
    } else if has("ReadWriteOnce") {
        Mode::SingleNodeMultiWriter
    } else if has("ReadWriteOncePod") {
        Mode::SingleNodeSingleWriter
    } else {
        Mode::Unknown
    }
}

/// The kubelet's staging path for the volume under `staging_root`:
/// `<root>/<driver>/<hex sha256(handle)>/globalmount` for filesystems,
/// `<root>/volumeDevices/staging/<pv>` for block volumes.
pub fn staging_path(staging_root: &str, volume: &Volume) -> String {
    let root = staging_root.trim_end_matches('/');
    if volume.block {
        format!("{root}/volumeDevices/staging/{}", volume.pv_name)
    } else {
        let digest: String = Sha256::digest(volume.handle.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        format!("{root}/{}/{digest}/globalmount", volume.driver)
    }
}

/// The volume capability to send with node calls.
pub fn capability(volume: &Volume) -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: access_mode(&volume.access_modes) as i32 }),
        access_type: Some(if volume.block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume::default())
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_kubernetes_gives_objects_pass() {
        for good in ["pv-1", "pvc-0a1b.data", "a", &"a".repeat(253)] {
            assert!(check_name("PersistentVolume", good, false).is_ok(), "{good}");
        }
        for bad in ["", "PV", "a/../b", "a b", "-a", "a-", "ä", "a?x=1", &"a".repeat(254)] {
            assert!(check_name("PersistentVolume", bad, false).is_err(), "{bad}");
        }
        assert!(check_name("Secret namespace", "a.b", true).is_err());
        assert!(check_name("Secret namespace", &"a".repeat(64), true).is_err());
        let message = check_name("Secret", "a/b", false).unwrap_err().to_string();
        assert!(message.contains("\"a/b\" is not a valid Kubernetes name"), "{message}");
    }

    fn volume(block: bool) -> Volume {
        Volume {
            pv_name: "pv-1".into(),
            driver: "d.example.com".into(),
            handle: "handle-1".into(),
            attributes: HashMap::new(),
            node_stage_secret: None,
            block,
            access_modes: vec!["ReadWriteOnce".into()],
            claim: None,
        }
    }

    #[test]
    fn staging_paths_follow_the_kubelet() {
        // sha256("handle-1")
        let digest: String = Sha256::digest(b"handle-1").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            staging_path("/var/lib/kubelet/plugins/kubernetes.io/csi/", &volume(false)),
            format!("/var/lib/kubelet/plugins/kubernetes.io/csi/d.example.com/{digest}/globalmount")
        );
        assert_eq!(staging_path("/k/csi", &volume(true)), "/k/csi/volumeDevices/staging/pv-1");
        assert_eq!(digest.len(), 64);
    }

    #[test]
    fn access_modes_map_widest_first() {
        use csi::volume_capability::access_mode::Mode;
        let modes = |m: &[&str]| m.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(access_mode(&modes(&["ReadWriteOnce"])), Mode::SingleNodeMultiWriter);
        assert_eq!(access_mode(&modes(&["ReadWriteOncePod"])), Mode::SingleNodeSingleWriter);
        assert_eq!(access_mode(&modes(&["ReadWriteOnce", "ReadOnlyMany"])), Mode::MultiNodeReaderOnly);
        assert_eq!(access_mode(&modes(&["ReadWriteMany"])), Mode::MultiNodeMultiWriter);
        assert_eq!(access_mode(&[]), Mode::Unknown);
    }
}
