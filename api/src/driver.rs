//! The `ReferenceCSIDriver` API (driver.csi-addons-rs.io/v1alpha1): one cluster-scoped object,
//! named after the driver, says how the reference CSI driver and its CSI-Addons wiring should run.
//! Modelled on the OpenShift storage operators' `ClusterCSIDriver`: a management state, a log
//! level, and conditions that say whether the driver is available, progressing or degraded.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The one object the operator manages: the driver's name. Others are told in their status that
/// they are ignored.
pub const DRIVER_NAME: &str = "reference.csi-addons-rs.io";

/// The annotation of a CSI driver's `CSIDriver` object that holds, in PEM, the CA bundle signing
/// its CSI-Addons sidecars' certificates. With it the CSI-Addons manager verifies that driver's
/// sidecars against that bundle, under the driver's name as the server name. The driver operator
/// writes it; any driver (or its installer) may.
pub const SIDECAR_CA_ANNOTATION: &str = "csi-addons-rs.io/sidecar-ca";

/// Whether the operator manages the driver.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ManagementState {
    /// The operator installs the driver and keeps it as the spec says.
    #[default]
    Managed,
    /// The operator leaves every object as it is: a user may change them by hand.
    Unmanaged,
    /// The operator removes the driver (never its StorageClasses or volumes).
    Removed,
}

/// How much the driver, its sidecars and the operator log, as OpenShift's operators name levels.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogLevel {
    #[default]
    Normal,
    Debug,
    Trace,
    TraceAll,
}

/// Images of the driver's containers. Unset ones default to the operator's environment (listed as
/// the CSV's `relatedImages`): the public images of this release and of registry.k8s.io.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Images {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csi_addons_sidecar: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attacher: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resizer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_registrar: Option<String>,
}

/// Where the driver's Pods run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacement {
    /// Nodes the node plugin (and the controller) may run on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// Which CSI-Addons classes the operator creates for the driver (each only once the driver's
/// sidecar advertises the capability).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AddonsClasses {
    #[serde(default = "yes")]
    pub volume_replication: bool,
    #[serde(default = "yes")]
    pub volume_group_replication: bool,
    #[serde(default = "yes")]
    pub network_fence: bool,
}

impl Default for AddonsClasses {
    fn default() -> Self {
        AddonsClasses { volume_replication: true, volume_group_replication: true, network_fence: true }
    }
}

fn yes() -> bool {
    true
}

/// The CSI-Addons wiring of the driver.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CsiAddons {
    /// Run the CSI-Addons sidecar next to each plugin, with certificates the manager verifies.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A reclaim-space schedule (`@weekly`, or a cron expression) annotated on the StorageClasses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_space_schedule: Option<String>,
    #[serde(default)]
    pub classes: AddonsClasses,
}

impl Default for CsiAddons {
    fn default() -> Self {
        CsiAddons { enabled: true, reclaim_space_schedule: None, classes: AddonsClasses::default() }
    }
}

/// A Secret the user keeps, copied into the driver's namespace in the driver's format.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
}

/// How the reference CSI driver should run on this cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "driver.csi-addons-rs.io",
    version = "v1alpha1",
    kind = "ReferenceCSIDriver",
    plural = "referencecsidrivers",
    status = "ReferenceCSIDriverStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".spec.managementState"}"#,
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceCSIDriverSpec {
    #[serde(default)]
    pub management_state: ManagementState,
    #[serde(default)]
    pub log_level: LogLevel,
    #[serde(default)]
    pub images: Images,
    #[serde(default)]
    pub node_placement: NodePlacement,
    /// The host directory that holds the volumes' files (default /var/lib/csi-addons-reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^/"))]
    pub volumes_directory: Option<String>,
    #[serde(default)]
    pub csi_addons: CsiAddons,
    /// Credentials for the classes' provisioner and fence secrets, copied into the driver's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<SecretReference>,
}

/// The generation of one object the operator wrote, as last seen.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GenerationStatus {
    pub group: String,
    pub resource: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    pub last_generation: i64,
}

/// A component and the version it runs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct OperandVersion {
    pub name: String,
    pub version: String,
}

/// What the operator observed: conditions `Available`, `Progressing`, `Degraded`, `Upgradeable`
/// and `BackendUnavailable`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceCSIDriverStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<GenerationStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<OperandVersion>,
    /// The storage profiles the backend offers on this cluster, as the driver last reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_spec_means_a_managed_driver_with_every_addon() {
        let spec: ReferenceCSIDriverSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec.management_state, ManagementState::Managed);
        assert_eq!(spec.log_level, LogLevel::Normal);
        assert!(spec.csi_addons.enabled);
        assert_eq!(spec.csi_addons.classes, AddonsClasses::default());
        assert!(spec.csi_addons.classes.volume_replication && spec.csi_addons.classes.network_fence);
        let partial: ReferenceCSIDriverSpec =
            serde_json::from_str(r#"{"csiAddons": {"classes": {"networkFence": false}}}"#).unwrap();
        assert!(partial.csi_addons.enabled, "an unset field keeps its default");
        assert!(!partial.csi_addons.classes.network_fence);
        assert!(partial.csi_addons.classes.volume_group_replication);
    }

    #[test]
    fn the_crd_is_cluster_scoped_with_the_states_as_an_enum() {
        use kube::CustomResourceExt;
        let crd = ReferenceCSIDriver::crd();
        assert_eq!(crd.spec.scope, "Cluster");
        let yaml = serde_yaml::to_string(&crd).unwrap();
        for state in ["Managed", "Unmanaged", "Removed"] {
            assert!(yaml.contains(&format!("- {state}")), "{state} in the schema's enum");
        }
    }
}
