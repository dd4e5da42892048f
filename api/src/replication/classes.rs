use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A driver and the parameters used to replicate single volumes through it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "replication.storage.openshift.io",
    version = "v1alpha1",
    kind = "VolumeReplicationClass",
    plural = "volumereplicationclasses",
    shortname = "vrc",
    status = "VolumeReplicationClassStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"provisioner","type":"string","jsonPath":".spec.provisioner"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.parameters) == has(oldSelf.parameters)").message("parameters are immutable"))]
pub struct VolumeReplicationClassSpec {
    /// Name of the CSI driver.
    #[x_kube(validation = Rule::new("self == oldSelf").message("provisioner is immutable"))]
    pub provisioner: String,
    /// Parameters for the driver. Keys under `replication.storage.openshift.io/` name the Secrets
    /// to use and are not passed on; `schedulingInterval` also sets how often replication info is
    /// polled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("parameters are immutable"))]
    pub parameters: Option<BTreeMap<String, String>>,
}

/// Observed state of a VolumeReplicationClass (none so far).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct VolumeReplicationClassStatus {}

/// A driver and the parameters used to replicate groups of volumes through it.
// The object must have a spec (kube's derive requires it); upstream's schema lets it be left out,
// and the object then fails only once its controller reads it. [differs: spec-required]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "replication.storage.openshift.io",
    version = "v1alpha1",
    kind = "VolumeGroupReplicationClass",
    plural = "volumegroupreplicationclasses",
    shortname = "vgrc",
    status = "VolumeGroupReplicationClassStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"provisioner","type":"string","jsonPath":".spec.provisioner"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.parameters) == has(oldSelf.parameters)").message("parameters are immutable"))]
pub struct VolumeGroupReplicationClassSpec {
    /// Name of the CSI driver.
    #[x_kube(validation = Rule::new("self == oldSelf").message("provisioner is immutable"))]
    pub provisioner: String,
    /// Parameters for the driver. Keys under `replication.storage.openshift.io/` name the Secrets
    /// to use and are not passed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("parameters are immutable"))]
    pub parameters: Option<BTreeMap<String, String>>,
}

/// Observed state of a VolumeGroupReplicationClass (none so far).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct VolumeGroupReplicationClassStatus {}
