//! The driver operator as a real process against the real API server. One ReferenceCSIDriver
//! gives the driver's objects, from the spec; the workloads' rollout (their status written here,
//! as the StatefulSet and DaemonSet controllers of a cluster would) turns into conditions; a spec
//! change rolls out and a hand edit is undone; `Removed` waits for attached volumes, then removes
//! the driver but no StorageClass; the CSI-Addons classes follow the sidecars' capabilities; `Managed` brings it back; deleting the object removes it too;
//! the credentials Secret is copied (operator_credentials); other names are ignored. The object is cluster-scoped and named after the driver: one test.
use api::csiaddons::{CSIAddonsNode, NetworkFenceClass};
use api::driver::{DRIVER_NAME, ReferenceCSIDriver};
use api::replication::{VolumeGroupReplicationClass, VolumeReplicationClass};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::driver_operator::{Operator, condition, warning};
use crate::harness::sidecar::http_get;
use crate::harness::support::unique;

fn container_args(set: &StatefulSet, name: &str) -> Vec<String> {
    let pod = set.spec.as_ref().and_then(|s| s.template.spec.as_ref()).unwrap();
    pod.containers.iter().find(|c| c.name == name).and_then(|c| c.args.clone()).unwrap_or_default()
}

fn container_image(set: &StatefulSet, name: &str) -> Option<String> {
    let pod = set.spec.as_ref().and_then(|s| s.template.spec.as_ref())?;
    pod.containers.iter().find(|c| c.name == name)?.image.clone()
}

/// The serving certificate in `secret` verifies against `bundle` under the driver's name.
fn verify_serving(bundle: &str, secret: &Secret) {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots.add(der.unwrap()).unwrap();
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        cluster_client::tls::crypto_provider(),
    )
    .build()
    .unwrap();
    let leaf = &secret.data.as_ref().unwrap()["tls.crt"].0;
    let leaf = CertificateDer::pem_slice_iter(leaf).next().unwrap().unwrap();
    let name = ServerName::try_from(DRIVER_NAME).unwrap();
    verifier.verify_server_cert(&leaf, &[], &name, &[], UnixTime::now()).unwrap();
}

