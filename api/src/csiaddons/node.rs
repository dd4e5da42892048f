use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A CSI-Addons sidecar registered for one driver on one node (or one controller-plugin Pod).
/// Written by the sidecar; the operator connects to `spec.driver.endpoint` and reports in `status`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "csiaddons.openshift.io",
    version = "v1alpha1",
    kind = "CSIAddonsNode",
    plural = "csiaddonsnodes",
    namespaced,
    status = "CSIAddonsNodeStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"namespace","type":"string","jsonPath":".metadata.namespace"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"DriverName","type":"string","jsonPath":".spec.driver.name"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.driver.endpoint"}"#,
    printcolumn = r#"{"name":"NodeID","type":"string","jsonPath":".spec.driver.nodeID"}"#
)]
pub struct CSIAddonsNodeSpec {
    /// The driver this sidecar serves and where the sidecar listens.
    pub driver: CSIAddonsNodeDriver,
}

/// Identity and address of a CSI-Addons sidecar.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CSIAddonsNodeDriver {
    /// Name of the CSI driver; must equal the name the driver returns from CSI-Addons GetIdentity.
    #[x_kube(validation = Rule::new("self == oldSelf").message("name is immutable"))]
    pub name: String,
    /// Where the sidecar listens: `pod://<pod>.<namespace>:<port>` (resolved to the Pod's IP) or
    /// `<host>:<port>`.
    pub endpoint: String,
    /// The CSI node ID of the node the sidecar runs on.
    #[serde(rename = "nodeID")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("nodeID is immutable"))]
    pub node_id: String,
}

/// Connection state of a CSIAddonsNode, as the operator last saw it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CSIAddonsNodeStatus {
    /// `Connected`, `Retrying` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// A human-readable explanation of the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A machine-readable reason for the state (upstream keeps `currentAttempt: N` here while
    /// retrying).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Failed connection attempts since the last success (csi-addons-rs; upstream counts them in
    /// `reason`). After 3 the CSIAddonsNode is deleted, and a live sidecar registers it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub retries: Option<i32>,
    /// Capabilities the driver advertised, each as `<capability type>.<VALUE>`, e.g.
    /// `reclaim_space.ONLINE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// Clients the driver reported for each NetworkFenceClass (GetFenceClients).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_fence_client_status: Vec<NetworkFenceClientStatus>,
}

/// The fence clients found through one NetworkFenceClass.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkFenceClientStatus {
    /// The NetworkFenceClass the clients were listed with.
    pub network_fence_class_name: String,
    /// The clients, each with its address ranges.
    #[serde(rename = "ClientDetails")]
    pub client_details: Vec<ClientDetail>,
}

/// One storage client that could be fenced.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ClientDetail {
    /// The client's identifier as the driver reports it.
    pub id: String,
    /// The client's addresses, as CIDR blocks.
    pub cidrs: Vec<String>,
}
