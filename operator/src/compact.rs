//! Kubernetes objects as the manager reads them, with only the fields it uses. k8s-openapi's
//! Pod, PersistentVolume (every in-tree volume source) and VolumeAttachment (an inline PV spec)
//! bring deserialisers of some 250 KB of code that would stay mapped for the process's life, for
//! reads that need one to three fields.
use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ClusterResourceScope, NamespaceResourceScope};
use serde::Deserialize;

/// `kube::Resource` for a built-in kind: scope, group, version, kind, plural.
macro_rules! builtin_resource {
    ($type:ty, $scope:ty, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
        impl kube::Resource for $type {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }

            fn group(_: &()) -> Cow<'_, str> {
                $group.into()
            }

            fn version(_: &()) -> Cow<'_, str> {
                $version.into()
            }

            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A PersistentVolume: its name and, for a CSI volume, the driver and the volume handle.
#[derive(Clone, Debug, Deserialize)]
pub struct CsiPv {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<CsiPvSpec>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CsiPvSpec {
    #[serde(default)]
    pub csi: Option<CsiSource>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiSource {
    pub driver: String,
    pub volume_handle: String,
}

builtin_resource!(CsiPv, ClusterResourceScope, "", "v1", "PersistentVolume", "persistentvolumes");

/// A VolumeAttachment: whether it is attached, of which PV (none for an inline volume), to which
/// node.
#[derive(Clone, Debug, Default, Deserialize)]
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

builtin_resource!(Attachment, ClusterResourceScope, "storage.k8s.io", "v1", "VolumeAttachment", "volumeattachments");

/// A Pod: its IP, which a `pod://` endpoint is dialled at.
#[derive(Clone, Debug, Deserialize)]
pub struct PodIp {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<PodIpStatus>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct PodIpStatus {
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
}

builtin_resource!(PodIp, NamespaceResourceScope, "", "v1", "Pod", "pods");

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
