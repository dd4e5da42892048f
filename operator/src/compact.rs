//! Kubernetes objects as the manager reads them, with only the fields it uses. k8s-openapi's
//! PersistentVolume decodes every in-tree volume source, and its VolumeAttachment an inline PV
//! spec: their deserialisers are some 80 KB of code that would stay mapped for the process's
//! life, for reads that need two or three fields.
use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::Deserialize;

/// `kube::Resource` for a cluster-scoped built-in kind: group, version, kind, plural.
macro_rules! cluster_resource {
    ($type:ty, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
        impl kube::Resource for $type {
            type DynamicType = ();
            type Scope = ClusterResourceScope;

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

impl CsiPv {
    /// The CSI source, for a CSI volume.
    pub fn csi(&self) -> Option<&CsiSource> {
        self.spec.as_ref()?.csi.as_ref()
    }
}

cluster_resource!(CsiPv, "", "v1", "PersistentVolume", "persistentvolumes");

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

cluster_resource!(Attachment, "storage.k8s.io", "v1", "VolumeAttachment", "volumeattachments");

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
        assert_eq!((pv.csi().unwrap().driver.as_str(), pv.csi().unwrap().volume_handle.as_str()), ("d.example", "h-1"));
        let nfs: CsiPv = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-2"}, "spec": {"nfs": {"server": "s", "path": "/"}}}))
        .unwrap();
        assert!(nfs.csi().is_none());
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
}
