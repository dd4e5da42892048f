//! NetworkFence and NetworkFenceClass end to end: the real manager process, the real sidecar
//! process, and the reference driver, whose fence list is read back over its own socket. The
//! stage (driver, sidecar, manager) serves the replication suite too.
use std::collections::BTreeSet;

use api::proto::fence as pb;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::poll::MINUTE;

use crate::harness::driver_process::{DriverProcess, start_driver};
use crate::harness::manager::{Manager, ManagerIdentity, warning_in};
use crate::harness::sidecar::{Serving, SidecarProcess, Workload, sidecar_pod};
use crate::harness::support::dynamic;
use crate::harness::support::unix_channel;

const NODE: &str = "node-f";
/// The reference driver's node plugin registers itself as a fence client at this address.
const NODE_IP: &str = "10.77.0.5";

pub struct FenceStage {
    pub client: kube::Client,
    pub namespace: String,
    pub driver_name: String,
    pub driver: DriverProcess,
    pub manager: Manager,
    _sidecar: SidecarProcess,
    _identity: ManagerIdentity,
}

impl FenceStage {
    pub async fn new(prefix: &str) -> Self {
        Self::with_flags(prefix, &[]).await
    }

    /// A stage whose manager gets `flags` too.
    pub async fn with_flags(prefix: &str, flags: &[&str]) -> Self {
        let cp = testenv::shared();
        let client = cp.client().await.unwrap();
        let namespace = cp.namespace(&client, prefix).await.unwrap();
        let driver_name = format!("{namespace}.fence.csi-addons-rs.io");
        let driver = start_driver(&["--driver-name", &driver_name, "--node-ip", NODE_IP]);
        let identity = ManagerIdentity::new(&client, &namespace).await;
        let mut args = vec!["--enable-auth=false"];
        args.extend(flags);
        let manager = Manager::start(&namespace, &identity.kubeconfig(), &args);
        let pod = sidecar_pod(&client, &namespace, NODE, Workload::DaemonSet, "plugin").await;
        let sidecar = SidecarProcess::start(&pod, NODE, &driver.addons_endpoint, Serving::Plain, &[]);
        sidecar.wait_leader(true).await;
        let stage =
            FenceStage { client, namespace, driver_name, driver, manager, _sidecar: sidecar, _identity: identity };
        let nodes = stage.nodes();
        stage
            .manager
            .eventually("the CSIAddonsNode to be Connected", async |_| {
                let list = nodes.list(&ListParams::default()).await.unwrap();
                list.items.iter().any(|n| n.data.pointer("/status/state") == Some(&json!("Connected")))
            })
            .await;
        stage
    }

    fn nodes(&self) -> Api<DynamicObject> {
        dynamic(&self.client, &self.namespace, "CSIAddonsNode")
    }

    fn fences(&self) -> Api<DynamicObject> {
        cluster(&self.client, "NetworkFence")
    }

    /// The CIDRs the driver has fenced, from its ListClusterFence.
    async fn fenced(&self) -> BTreeSet<String> {
        let channel = unix_channel(&self.driver.addons_endpoint).await.unwrap();
        let list = pb::fence_controller_client::FenceControllerClient::new(channel)
            .list_cluster_fence(pb::ListClusterFenceRequest::default())
            .await
            .unwrap()
            .into_inner();
        list.cidrs.into_iter().map(|c| c.cidr).collect()
    }

    async fn create_class(&self, name: &str) {
        let class = json!({
            "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "NetworkFenceClass",
            "metadata": {"name": name},
            "spec": {"provisioner": self.driver_name, "parameters": {"clusterID": "c1"}},
        });
        cluster(&self.client, "NetworkFenceClass")
            .create(&PostParams::default(), &serde_json::from_value(class).unwrap())
            .await
            .unwrap();
    }

    async fn create_fence(&self, name: &str, class: &str, cidr: &str) {
        let fence = json!({
            "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "NetworkFence",
            "metadata": {"name": name},
            "spec": {"networkFenceClassName": class, "cidrs": [cidr], "fenceState": "Fenced"},
        });
        self.fences().create(&PostParams::default(), &serde_json::from_value(fence).unwrap()).await.unwrap();
    }

    /// Waits until the fence's status message is `message`; returns the status.
    async fn fence_says(&self, name: &str, message: &str) -> serde_json::Value {
        let fences = self.fences();
        let mut status = json!(null);
        let said = testenv::poll::until(MINUTE, async || {
            status = fences.get_opt(name).await.unwrap().map(|f| f.data["status"].clone()).unwrap_or_default();
            (status["message"] == message).then(|| status.clone())
        })
        .await;
        if let Some(status) = said {
            return status;
        }
        panic!("NetworkFence {name} never said {message:?}: {status}; manager log:\n{}", self.manager.log());
    }

