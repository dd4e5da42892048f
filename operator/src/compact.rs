//! Kubernetes objects as the manager reads them, with only the fields it uses. k8s-openapi's
//! Pod, PersistentVolume (every in-tree volume source) and VolumeAttachment (an inline PV spec)
//! bring deserialisers of some 250 KB of code that would stay mapped for the process's life, for
//! reads that need one to three fields.
//!
//! Each takes its kind's identity (group, version, kind, plural, scope) from k8s-openapi's type:
//! those are constants, none of that type's code.
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// A PersistentVolume: its name, the claim bound to it and, for a CSI volume, the driver and the
/// volume handle.
#[derive(kube::Resource, Clone, Debug, Deserialize)]
#[resource(inherit = PersistentVolume)]
pub struct CsiPv {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<CsiPvSpec>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiPvSpec {
    #[serde(default)]
    pub csi: Option<CsiSource>,
    #[serde(default)]
    pub claim_ref: Option<ClaimRef>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ClaimRef {
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiSource {
    pub driver: String,
    pub volume_handle: String,
}

/// A VolumeAttachment: whether it is attached, of which PV (none for an inline volume), to which
/// node.
#[derive(kube::Resource, Clone, Debug, Default, Deserialize)]
#[resource(inherit = VolumeAttachment)]
pub struct Attachment {
    pub metadata: ObjectMeta,
    pub spec: AttachmentSpec,
    #[serde(default)]
    pub status: Option<AttachmentStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentSpec {
    #[serde(default)]
    pub node_name: String,
    pub source: AttachmentSource,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentSource {
    #[serde(default)]
    pub persistent_volume_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct AttachmentStatus {
    #[serde(default)]
    pub attached: bool,
}

/// A Pod: its IP, which a `pod://` endpoint is dialled at.
#[derive(kube::Resource, Clone, Debug, Deserialize)]
#[resource(inherit = Pod)]
pub struct PodIp {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<PodIpStatus>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct PodIpStatus {
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    /// Said when the Pod has no IP yet (`Pending` while its sandbox starts).
    #[serde(default)]
    pub phase: Option<String>,
}

/// A UUID in its canonical text form (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower-case hex, as
/// the API server writes uids) as the number it is: 16 bytes where the text takes 36 and a
/// `String`'s 24 more. Any other text gives None, so no two texts map to one number.
pub fn uuid(text: &str) -> Option<u128> {
    let text = text.as_bytes();
    if text.len() != 36 {
        return None;
    }
    let mut value: u128 = 0;
    for (i, byte) in text.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if *byte != b'-' {
                return None;
            }
            continue;
        }
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => return None,
        };
        value = (value << 4) | u128::from(digit);
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn decodes_a_csi_volume_and_a_non_csi_one_and_names_the_api() {
        let pv: CsiPv = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"csi": {"driver": "d.example", "volumeHandle": "h-1", "fsType": "ext4"}, "capacity": {"storage": "1Gi"}},
        }))
        .unwrap();
        let csi = pv.spec.and_then(|s| s.csi).unwrap();
        assert_eq!((csi.driver.as_str(), csi.volume_handle.as_str()), ("d.example", "h-1"));
        let nfs: CsiPv = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-2"}, "spec": {"nfs": {"server": "s", "path": "/"}}}))
        .unwrap();
        assert!(nfs.spec.and_then(|s| s.csi).is_none());
        assert_eq!(CsiPv::url_path(&(), None), "/api/v1/persistentvolumes");
        assert_eq!(CsiPv::api_version(&()), "v1");
    }

    #[test]
    fn decodes_an_attachment_with_an_inline_volume_spec_it_does_not_keep() {
        let attachment: Attachment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "csi-1"},
            "spec": {"attacher": "d", "nodeName": "n1",
                     "source": {"inlineVolumeSpec": {"csi": {"driver": "d", "volumeHandle": "h"}}}},
            "status": {"attached": true, "attachmentMetadata": {"k": "v"}},
        }))
        .unwrap();
        assert_eq!(attachment.spec.node_name, "n1");
        assert!(attachment.spec.source.persistent_volume_name.is_none());
        assert!(attachment.status.is_some_and(|s| s.attached));
        assert_eq!(Attachment::url_path(&(), None), "/apis/storage.k8s.io/v1/volumeattachments");
    }

    #[test]
    fn decodes_a_pods_ip_under_its_api_name() {
        let pod: PodIp = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]},
            "status": {"podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}], "phase": "Running"},
        }))
        .unwrap();
        assert_eq!(pod.status.and_then(|s| s.pod_ip).as_deref(), Some("10.0.0.7"));
        assert_eq!(PodIp::url_path(&(), Some("ns")), "/api/v1/namespaces/ns/pods");
    }
}
