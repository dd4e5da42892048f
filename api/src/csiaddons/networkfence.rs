use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::OperationResult;

/// Whether the CIDRs of a NetworkFence are to be cut off from the storage or let back in.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FenceState {
    #[default]
    Fenced,
    Unfenced,
}

/// A Secret by name and namespace. Both fields are optional in the schema, as in upstream's:
/// upstream's manager writes `secret: {}` back on every update of a fence that names no secret
/// (a Go struct field), so requiring them would break it as a drop-in peer.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
// Both or neither (upstream's schema takes either alone). [differs: fence-secret-pair]
#[x_kube(
    validation = Rule::new("has(self.name) == has(self.namespace)").message("secret needs both name and namespace")
)]
pub struct SecretReference {
    /// Name of the Secret.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("name is immutable"))]
    pub name: String,
    /// Namespace of the Secret.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("namespace is immutable"))]
    pub namespace: String,
}

impl SecretReference {
    /// `secret: {}`: no Secret named.
    pub fn is_empty(&self) -> bool {
        self.name.is_empty() && self.namespace.is_empty()
    }
}

/// Desired state of a NetworkFence: block (or unblock) storage access from a set of CIDRs.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "csiaddons.openshift.io",
    version = "v1alpha1",
    kind = "NetworkFence",
    plural = "networkfences",
    status = "NetworkFenceStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Driver","type":"string","jsonPath":".spec.driver"}"#,
    printcolumn = r#"{"name":"Cidrs","type":"string","jsonPath":".spec.cidrs"}"#,
    printcolumn = r#"{"name":"FenceState","type":"string","jsonPath":".spec.fenceState"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Result","type":"string","jsonPath":".status.result"}"#
)]
#[x_kube(
    validation = Rule::new("has(self.driver) || has(self.networkFenceClassName)")
        .message("one of driver or networkFenceClassName must be present"),
    validation = Rule::new("has(self.networkFenceClassName) || has(self.secret)")
        .message("secret must be present when networkFenceClassName is not specified")
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::AlsoRequired("fenceState"))]
pub struct NetworkFenceSpec {
    /// The NetworkFenceClass that names the driver, its parameters and secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("networkFenceClassName is immutable"))]
    pub network_fence_class_name: Option<String>,
    /// Name of the CSI driver. Deprecated: use networkFenceClassName.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("driver is immutable"))]
    pub driver: Option<String>,
    /// `Fenced` blocks access from the CIDRs, `Unfenced` restores it.
    #[serde(default)]
    pub fence_state: FenceState,
    /// The address ranges to fence, e.g. `10.90.89.66/32`.
    pub cidrs: Vec<String>,
    /// Secret passed to the driver. Deprecated: use networkFenceClassName.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("secret is immutable"))]
    pub secret: Option<SecretReference>,
    /// Parameters passed to the driver. Deprecated: use networkFenceClassName.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("parameters are immutable"))]
    pub parameters: Option<BTreeMap<String, String>>,
}

/// Observed state of a NetworkFence.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkFenceStatus {
    /// `Succeeded` or `Failed`: the outcome of the last fence or unfence operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<OperationResult>,
    /// A human-readable description of the outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions of the fence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A driver and the parameters used to fence through it; referenced by NetworkFences and used to
/// list fenceable clients into CSIAddonsNode status.
// The object must have a spec (kube's derive requires it); upstream's schema lets it be left out,
// and the object then fails only once its controller reads it. [differs: spec-required]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "csiaddons.openshift.io",
    version = "v1alpha1",
    kind = "NetworkFenceClass",
    plural = "networkfenceclasses",
    status = "NetworkFenceClassStatus",
    derive = "Default",
    derive = "PartialEq"
)]
#[x_kube(validation = Rule::new("has(self.parameters) == has(oldSelf.parameters)").message("parameters are immutable"))]
pub struct NetworkFenceClassSpec {
    /// Name of the CSI driver.
    #[x_kube(validation = Rule::new("self == oldSelf").message("provisioner is immutable"))]
    pub provisioner: String,
    /// Parameters for the driver. The keys `csiaddons.openshift.io/networkfence-secret-name` and
    /// `csiaddons.openshift.io/networkfence-secret-namespace` name the Secret to use; they are not
    /// passed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("parameters are immutable"))]
    pub parameters: Option<BTreeMap<String, String>>,
}

/// Observed state of a NetworkFenceClass (none so far).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct NetworkFenceClassStatus {}