    async fn gone(&self, api: &Api<DynamicObject>, name: &str) {
        let what = format!("{name} to be deleted");
        self.manager.eventually(&what, async |_| api.get_opt(name).await.unwrap().is_none()).await;
    }
}

fn cluster(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    cluster_of(client, "csiaddons.openshift.io", kind)
}

/// A cluster-scoped kind of `group` (v1alpha1).
pub fn cluster_of(client: &kube::Client, group: &str, kind: &str) -> Api<DynamicObject> {
    let version = "v1alpha1";
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let lower = kind.to_lowercase();
    let plural = if lower.ends_with("class") { format!("{lower}es") } else { format!("{lower}s") };
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, &plural);
    Api::all_with(client.clone(), &resource)
}

async fn set_state(fences: &Api<DynamicObject>, name: &str, state: &str) {
    let patch = json!({"spec": {"fenceState": state}});
    fences.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

fn condition<'a>(status: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

#[tokio::test]
async fn a_fence_is_applied_lifted_and_lifted_again_before_its_deletion() {
    let stage = FenceStage::new("fence-life").await;
    let class = format!("{}-class", stage.namespace);
    stage.create_class(&class).await;

    // The class names itself on the driver's CSIAddonsNode, which then lists the fence clients.
    let nodes = stage.nodes();
    stage
        .manager
        .eventually("networkFenceClientStatus on the CSIAddonsNode", async |_| {
            let list = nodes.list(&ListParams::default()).await.unwrap();
            list.items.iter().any(|n| {
                let Some(entries) = n.data.pointer("/status/networkFenceClientStatus").and_then(|v| v.as_array())
                else {
                    return false;
                };
                entries.iter().any(|e| {
                    e["networkFenceClassName"] == class.as_str()
                        && e["ClientDetails"].as_array().is_some_and(|clients| {
                            clients.iter().any(|c| {
                                c["cidrs"].as_array().is_some_and(|a| a.contains(&json!(format!("{NODE_IP}/32"))))
                            })
                        })
                })
            })
        })
        .await;

    // The class's name taken out of the node's annotation by hand: the node's change brings it back.
    let annotation = "csiaddons.openshift.io/networkfenceclass-names";
    let node = nodes.list(&ListParams::default()).await.unwrap().items.remove(0);
    let name = node.metadata.name.clone().unwrap();
    let patch = json!({"metadata": {"annotations": {annotation: "[]"}}});
    nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    stage
        .manager
        .eventually("the class named again on the CSIAddonsNode", async |_| {
            let node = nodes.get(&name).await.unwrap();
            let named = node.metadata.annotations.as_ref().and_then(|a| a.get(annotation));
            named.is_some_and(|v| v.contains(&class))
        })
        .await;

    let fence = format!("{}-a", stage.namespace);
    stage.create_fence(&fence, &class, "10.77.0.0/24").await;
    let status = stage.fence_says(&fence, "fencing operation successful").await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(condition(&status, "FenceApplied").map(|c| c["status"].clone()), Some(json!("True")), "{status}");
    assert!(stage.fenced().await.contains("10.77.0.0/24"));
    let metrics = stage.manager.metrics_text().await;
    let series = r#"csi_addons_operations_total{kind="NetworkFence/Fence",result="Succeeded"} 1"#;
    assert!(metrics.lines().any(|l| l == series), "{series} in:\n{metrics}");

    set_state(&stage.fences(), &fence, "Unfenced").await;
    let status = stage.fence_says(&fence, "unfencing operation successful").await;
    assert_eq!(condition(&status, "FenceApplied").map(|c| c["status"].clone()), Some(json!("False")), "{status}");
    assert!(stage.fenced().await.is_empty(), "unfenced at the driver");

    set_state(&stage.fences(), &fence, "Fenced").await;
    stage.fence_says(&fence, "fencing operation successful").await;
    assert!(stage.fenced().await.contains("10.77.0.0/24"));
    // Deleting a fence that is applied lifts it before the object goes (upstream leaves it).
    stage.fences().delete(&fence, &DeleteParams::default()).await.unwrap();
    stage.gone(&stage.fences(), &fence).await;
    assert!(stage.fenced().await.is_empty(), "the deletion unfenced first");

    // The class going takes its name out of the annotation and its entry out of the status.
    let classes = cluster(&stage.client, "NetworkFenceClass");
    classes.delete(&class, &DeleteParams::default()).await.unwrap();
    stage.gone(&classes, &class).await;
    stage
        .manager
        .eventually("the class out of the CSIAddonsNode", async |_| {
            let list = nodes.list(&ListParams::default()).await.unwrap();
            list.items.iter().all(|n| {
                let named = n
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("csiaddons.openshift.io/networkfenceclass-names"));
                let listed = n.data.pointer("/status/networkFenceClientStatus").and_then(|v| v.as_array());
                named.is_none_or(|v| !v.contains(&class)) && listed.is_none_or(|l| l.is_empty())
            })
        })
        .await;
}