/// Writes the workloads' status as their controllers would for a finished rollout.
async fn roll_out(client: &Client, namespace: &str) {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let set = sets.get("reference-driver-controller").await.unwrap();
    let status = json!({"status": {"observedGeneration": set.metadata.generation, "replicas": 1,
        "updatedReplicas": 1, "readyReplicas": 1, "currentRevision": "r", "updateRevision": "r"}});
    sets.patch_status("reference-driver-controller", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let daemon = daemons.get("reference-driver-node").await.unwrap();
    let status = json!({"status": {"observedGeneration": daemon.metadata.generation, "desiredNumberScheduled": 1,
        "currentNumberScheduled": 1, "updatedNumberScheduled": 1, "numberAvailable": 1, "numberReady": 1,
        "numberMisscheduled": 0}});
    daemons.patch_status("reference-driver-node", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
}

#[tokio::test]
async fn one_object_gives_the_driver_which_rolls_out_is_removed_and_comes_back() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "driver-operator").await.unwrap();
    let driver_namespace = unique("reference-driver");
    let operator = Operator::start(cp.kubeconfig_path(), &namespace, &driver_namespace);
    let drivers: Api<ReferenceCSIDriver> = Api::all(client.clone());
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &driver_namespace);
    let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), &driver_namespace);
    let csi_drivers: Api<CSIDriver> = Api::all(client.clone());

    // Another name is ignored, and told so.
    let other: ReferenceCSIDriver = serde_json::from_value(json!({
        "apiVersion": "driver.csi-addons-rs.io/v1alpha1", "kind": "ReferenceCSIDriver",
        "metadata": {"name": "my-driver"}, "spec": {}
    }))
    .unwrap();
    drivers.create(&PostParams::default(), &other).await.unwrap();
    let (degraded, reason, message) = operator
        .eventually("the other object to be told it is ignored", async || {
            condition(&drivers, "my-driver", "Degraded").await
        })
        .await;
    assert!(degraded && reason == "Ignored" && message.contains(DRIVER_NAME), "{reason}: {message}");
    drivers.delete("my-driver", &DeleteParams::default()).await.unwrap();

    // The driver: objects from the spec and the operator's environment.
    let driver: ReferenceCSIDriver = serde_json::from_value(json!({
        "apiVersion": "driver.csi-addons-rs.io/v1alpha1", "kind": "ReferenceCSIDriver",
        "metadata": {"name": DRIVER_NAME},
        "spec": {"logLevel": "Debug", "images": {"provisioner": "example.com/csi-provisioner:v9"},
                 "nodePlacement": {"nodeSelector": {"storage": "yes"}}}
    }))
    .unwrap();
    drivers.create(&PostParams::default(), &driver).await.unwrap();
    let set = operator
        .eventually("the controller StatefulSet", async || sets.get_opt("reference-driver-controller").await.ok()?)
        .await;
    assert_eq!(container_image(&set, "driver").as_deref(), Some("example.com/reference-driver:v9"), "DRIVER_IMAGE");
    assert_eq!(
        container_image(&set, "csi-provisioner").as_deref(),
        Some("example.com/csi-provisioner:v9"),
        "the spec's image"
    );
    assert!(container_args(&set, "csi-provisioner").contains(&"--v=4".to_owned()), "logLevel Debug");
    let pod = set.spec.as_ref().and_then(|s| s.template.spec.as_ref()).unwrap();
    assert_eq!(pod.node_selector.as_ref().unwrap()["storage"], "yes");
    // Applied in order: the node DaemonSet comes last.
    operator.eventually("the node DaemonSet", async || daemons.get_opt("reference-driver-node").await.ok()?).await;
    let csi_driver = csi_drivers.get(DRIVER_NAME).await.unwrap();
    assert_eq!(csi_driver.metadata.labels.unwrap()["app.kubernetes.io/managed-by"], "reference-driver-operator");
    // The sidecars serve a certificate the operator issued; the CSIDriver names its CA, which
    // verifies it under the driver's name.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &driver_namespace);
    let serving = secrets.get("reference-driver-sidecar-tls").await.unwrap();
    assert_eq!(serving.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca_bundle = &csi_driver.metadata.annotations.unwrap()[api::driver::SIDECAR_CA_ANNOTATION];
    verify_serving(ca_bundle, &serving);
    let sidecar_args = container_args(&set, "csi-addons");
    assert!(sidecar_args.contains(&"--tls-cert-file=/etc/csi-addons/tls/tls.crt".to_owned()), "{sidecar_args:?}");
    let created = Api::<Namespace>::all(client.clone()).get(&driver_namespace).await.unwrap();
    assert_eq!(created.metadata.labels.unwrap()["pod-security.kubernetes.io/enforce"], "privileged");
    let binding = Api::<ClusterRoleBinding>::all(client.clone()).get("reference-driver-controller").await.unwrap();
    assert!(binding.subjects.unwrap().iter().all(|s| s.namespace.as_deref() == Some(driver_namespace.as_str())));
    let (progressing, reason, message) = operator
        .eventually("Progressing", async || condition(&drivers, DRIVER_NAME, "Progressing").await.filter(|c| c.0))
        .await;
    assert_eq!(reason, "Deploying", "{message}");
    let held = drivers.get(DRIVER_NAME).await.unwrap();
    assert!(
        progressing && held.metadata.finalizers.unwrap().iter().any(|f| f == "driver.csi-addons-rs.io/driver-removal")
    );

    // The workloads roll out: Available.
    roll_out(&client, &driver_namespace).await;
    operator
        .eventually("Available", async || condition(&drivers, DRIVER_NAME, "Available").await.filter(|c| c.0))
        .await;
    let status = drivers.get(DRIVER_NAME).await.unwrap().status.unwrap();
    assert_eq!(status.generations.len(), 2, "{status:?}");
    assert!(
        status.versions.iter().any(|v| v.name == "reference-driver" && v.version == "example.com/reference-driver:v9")
    );
    let (_, metrics) = http_get(operator.metrics, "/metrics").await.unwrap();
    assert!(metrics.contains("reference_driver_operator_leader 1"), "{metrics}");

    // A sidecar advertises replication and fencing but no volume groups: those two classes.
    let nodes: Api<CSIAddonsNode> = Api::namespaced(client.clone(), &driver_namespace);
    let node: CSIAddonsNode = serde_json::from_value(json!({
        "metadata": {"name": "reference-driver-controller-0"},
        "spec": {"driver": {"name": DRIVER_NAME, "endpoint": "pod://reference-driver-controller-0.x:9070", "nodeID": "node-1"}}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let capabilities = json!({"status": {"state": "Connected", "capabilities":
        ["service.CONTROLLER_SERVICE", "volume_replication.VOLUME_REPLICATION", "network_fence.NETWORK_FENCE"]}});
    nodes
        .patch_status("reference-driver-controller-0", &PatchParams::default(), &Patch::Merge(capabilities))
        .await
        .unwrap();
    let fence_classes: Api<NetworkFenceClass> = Api::all(client.clone());
    operator
        .eventually("the NetworkFenceClass", async || fence_classes.get_opt("reference-csi-fence").await.ok()?)
        .await;
    let replication_classes: Api<VolumeReplicationClass> = Api::all(client.clone());
    let replication = replication_classes.get("reference-csi-replication").await.unwrap();
    assert_eq!(replication.spec.provisioner, DRIVER_NAME);
    let groups: Api<VolumeGroupReplicationClass> = Api::all(client.clone());
    assert!(
        groups.get_opt("reference-csi-group-replication").await.unwrap().is_none(),
        "no sidecar offers volume groups"
    );
    crate::driver::operator_credentials::check(&client, &operator, &namespace, &driver_namespace).await;

    // A node-plugin Pod whose image cannot be pulled: Degraded, with the kubelet's words, and a
    // Warning event; gone again, no longer degraded.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &driver_namespace);
    let stuck: Pod = serde_json::from_value(json!({
        "metadata": {"name": "reference-driver-node-x", "labels": {"app.kubernetes.io/name": "reference-driver"}},
        "spec": {"containers": [{"name": "driver", "image": "example.com/missing:v1"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &stuck).await.unwrap();
    let waiting = json!({"status": {"containerStatuses": [{"name": "driver", "image": "example.com/missing:v1",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}});
    pods.patch_status("reference-driver-node-x", &PatchParams::default(), &Patch::Merge(waiting)).await.unwrap();
    let (_, reason, message) = operator
        .eventually("Degraded", async || condition(&drivers, DRIVER_NAME, "Degraded").await.filter(|c| c.0))
        .await;
    assert_eq!(reason, "RolloutFailed");
    assert!(message.contains("reference-driver-node-x") && message.contains("ImagePullBackOff"), "{message}");
    operator.eventually("a Warning event RolloutFailed", async || warning(&client, "RolloutFailed").await).await;
    pods.delete("reference-driver-node-x", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .unwrap();
    operator
        .eventually("Degraded False", async || condition(&drivers, DRIVER_NAME, "Degraded").await.filter(|c| !c.0))
        .await;

    // A spec change rolls out; a hand edit is undone.
    let generation = set.metadata.generation.unwrap();
    drivers
        .patch(DRIVER_NAME, &PatchParams::default(), &Patch::Merge(json!({"spec": {"logLevel": "Trace"}})))
        .await
        .unwrap();
    let changed = operator
        .eventually("the new log level in the StatefulSet", async || {
            let set = sets.get("reference-driver-controller").await.ok()?;
            container_args(&set, "csi-provisioner").contains(&"--v=6".to_owned()).then_some(set)
        })
        .await;
    assert!(changed.metadata.generation.unwrap() > generation);
    operator
        .eventually("Progressing while the change is not rolled out", async || {
            condition(&drivers, DRIVER_NAME, "Progressing").await.filter(|c| c.0)
        })
        .await;
    roll_out(&client, &driver_namespace).await;
    operator
        .eventually("Available again", async || condition(&drivers, DRIVER_NAME, "Progressing").await.filter(|c| !c.0))
        .await;
    let edit = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "spec": {"template": {"spec": {"containers": [{"name": "csi-provisioner", "image": "example.com/by-hand:v0"}]}}}});
    sets.patch("reference-driver-controller", &PatchParams::apply("by-hand").force(), &Patch::Apply(edit))
        .await
        .unwrap();
    operator
        .eventually("the hand edit undone", async || {
            let set = sets.get("reference-driver-controller").await.ok()?;
            (container_image(&set, "csi-provisioner").as_deref() == Some("example.com/csi-provisioner:v9"))
                .then_some(())
        })
        .await;

    // Removed: while a volume of the driver is attached, the driver stays and says why.
    let class_name = unique("reference-csi");
    let class: StorageClass =
        serde_json::from_value(json!({"metadata": {"name": class_name}, "provisioner": DRIVER_NAME})).unwrap();
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attachment_name = unique("csi-held");
    let attachment: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": attachment_name},
        "spec": {"attacher": DRIVER_NAME, "nodeName": "node-1", "source": {"persistentVolumeName": "pv-held"}}
    }))
    .unwrap();
    attachments.create(&PostParams::default(), &attachment).await.unwrap();
    let removed = json!({"spec": {"managementState": "Removed"}});
    drivers.patch(DRIVER_NAME, &PatchParams::default(), &Patch::Merge(removed)).await.unwrap();
    let (_, _, message) = operator
        .eventually("Removed waiting for pv-held", async || {
            condition(&drivers, DRIVER_NAME, "Progressing").await.filter(|c| c.0 && c.2.contains("pv-held"))
        })
        .await;
    assert!(message.contains("still attached"), "{message}");
    assert!(
        sets.get_opt("reference-driver-controller").await.unwrap().is_some(),
        "the driver stays while pv-held is attached"
    );
    attachments.delete(&attachment_name, &DeleteParams::default()).await.unwrap();
    operator
        .eventually("the driver removed", async || {
            condition(&drivers, DRIVER_NAME, "Progressing").await.filter(|c| !c.0 && c.1 == "Removed")
        })
        .await;
    assert!(sets.get_opt("reference-driver-controller").await.unwrap().is_none());
    assert!(daemons.get_opt("reference-driver-node").await.unwrap().is_none());
    assert!(csi_drivers.get_opt(DRIVER_NAME).await.unwrap().is_none());
    assert!(
        Api::<ClusterRoleBinding>::all(client.clone()).get_opt("reference-driver-controller").await.unwrap().is_none()
    );
    assert!(
        Api::<StorageClass>::all(client.clone()).get_opt(&class_name).await.unwrap().is_some(),
        "StorageClasses stay"
    );
    assert!(secrets.get_opt("reference-driver-sidecar-ca").await.unwrap().is_none(), "the CA goes with the driver");
    let (available, ..) = condition(&drivers, DRIVER_NAME, "Available").await.unwrap();
    assert!(!available);

    // Managed again: the driver comes back.
    drivers
        .patch(DRIVER_NAME, &PatchParams::default(), &Patch::Merge(json!({"spec": {"managementState": "Managed"}})))
        .await
        .unwrap();
    operator.eventually("the StatefulSet back", async || sets.get_opt("reference-driver-controller").await.ok()?).await;
    operator.eventually("the CSIDriver back", async || csi_drivers.get_opt(DRIVER_NAME).await.ok()?).await;

    // Deleting the object removes the driver, then the object goes.
    drivers.delete(DRIVER_NAME, &DeleteParams::default()).await.unwrap();
    operator
        .eventually("the object gone", async || drivers.get_opt(DRIVER_NAME).await.ok()?.is_none().then_some(()))
        .await;
    assert!(sets.get_opt("reference-driver-controller").await.unwrap().is_none());
    assert!(csi_drivers.get_opt(DRIVER_NAME).await.unwrap().is_none());
    assert!(fence_classes.get_opt("reference-csi-fence").await.unwrap().is_some(), "CSI-Addons classes stay");
    Api::<StorageClass>::all(client.clone()).delete(&class_name, &DeleteParams::default()).await.unwrap();
    fence_classes.delete("reference-csi-fence", &DeleteParams::default()).await.unwrap();
    replication_classes.delete("reference-csi-replication", &DeleteParams::default()).await.unwrap();
}
