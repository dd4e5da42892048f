//! The sidecar process registers its CSIAddonsNode as upstream names and owns it, for each kind
//! of workload, re-creates it when deleted, and cuts long names as upstream does.
use std::time::Duration;

use api::csiaddons::CSIAddonsNode;
use kube::api::{Api, DeleteParams};

use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{Serving, SidecarProcess, Workload, sidecar_pod};

const DRIVER: &str = "registration.csi-addons-rs.io";

async fn get_eventually(api: &Api<CSIAddonsNode>, name: &str, sidecar: &SidecarProcess) -> CSIAddonsNode {
    if let Some(node) = testenv::poll::until(Duration::from_secs(30), async || api.get_opt(name).await.unwrap()).await {
        return node;
    }
    let names: Vec<String> =
        api.list(&Default::default()).await.unwrap().items.into_iter().filter_map(|n| n.metadata.name).collect();
    panic!("CSIAddonsNode {name} never appeared (there are {names:?}); sidecar log:\n{}", sidecar.log());
}

#[tokio::test]
async fn a_daemonset_pod_registers_and_re_registers_after_a_delete() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-reg").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);
    let pod = sidecar_pod(&client, &namespace, "node-a", Workload::DaemonSet, "csi-rbdplugin").await;
    let sidecar = SidecarProcess::start(&pod, "node-a", &driver.endpoint(), Serving::Plain, &[]);
    sidecar.wait_ready().await;

    let api = Api::<CSIAddonsNode>::namespaced(client.clone(), &namespace);
    let name = format!("node-a-{namespace}-daemonset-csi-rbdplugin");
    let node = get_eventually(&api, &name, &sidecar).await;
    assert_eq!(node.spec.driver.name, DRIVER);
    assert_eq!(node.spec.driver.node_id, "node-a");
    assert_eq!(node.spec.driver.endpoint, format!("127.0.0.1:{}", sidecar.port));
    let owners = node.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!((owners[0].kind.as_str(), owners[0].name.as_str()), ("DaemonSet", "csi-rbdplugin"));
    assert_eq!(owners[0].uid, pod.pod_owner.uid);
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("sidecar.csiaddons.openshift.io/createdByPodUID"), Some(&pod.uid));
    let updated = annotations.get("sidecar.csiaddons.openshift.io/lastUpdatedAt").expect("lastUpdatedAt is set");
    assert!(updated.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "lastUpdatedAt {updated:?} is not RFC 3339");

    // Deleted (e.g. by an administrator): the sidecar writes it again, without restarting.
    let first_uid = node.metadata.uid.clone();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let recreated = testenv::poll::until(Duration::from_secs(30), async || {
        api.get_opt(&name).await.unwrap().filter(|n| n.metadata.uid != first_uid)
    })
    .await;
    let recreated = recreated.unwrap_or_else(|| panic!("not re-created; sidecar log:\n{}", sidecar.log()));
    assert_eq!(recreated.spec.driver.name, DRIVER);
    sidecar.wait_ready().await;
}

#[tokio::test]
async fn a_deployment_pod_is_named_after_the_deployment_and_owned_by_the_pod() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-reg").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);
    let pod = sidecar_pod(&client, &namespace, "node-b", Workload::Deployment, "csi-provisioner").await;
    let sidecar = SidecarProcess::start(&pod, "node-b", &driver.endpoint(), Serving::Plain, &[]);
    sidecar.wait_ready().await;

    let api = Api::<CSIAddonsNode>::namespaced(client.clone(), &namespace);
    // The Deployment's name (found through the ReplicaSet), not the ReplicaSet's.
    let node = get_eventually(&api, &format!("node-b-{namespace}-deployment-csi-provisioner"), &sidecar).await;
    let owners = node.metadata.owner_references.unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!((owners[0].kind.as_str(), owners[0].name.as_str()), ("Pod", pod.name.as_str()));
    assert_eq!(owners[0].uid, pod.uid);
}

