//! The driver operator in real Pods (deploy/driver-operator/, the hand-installed driver removed
//! first): one ReferenceCSIDriver gives the driver, its StorageClasses and CSI-Addons classes, and
//! sidecars the manager reaches over TLS verified against the CA the operator keeps. The backend
//! taken away and given back leaves the driver running; the operator's own upgrade rolls the driver
//! while a volume stays mounted; `Removed` and `Managed` again, and a spec change rolling out. The helpers serve the OLM suite too, where OLM installs the operator.
use api::driver::{DRIVER_NAME, ReferenceCSIDriver};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::poll;

use crate::cluster::{
    self, CONTROLLER_PLUGIN_SELECTOR, DRIVER_NAMESPACE, DRIVER_STATE_DIR, NODE_PLUGIN_SELECTOR, POD_START,
};
use crate::driver_pods::{STORAGE_CLASS, WORKLOADS, connected_nodes, workload};
use crate::sidecar_tls::check_verified_tls;

/// The StorageClasses the operator keeps on a node with loop devices.
pub const STORAGE_CLASSES: [&str; 2] = ["reference-csi-filesystem", "reference-csi-block"];
const SCHEDULE: &str = "@weekly";
/// The annotation the manager reads a StorageClass's reclaim-space schedule from.
const RECLAIM_SCHEDULE: &str = "reclaimspace.csiaddons.openshift.io/schedule";

pub fn drivers(client: &Client) -> Api<ReferenceCSIDriver> {
    Api::all(client.clone())
}

/// The status and message of condition `type_`, when set.
pub async fn condition(client: &Client, type_: &str) -> Option<(bool, String)> {
    let driver = drivers(client).get_opt(DRIVER_NAME).await.ok()??;
    let status = driver.status?;
    let found = status.conditions.into_iter().find(|c| c.type_ == type_)?;
    Some((found.status == "True", found.message))
}

/// Waits for condition `type_` to be `wanted`; its message.
pub async fn until_condition(client: &Client, type_: &str, wanted: bool, within: std::time::Duration) -> String {
    let reached = poll::until(within, async || condition(client, type_).await.filter(|(s, _)| *s == wanted)).await;
    match reached {
        Some((_, message)) => message,
        None => panic!("{type_} is not {wanted}: {:?}", drivers(client).get_opt(DRIVER_NAME).await.ok().flatten()),
    }
}

/// Creates the one ReferenceCSIDriver, with a reclaim-space schedule for its StorageClasses.
pub async fn create(client: &Client) {
    let driver: ReferenceCSIDriver = serde_json::from_value(json!({
        "apiVersion": "driver.csi-addons-rs.io/v1alpha1", "kind": "ReferenceCSIDriver",
        "metadata": {"name": DRIVER_NAME},
        "spec": {"managementState": "Managed", "csiAddons": {"enabled": true, "reclaimSpaceSchedule": SCHEDULE}}
    }))
    .expect("a well-formed ReferenceCSIDriver");
    drivers(client).create(&PostParams::default(), &driver).await.unwrap();
}

