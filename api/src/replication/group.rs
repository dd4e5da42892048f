use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{ReplicationState, VolumeReplicationStatus};

/// Which PVCs form the group.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct VolumeGroupReplicationSource {
    /// PVCs in the VolumeGroupReplication's namespace matching this selector are replicated together.
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("selector is immutable"))]
    pub selector: LabelSelector,
}

/// Desired state of a VolumeGroupReplication: replicate a group of PVCs consistently.
// The object must have a spec (kube's derive requires it); upstream's schema lets it be left out,
// and the object then fails only once its controller reads it. [differs: spec-required]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "replication.storage.openshift.io",
    version = "v1alpha1",
    kind = "VolumeGroupReplication",
    plural = "volumegroupreplications",
    shortname = "vgr",
    namespaced,
    status = "VolumeGroupReplicationStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"VolumeGroupReplicationClass","type":"string","jsonPath":".spec.volumeGroupReplicationClassName"}"#,
    printcolumn = r#"{"name":"VolumeGroupReplicationContent","type":"string","jsonPath":".spec.volumeGroupReplicationContentName"}"#,
    printcolumn = r#"{"name":"desiredState","type":"string","jsonPath":".spec.replicationState"}"#,
    printcolumn = r#"{"name":"currentState","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::AlsoRequired("autoResync"))]
pub struct VolumeGroupReplicationSpec {
    /// The VolumeGroupReplicationClass that creates the group.
    #[x_kube(validation = Rule::new("self == oldSelf").message("volumeGroupReplicationClassName is immutable"))]
    pub volume_group_replication_class_name: String,
    /// The VolumeReplicationClass of the group's VolumeReplication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("volumeReplicationClassName is immutable"))]
    pub volume_replication_class_name: Option<String>,
    /// Name of the group's VolumeReplication; `vr-<uid>` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("volumeReplicationName is immutable"))]
    pub volume_replication_name: Option<String>,
    /// Name of the group's VolumeGroupReplicationContent; `vgrcontent-<uid>` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("volumeGroupReplicationContentName is immutable"))]
    pub volume_group_replication_content_name: Option<String>,
    /// Which PVCs belong to the group.
    #[x_kube(validation = Rule::new("self == oldSelf").message("source is immutable"))]
    pub source: VolumeGroupReplicationSource,
    /// The role asked of the group: `primary`, `secondary` or `resync`.
    pub replication_state: ReplicationState,
    /// Resynchronise automatically when the driver reports the secondary as degraded.
    #[serde(default)]
    pub auto_resync: bool,
    /// The group and its replication are managed outside this operator, which leaves the object
    /// alone: no content, no VolumeReplication and no status are made for it.
    #[serde(default)]
    // Upstream's message says "source is immutable". [differs: external-message]
    #[x_kube(validation = Rule::new("self == oldSelf").message("external is immutable"))]
    pub external: bool,
}

/// Observed state of a VolumeGroupReplication.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupReplicationStatus {
    /// The replication state of the group, as for a VolumeReplication.
    #[serde(flatten)]
    pub replication: VolumeReplicationStatus,
    /// The PVCs currently in the group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::local_object_references")]
    pub persistent_volume_claims_ref_list: Vec<LocalObjectReference>,
}

/// The group as the driver knows it, with the volumes (by handle) it holds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupReplicationContentSource {
    /// CSI volume handles of the group's members.
    pub volume_handles: Vec<String>,
}

/// A volume group on the storage side, bound to one VolumeGroupReplication.
// The object must have a spec (kube's derive requires it); upstream's schema lets it be left out,
// and the object then fails only once its controller reads it. [differs: spec-required]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "replication.storage.openshift.io",
    version = "v1alpha1",
    kind = "VolumeGroupReplicationContent",
    plural = "volumegroupreplicationcontents",
    shortname = "vgrcontent",
    status = "VolumeGroupReplicationContentStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"VolumeGroupReplicationClass","type":"string","jsonPath":".spec.volumeGroupReplicationClassName"}"#,
    printcolumn = r#"{"name":"VolumeGroupReplication","type":"string","jsonPath":".spec.volumeGroupReplicationRef.name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupReplicationContentSpec {
    /// The VolumeGroupReplication this content is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    // Upstream's rule as it is written: the field is not nullable, so `self` is never null here.
    #[x_kube(validation = Rule::new("self != null ? has(self.name) && has(self.__namespace__) && has(self.uid) : true").message(
        "volumeGroupReplicationRef.name, volumeGroupReplicationRef.namespace and volumeGroupReplicationRef.uid must be set if volumeGroupReplicationRef is defined"
    ))]
    pub volume_group_replication_ref: Option<ObjectReference>,
    /// The group's ID, as returned by the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_replication_handle: Option<String>,
    /// Name of the CSI driver.
    pub provisioner: String,
    /// The VolumeGroupReplicationClass the group was created with.
    pub volume_group_replication_class_name: String,
    /// Attributes the driver returned for the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("field is immutable"))]
    pub volume_group_attributes: Option<BTreeMap<String, String>>,
    /// The group's members.
    pub source: VolumeGroupReplicationContentSource,
}

/// One member volume of a group and its counterpart on the replication destination.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeMapping {
    /// Name of the PersistentVolume.
    pub name: String,
    /// Its CSI volume handle.
    pub volume_handle: String,
    /// The handle of its replica on the destination, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_volume_handle: Option<String>,
}

/// Observed state of a VolumeGroupReplicationContent.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupReplicationContentStatus {
    /// The PersistentVolumes in the group. Deprecated: use persistentVolumeMappingList.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::local_object_references")]
    pub persistent_volume_ref_list: Vec<LocalObjectReference>,
    /// The PersistentVolumes in the group with their destination handles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub persistent_volume_mapping_list: Vec<PersistentVolumeMapping>,
    /// The group's ID on the replication destination, once known.
    #[serde(rename = "destinationVolumeGroupID", default, skip_serializing_if = "Option::is_none")]
    pub destination_volume_group_id: Option<String>,
    /// `Ready`: whether the group exists at the driver with the listed volumes; when False, the
    /// driver's error (ours: upstream keeps it in its log only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