#[tokio::test]
async fn a_fence_whose_class_is_gone_says_so_on_deletion_and_an_annotation_forces_it_out() {
    let stage = FenceStage::new("fence-orphan").await;
    let class = format!("{}-class", stage.namespace);
    stage.create_class(&class).await;
    let fence = format!("{}-b", stage.namespace);
    stage.create_fence(&fence, &class, "10.78.0.1/32").await;
    stage.fence_says(&fence, "fencing operation successful").await;

    let classes = cluster(&stage.client, "NetworkFenceClass");
    classes.delete(&class, &DeleteParams::default()).await.unwrap();
    stage.gone(&classes, &class).await;
    stage.fences().delete(&fence, &DeleteParams::default()).await.unwrap();
    let fences = stage.fences();
    let blocked = testenv::poll::until(MINUTE, async || {
        let status = fences.get_opt(&fence).await.unwrap().map(|f| f.data["status"].clone()).unwrap_or_default();
        condition(&status, "DeletionBlocked").cloned()
    })
    .await
    .unwrap_or_default();
    assert_eq!(blocked["reason"], "ClassNotFound", "{blocked}; log:\n{}", stage.manager.log());
    let message = blocked["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("NetworkFenceClass {class} not found")), "{message}");
    assert!(message.contains("csiaddons.openshift.io/delete-without-unfence=true"), "{message}");
    assert!(fences.get_opt(&fence).await.unwrap().is_some(), "kept while it may still be fenced");

    let patch = json!({"metadata": {"annotations": {"csiaddons.openshift.io/delete-without-unfence": "true"}}});
    fences.patch(&fence, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    stage.gone(&fences, &fence).await;
    // Forced out without unfencing, as the annotation says.
    assert!(stage.fenced().await.contains("10.78.0.1/32"));
}

#[tokio::test]
async fn an_invalid_fence_fails_in_upstreams_words_and_the_deprecated_inline_form_warns() {
    let stage = FenceStage::new("fence-bad").await;
    let fence = format!("{}-c", stage.namespace);
    stage.create_fence(&fence, "no-such-class", "10.79.0.0/33").await;
    let status = stage
        .fence_says(
            &fence,
            "Failed to validate Networkfence parameters: cidr \"10.79.0.0/33\": prefix length \"33\" is not a number from 0 to 32 (digits alone, no leading zero)",
        )
        .await;
    assert_eq!(status["result"], "Failed", "{status}");
    // Never applied: nothing to lift, so nothing holds the deletion.
    stage.fences().delete(&fence, &DeleteParams::default()).await.unwrap();
    stage.gone(&stage.fences(), &fence).await;
    assert!(stage.fenced().await.is_empty());

    // The deprecated inline form still works, and says it is deprecated.
    let secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(json!({"metadata": {"name": "fence-secret"}, "stringData": {"key": "value"}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(stage.client.clone(), &stage.namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let inline = format!("{}-inline", stage.namespace);
    let body = json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "NetworkFence", "metadata": {"name": inline},
        "spec": {"driver": stage.driver_name, "cidrs": ["10.79.1.0/24"], "fenceState": "Fenced",
                 "secret": {"name": "fence-secret", "namespace": stage.namespace}},
    });
    stage.fences().create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.unwrap();
    stage.fence_says(&inline, "fencing operation successful").await;
    assert!(stage.fenced().await.contains("10.79.1.0/24"));
    let note = warning_in(&Api::all(stage.client.clone()), &inline, "DeprecatedFields").await.unwrap_or_default();
    assert!(note.starts_with("spec.driver, spec.secret deprecated"), "a Warning event: {note:?}");
    stage.fences().delete(&inline, &DeleteParams::default()).await.unwrap();
    stage.gone(&stage.fences(), &inline).await;
    assert!(stage.fenced().await.is_empty());
}