fn cluster_scoped(client: &Client, group: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1alpha1", kind);
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// What one ReferenceCSIDriver gave, once Available: the driver's Pods running, its StorageClasses
/// (with the schedule), the three CSI-Addons classes, and every sidecar Connected over TLS the
/// manager (in `manager_namespace`) verifies against the CA on the CSIDriver. Returns a line
/// saying so.
pub async fn check_installed(client: &Client, manager_namespace: &str) -> String {
    until_condition(client, "Available", true, 2 * POD_START).await;
    let controllers = cluster::running_pods(client, DRIVER_NAMESPACE, CONTROLLER_PLUGIN_SELECTOR).await;
    let nodes = cluster::running_pods(client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
    assert!(!controllers.is_empty() && !nodes.is_empty(), "the controller and node plugins run");

    let classes: Api<StorageClass> = Api::all(client.clone());
    for name in STORAGE_CLASSES {
        let class = poll::until(poll::MINUTE, async || classes.get_opt(name).await.ok()?).await;
        let class = class.unwrap_or_else(|| panic!("StorageClass {name}"));
        let schedule = class.metadata.annotations.unwrap_or_default().remove(RECLAIM_SCHEDULE);
        assert_eq!(schedule.as_deref(), Some(SCHEDULE), "{name} carries the reclaim-space schedule");
    }
    let addons = [
        ("replication.storage.openshift.io", "VolumeReplicationClass", "reference-csi-replication"),
        ("replication.storage.openshift.io", "VolumeGroupReplicationClass", "reference-csi-group-replication"),
        ("csiaddons.openshift.io", "NetworkFenceClass", "reference-csi-fence"),
    ];
    for (group, kind, name) in addons {
        let api = cluster_scoped(client, group, kind);
        let found = poll::until(poll::MINUTE, async || api.get_opt(name).await.ok()?).await;
        assert!(found.is_some(), "{kind} {name} is created once the sidecars advertise it");
    }

    let sidecars = controllers.len() + nodes.len();
    let connected =
        poll::until(POD_START, async || Some(connected_nodes(client).await).filter(|c| c.len() >= sidecars)).await;
    let connected = connected.unwrap_or_else(|| panic!("{sidecars} CSIAddonsNodes Connected"));
    let verified = check_verified_tls(client, &[controllers, nodes].concat(), manager_namespace).await;
    format!(
        "{} Pods running, StorageClasses {}, 3 CSI-Addons classes, {} CSIAddonsNodes Connected; {verified}",
        sidecars,
        STORAGE_CLASSES.join(" and "),
        connected.len()
    )
}

/// Sets `spec.managementState` (or other spec fields) with a merge patch.
async fn patch_spec(client: &Client, spec: serde_json::Value) {
    let patch = json!({ "spec": spec });
    drivers(client).patch(DRIVER_NAME, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// The UIDs of the driver's running Pods.
async fn pod_uids(client: &Client) -> Vec<String> {
    let selector = "app.kubernetes.io/name=reference-driver";
    let pods = cluster::running_pods(client, DRIVER_NAMESPACE, selector).await;
    pods.into_iter().filter_map(|p| p.metadata.uid).collect()
}

/// Where the operator runs when installed from deploy/driver-operator/.
const OPERATOR_NAMESPACE: &str = "reference-driver-operator";

/// The mount points of the kubelet's CSI volumes on this node (the suite runs in the node's mount
/// namespace).
fn csi_mounts() -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|p| p.contains("kubernetes.io~csi/"))
        .map(str::to_owned)
        .collect()
}

/// The operator's own upgrade, as OLM makes it: its Deployment replaced by one whose default
/// images are new (here the same images under a new tag, copied in the registry). The driver
/// rolls to them while a workload's volume stays mounted and its Pod keeps running; afterwards
/// the new driver unmounts and deletes that volume.
async fn upgrade_under_a_mounted_volume(client: &Client) -> String {
    *STORAGE_CLASS.write().unwrap_or_else(std::sync::PoisonError::into_inner) = STORAGE_CLASSES[0];
    let pod = workload(client, "upgrade").await;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mounts = csi_mounts();
    let mount = mounts.iter().find(|m| m.contains(&uid)).cloned();
    let mount = mount.unwrap_or_else(|| panic!("the workload's volume is mounted on the node: {mounts:?}"));

    let registry = std::env::var("CLUSTER_REGISTRY").expect("CLUSTER_REGISTRY (hack/cluster.sh exec sets it)");
    let old_tag = format!("v{}", env!("CARGO_PKG_VERSION"));
    let new_tag = format!("{old_tag}-upgrade");
    let mut env = Vec::new();
    for (variable, image) in [("DRIVER_IMAGE", "reference-driver"), ("CSI_ADDONS_SIDECAR_IMAGE", "csi-addons-sidecar")]
    {
        let from = format!("{registry}/ghcr.io/csi-addons-rs/{image}:{old_tag}");
        let to = format!("{registry}/ghcr.io/csi-addons-rs/{image}:{new_tag}");
        let out = std::process::Command::new("crane").args(["copy", "--insecure", &from, &to]).output();
        let out = out.expect("crane runs (hack/cluster.sh exec puts it on PATH)");
        assert!(out.status.success(), "crane copy {from}: {}", String::from_utf8_lossy(&out.stderr));
        env.push(json!({"name": variable, "value": format!("ghcr.io/csi-addons-rs/{image}:{new_tag}")}));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "operator", "env": env}]}}}});
    deployments.patch("reference-driver-operator", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();

    let new_driver = format!("ghcr.io/csi-addons-rs/reference-driver:{new_tag}");
    let rolled = poll::until(2 * POD_START, async || {
        let driver = drivers(client).get(DRIVER_NAME).await.ok()?;
        let status = driver.status?;
        let runs_new = status.versions.iter().any(|v| v.name == "reference-driver" && v.version == new_driver);
        let available = condition(client, "Available").await?.0 && !condition(client, "Progressing").await?.0;
        let pods = cluster::running_pods(client, DRIVER_NAMESPACE, "app.kubernetes.io/name=reference-driver").await;
        let images: Vec<String> = pods
            .iter()
            .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter().filter_map(|c| c.image.clone())))
            .collect();
        let all_new =
            !pods.is_empty() && images.iter().filter(|i| i.contains("/reference-driver:")).all(|i| *i == new_driver);
        (runs_new && available && all_new).then_some(pods.len())
    })
    .await;
    let rolled = rolled.expect("the upgraded operator rolls the driver to its new images");

    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOADS);
    let after = pods.get("upgrade").await.unwrap();
    assert_eq!(after.metadata.uid.as_deref(), Some(uid.as_str()), "the workload's Pod is the same");
    assert!(cluster::ready(&after), "the workload stays Ready through the upgrade");
    let restarts: i32 =
        after.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).map(|c| c.restart_count).sum();
    assert_eq!(restarts, 0, "the workload never restarted");
    assert!(csi_mounts().contains(&mount), "{mount} stayed mounted through the upgrade");

    // The new driver takes the volume down: unmounted, detached and deleted.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), WORKLOADS);
    let pv = claims.get("upgrade").await.unwrap().spec.and_then(|s| s.volume_name).unwrap_or_default();
    pods.delete("upgrade", &DeleteParams::default()).await.unwrap();
    claims.delete("upgrade", &DeleteParams::default()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let gone = poll::until(POD_START, async || {
        (pvs.get_opt(&pv).await.ok()?.is_none() && !csi_mounts().contains(&mount)).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the upgraded driver unmounts and deletes {pv}");
    format!("{rolled} driver Pods rolled to {new_tag} while {pv} stayed mounted; then unmounted and deleted by them")
}

/// Makes the volumes directory unwritable for the test's span, even to root: the backend is away.
struct BackendAway;

impl BackendAway {
    fn take() -> Self {
        chattr('+');
        BackendAway
    }
}

impl Drop for BackendAway {
    fn drop(&mut self) {
        chattr('-');
    }
}

fn chattr(sign: char) {
    let out = std::process::Command::new("chattr").arg(format!("{sign}i")).arg(DRIVER_STATE_DIR).output();
    let out = out.expect("chattr (e2fsprogs) runs");
    assert!(
        out.status.success(),
        "chattr {sign}i {DRIVER_STATE_DIR}: {} (the suite needs a filesystem with the immutable flag, as ext4)",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
#[ignore = "needs the one-node cluster with the driver operator: make test-cluster"]
async fn one_referencecsidriver_gives_the_driver_which_outlives_its_backend_and_is_removed_and_changed() {
    let client = cluster::client().await;
    create(&client).await;
    println!("installed: {}", check_installed(&client, cluster::MANAGER_NAMESPACE).await);
    println!("operator upgraded: {}", upgrade_under_a_mounted_volume(&client).await);

    // The backend goes: the condition says so, and nothing of the running driver is stopped.
    let before = pod_uids(&client).await;
    let away = BackendAway::take();
    let message = until_condition(&client, "BackendUnavailable", true, 2 * poll::MINUTE).await;
    assert_eq!(pod_uids(&client).await, before, "the driver's Pods keep running while the backend is away");
    let classes: Api<StorageClass> = Api::all(client.clone());
    for name in STORAGE_CLASSES {
        assert!(classes.get_opt(name).await.unwrap().is_some(), "{name} is kept while the backend is away");
    }
    assert_eq!(condition(&client, "Available").await.map(|c| c.0), Some(true), "the driver stays Available");
    drop(away);
    until_condition(&client, "BackendUnavailable", false, 2 * poll::MINUTE).await;
    println!("backend away: BackendUnavailable=True ({message}), Pods untouched; given back: False");

    // A spec change rolls out: new Pods with the new log level.
    patch_spec(&client, json!({"logLevel": "Debug"})).await;
    let rolled = poll::until(2 * POD_START, async || {
        let driver = drivers(&client).get(DRIVER_NAME).await.ok()?;
        let observed = driver.status.as_ref()?.observed_generation == driver.metadata.generation;
        let available = condition(&client, "Available").await?.0 && !condition(&client, "Progressing").await?.0;
        let uids = pod_uids(&client).await;
        let replaced = !uids.is_empty() && uids.iter().all(|u| !before.contains(u));
        (observed && available && replaced).then_some(uids.len())
    })
    .await;
    let rolled = rolled.expect("the spec change rolls out to new Pods and the driver is Available again");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), DRIVER_NAMESPACE);
    let set = sets.get("reference-driver-controller").await.unwrap();
    let args = set.spec.and_then(|s| s.template.spec).map(|p| p.containers).unwrap_or_default();
    let plugin_env: Vec<_> = args.iter().flat_map(|c| c.env.clone().unwrap_or_default()).collect();
    assert!(
        plugin_env.iter().any(|e| e.name == "RUST_LOG" && e.value.as_deref() == Some("debug")),
        "the driver logs at debug level: {plugin_env:?}"
    );
    println!("logLevel Debug: rolled out to {rolled} new Pods, Available");

    // Removed: the driver goes, its StorageClasses stay.
    patch_spec(&client, json!({"managementState": "Removed"})).await;
    let gone = poll::until(2 * POD_START, async || {
        let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), DRIVER_NAMESPACE);
        let none = sets.get_opt("reference-driver-controller").await.ok()?.is_none()
            && daemons.get_opt("reference-driver-node").await.ok()?.is_none()
            && Api::<CSIDriver>::all(client.clone()).get_opt(DRIVER_NAME).await.ok()?.is_none()
            && pod_uids(&client).await.is_empty();
        none.then_some(())
    })
    .await;
    assert!(gone.is_some(), "Removed deletes the driver's workloads and CSIDriver");
    let removed = poll::until(poll::MINUTE, async || {
        condition(&client, "Available").await.filter(|(up, message)| !up && message == "the driver is removed")
    })
    .await;
    let (_, removed) = removed.expect("Available=False: the driver is removed");
    for name in STORAGE_CLASSES {
        assert!(classes.get_opt(name).await.unwrap().is_some(), "Removed never deletes StorageClass {name}");
    }
    println!("Removed: workloads and CSIDriver gone, StorageClasses kept ({removed})");

    // Managed again: all of it back.
    patch_spec(&client, json!({"managementState": "Managed"})).await;
    println!("Managed again: {}", check_installed(&client, cluster::MANAGER_NAMESPACE).await);
}