#[tokio::test]
async fn a_statefulset_pod_is_owned_by_the_statefulset() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-reg").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);
    let pod = sidecar_pod(&client, &namespace, "node-c", Workload::StatefulSet, "csi-controller").await;
    let sidecar = SidecarProcess::start(&pod, "node-c", &driver.endpoint(), Serving::Plain, &[]);
    sidecar.wait_ready().await;

    let api = Api::<CSIAddonsNode>::namespaced(client.clone(), &namespace);
    let node = get_eventually(&api, &format!("node-c-{namespace}-statefulset-csi-controller"), &sidecar).await;
    let owners = node.metadata.owner_references.unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!((owners[0].kind.as_str(), owners[0].name.as_str()), ("StatefulSet", "csi-controller"));
    assert_eq!(owners[0].uid, pod.pod_owner.uid);
}

#[tokio::test]
async fn names_past_253_characters_are_cut_and_hashed() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-reg").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);
    let node_id = format!("worker-{}", "n".repeat(230));
    let pod = sidecar_pod(&client, &namespace, &node_id, Workload::DaemonSet, "csi-cephfsplugin").await;
    let sidecar = SidecarProcess::start(&pod, &node_id, &driver.endpoint(), Serving::Plain, &[]);
    sidecar.wait_ready().await;

    let full = format!("{node_id}-{namespace}-daemonset-csi-cephfsplugin");
    assert!(full.len() > 253);
    let api = Api::<CSIAddonsNode>::namespaced(client.clone(), &namespace);
    let nodes = api.list(&Default::default()).await.unwrap().items;
    assert_eq!(nodes.len(), 1);
    let name = nodes[0].metadata.name.clone().unwrap();
    // 234 characters of the full name, '-', 16 hex characters of a SHA-256.
    assert_eq!(name.len(), 251, "{name}");
    assert_eq!(&name[..234], &full[..234]);
    assert!(name[234..].starts_with('-') && name[235..].chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    assert_eq!(name, sidecar::registration::node_object_name(&node_id, &namespace, "DaemonSet", "csi-cephfsplugin"));
}

/// An admission policy refuses CSIAddonsNodes in the namespace: the sidecar says why, keeps
/// running (not ready), and registers once the policy no longer applies.
#[tokio::test]
async fn a_refused_registration_is_retried_until_it_is_accepted() {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    use kube::api::PostParams;

    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-reg-refused").await.unwrap();
    let name = crate::harness::support::unique("no-csiaddonsnodes");
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["csiaddons.openshift.io"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["csiaddonsnodes"]}]},
            "validations": [{"expression": "false", "message": "registrations are closed"}],
        },
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }))
    .unwrap();
    let policies = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    policies.create(&PostParams::default(), &policy).await.unwrap();
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    // In force once a dry-run create is refused with its message.
    let api = Api::<CSIAddonsNode>::namespaced(client.clone(), &namespace);
    let probe: CSIAddonsNode = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "probe"},
        "spec": {"driver": {"name": DRIVER, "endpoint": "127.0.0.1:1", "nodeID": "n"}},
    }))
    .unwrap();
    let dry = PostParams { dry_run: true, ..Default::default() };
    testenv::poll::until(Duration::from_secs(20), async || match api.create(&dry, &probe).await {
        Err(kube::Error::Api(s)) if s.message.contains("registrations are closed") => Some(()),
        _ => None,
    })
    .await;

    let driver = RecordingDriver::start(DRIVER, false, false);
    let pod = sidecar_pod(&client, &namespace, "node-d", Workload::DaemonSet, "csi-rbdplugin").await;
    let mut sidecar = SidecarProcess::start(&pod, "node-d", &driver.endpoint(), Serving::Plain, &[]);
    sidecar
        .wait_for("the refusal in the log", async |s| {
            let log = s.log();
            log.contains("registration failed") && log.contains("registrations are closed")
        })
        .await;
    assert!(sidecar.exited().is_none(), "the sidecar exited:\n{}", sidecar.log());
    assert!(matches!(sidecar.http("/readyz").await, Some((503, _))), "ready without a CSIAddonsNode");
    assert!(api.list(&Default::default()).await.unwrap().items.is_empty());

    bindings.delete(&name, &Default::default()).await.unwrap();
    get_eventually(&api, &format!("node-d-{namespace}-daemonset-csi-rbdplugin"), &sidecar).await;
    sidecar.wait_ready().await;
    policies.delete(&name, &Default::default()).await.unwrap();
}
