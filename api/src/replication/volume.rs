use k8s_openapi::api::core::v1::TypedLocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The replication role asked of a volume or group.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationState {
    /// Serve I/O and replicate to the secondary.
    #[default]
    Primary,
    /// Receive replicated data.
    Secondary,
    /// Resynchronise a secondary from the primary.
    Resync,
}

/// The replication role a volume or group currently has.
// Listed in the schema, as the job results are. [differs: status-enums]
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObservedReplicationState {
    Primary,
    Secondary,
    Unknown,
}

/// Desired state of a VolumeReplication: replicate one PVC (or a VolumeGroupReplication's group).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "replication.storage.openshift.io",
    version = "v1alpha1",
    kind = "VolumeReplication",
    plural = "volumereplications",
    shortname = "vr",
    namespaced,
    status = "VolumeReplicationStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"volumeReplicationClass","type":"string","jsonPath":".spec.volumeReplicationClass"}"#,
    printcolumn = r#"{"name":"SourceKind","type":"string","jsonPath":".spec.dataSource.kind"}"#,
    printcolumn = r#"{"name":"SourceName","type":"string","jsonPath":".spec.dataSource.name"}"#,
    printcolumn = r#"{"name":"desiredState","type":"string","jsonPath":".spec.replicationState"}"#,
    printcolumn = r#"{"name":"currentState","type":"string","jsonPath":".status.state"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::AlsoRequired("autoResync"))]
pub struct VolumeReplicationSpec {
    /// The VolumeReplicationClass to replicate with.
    #[x_kube(validation = Rule::new("self == oldSelf").message("volumeReplicationClass is immutable"))]
    pub volume_replication_class: String,
    /// The role asked of the volume: `primary`, `secondary` or `resync`.
    pub replication_state: ReplicationState,
    /// What to replicate: a PersistentVolumeClaim or a VolumeGroupReplication, in this namespace.
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("dataSource is immutable"))]
    pub data_source: TypedLocalObjectReference,
    /// Resynchronise automatically when the driver reports the secondary as degraded.
    #[serde(default)]
    pub auto_resync: bool,
    /// An existing replication ID to use instead of enabling a new replication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_handle: Option<String>,
}

/// Observed state of a VolumeReplication; VolumeGroupReplication status carries the same fields.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeReplicationStatus {
    /// The role the volume has now: `Primary`, `Secondary` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ObservedReplicationState>,
    /// A human-readable description of the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions: Completed, Degraded, Resyncing, Validated, Replicating, DestinationInfoAvailable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the last state change started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_start_time: Option<Time>,
    /// When the last state change completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_completion_time: Option<Time>,
    /// When the last replication sync happened, as the driver reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// Bytes transferred by the last sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_bytes: Option<i64>,
    /// Duration of the last sync, e.g. `1m30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_duration: Option<String>,
    /// The volume's ID on the replication destination, once the driver reports it.
    #[serde(rename = "destinationVolumeID", default, skip_serializing_if = "Option::is_none")]
    pub destination_volume_id: Option<String>,
}
