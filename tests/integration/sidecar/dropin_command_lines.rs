//! Our sidecar started with the command lines the real projects write, verbatim apart from the
//! socket path and the port, in Pods named as those projects name them, behind our manager with
//! the shipped defaults (TLS and tokens on): ceph-csi-operator's node plugin, whose Pod name holds
//! the driver's dots, and Rook's two provisioner replicas with its leader-election flags. Each
//! CSIAddonsNode connects and a ReclaimSpaceJob succeeds through it. With log rotation on, the
//! same command line with ceph-csi-operator's logging arguments writes its log to the file they
//! name as well, and Debian's logrotate rotates it with `copytruncate`.
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::manager::{Manager, ManagerIdentity, attach, bound_pvc, job_result};
use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{MANAGER_SA, SidecarPod, SidecarProcess, Workload, free_port, sidecar_pod_named};
use crate::harness::support::{create_job, dynamic};

/// A namespace, a driver, and our manager as its own ServiceAccount with authentication on.
struct Deployment {
    client: kube::Client,
    namespace: String,
    manager: Manager,
    _identity: ManagerIdentity,
    _token: tempfile::NamedTempFile,
}

impl Deployment {
    async fn new(prefix: &str) -> Self {
        let cp = testenv::shared();
        let client = cp.client().await.unwrap();
        let namespace = cp.namespace(&client, prefix).await.unwrap();
        let identity = ManagerIdentity::new(&client, &namespace).await;
        // The token the manager presents to sidecars (in a Pod: its projected ServiceAccount token).
        let token = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(token.path(), cp.token(&client, &namespace, MANAGER_SA).await.unwrap()).unwrap();
        let token_flag = format!("--sidecar-token-file={}", token.path().display());
        let manager = Manager::start(&namespace, &identity.kubeconfig(), &[&token_flag]);
        Deployment { client, namespace, manager, _identity: identity, _token: token }
    }

    /// The Pod, with the IP a kubelet would give it (where the sidecar listens).
    async fn pod(&self, node: &str, workload: (Workload, &str), name: &str) -> SidecarPod {
        let pod = sidecar_pod_named(&self.client, &self.namespace, node, workload, name).await;
        let ip = json!({"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}});
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&ip))
            .await
            .unwrap();
        pod
    }

    /// The CSIAddonsNodes, once `count` are Connected.
    async fn connected(&self, count: usize) -> Vec<DynamicObject> {
        let nodes = dynamic(&self.client, &self.namespace, "CSIAddonsNode");
        let connected = async || {
            let list = nodes.list(&ListParams::default()).await.unwrap().items;
            list.into_iter()
                .filter(|n| n.data.pointer("/status/state") == Some(&json!("Connected")))
                .collect::<Vec<_>>()
        };
        self.manager
            .eventually(&format!("{count} CSIAddonsNodes Connected"), async |_| connected().await.len() == count)
            .await;
        connected().await
    }
}

/// ceph-csi-operator's arguments for the csi-addons container, `$(…)` expanded as the kubelet
/// would.
fn ceph_csi_operator_args(pod: &SidecarPod, node: &str, socket: &str, port: u16) -> Vec<String> {
    vec![
        format!("--node-id={node}"),
        "--v=5".into(),
        format!("--pod={}", pod.name),
        format!("--namespace={}", pod.namespace),
        format!("--pod-uid={}", pod.uid),
        "--stagingpath=/var/lib/kubelet/plugins/kubernetes.io/csi/".into(),
        format!("--csi-addons-address={socket}"),
        format!("--controller-port={port}"),
    ]
}

#[tokio::test]
async fn ceph_csi_operators_node_plugin_connects_with_a_dotted_pod_name_and_reclaims() {
    let deployment = Deployment::new("rook-ceph").await;
    let driver_name = "rook-ceph.rbd.csi.ceph.com";
    let driver = RecordingDriver::start(driver_name, false, true);
    driver.advertise(&["service.NODE_SERVICE", "reclaim_space.ONLINE"]);
    let node = "worker-1";
    let owner = (Workload::DaemonSet, "rook-ceph.rbd.csi.ceph.com-nodeplugin");
    let pod = deployment.pod(node, owner, "rook-ceph.rbd.csi.ceph.com-nodeplugin-7xk2p").await;
    let port = free_port();
    let sidecar = SidecarProcess::verbatim(&ceph_csi_operator_args(&pod, node, &driver.endpoint(), port));

    let nodes = deployment.connected(1).await;
    let endpoint = nodes[0].data.pointer("/spec/driver/endpoint").cloned().unwrap_or_default();
    assert_eq!(endpoint, json!(format!("pod://{}.{}:{port}", pod.name, pod.namespace)), "{}", sidecar.log());

    let pv = bound_pvc(&deployment.client, &deployment.namespace, "rbd-data", driver_name, None, json!({})).await;
    attach(&deployment.client, &pv, node, driver_name).await;
    let target = json!({"target": {"persistentVolumeClaim": "rbd-data"}});
    create_job(&deployment.client, &deployment.namespace, "ReclaimSpaceJob", "trim", target).await;
    let jobs = dynamic(&deployment.client, &deployment.namespace, "ReclaimSpaceJob");
    let status = job_result(&deployment.manager, &jobs, "trim").await;
    assert_eq!(status["result"], "Succeeded", "{status}\nsidecar log:\n{}", sidecar.log());
    assert_eq!(driver.count("node_reclaim_space"), 1);
}

/// Rook's provisioner: a Deployment of two replicas, each with a csi-addons container taking
/// part in leader election with Rook's flags. Both connect; the standby also answers the
/// manager's GetFenceClients (no Warning events); a job goes to the Lease holder.
#[tokio::test]
async fn rooks_provisioner_replicas_connect_and_the_leader_reclaims() {
    let deployment = Deployment::new("rook-ceph-provisioner").await;
    let driver_name = "rook-ceph.cephfs.csi.ceph.com";
    let driver = RecordingDriver::start(driver_name, true, false);
    driver.advertise(&["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE", "network_fence.GET_CLIENTS_TO_FENCE"]);
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "NetworkFenceClass",
        "metadata": {"name": crate::harness::support::unique("rook-fence")},
        "spec": {"provisioner": driver_name, "parameters": {"clusterID": "rook-ceph"}},
    }))
    .unwrap();
    let classes = crate::harness::support::dynamic_api(&deployment.client, "NetworkFenceClass", "");
    let class = classes.create(&PostParams::default(), &class).await.unwrap();

    let owner = (Workload::Deployment, "csi-cephfsplugin-provisioner");
    let mut sidecars = Vec::new();
    for (node, pod_name) in [
        ("worker-1", "csi-cephfsplugin-provisioner-5d4f8b7c9-x2x7m"),
        ("worker-2", "csi-cephfsplugin-provisioner-5d4f8b7c9-q8z4n"),
    ] {
        let pod = deployment.pod(node, owner, pod_name).await;
        let mut args = ceph_csi_operator_args(&pod, node, &driver.endpoint(), free_port());
        args.extend([
            format!("--leader-election-namespace={}", pod.namespace),
            "--leader-election-lease-duration=15s".into(),
            "--leader-election-renew-deadline=10s".into(),
            "--leader-election-retry-period=2s".into(),
        ]);
        sidecars.push(SidecarProcess::verbatim(&args));
        // The first replica takes the Lease before the second starts (the test knows the holder).
        if sidecars.len() == 1 {
            deployment.connected(1).await;
        }
    }
    deployment.connected(2).await;
    // Both report their fence clients: the standby serves GetFenceClients too.
    let nodes = dynamic(&deployment.client, &deployment.namespace, "CSIAddonsNode");
    deployment
        .manager
        .eventually("fence clients on both CSIAddonsNodes", async |_| {
            let list = nodes.list(&ListParams::default()).await.unwrap().items;
            list.len() == 2
                && list.iter().all(|n| {
                    n.data.pointer("/status/networkFenceClientStatus/0/ClientDetails/0/id") == Some(&json!("client-1"))
                })
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = Api::<Event>::namespaced(deployment.client.clone(), &deployment.namespace);
    let failures: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FenceClientsFailed"))
        .map(|e| e.message)
        .collect();
    assert!(failures.is_empty(), "{failures:?}");

    bound_pvc(&deployment.client, &deployment.namespace, "cephfs-data", driver_name, None, json!({})).await;
    let target = json!({"target": {"persistentVolumeClaim": "cephfs-data"}});
    create_job(&deployment.client, &deployment.namespace, "ReclaimSpaceJob", "trim", target).await;
    let jobs = dynamic(&deployment.client, &deployment.namespace, "ReclaimSpaceJob");
    let status = job_result(&deployment.manager, &jobs, "trim").await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(driver.count("controller_reclaim_space"), 1);
    classes.delete(&class.metadata.name.unwrap(), &Default::default()).await.unwrap();
}

/// ceph-csi-operator with `spec.log.rotation` set: the csi-addons container gets
/// `--logtostderr=false --alsologtostderr=true --log_file=csi-logs/csi-addons.log`, relative to the
/// container's `/`, where the logs volume is mounted, and its log-rotator container runs logrotate
/// over the folder. The sidecar starts, writes every line to stderr and to the file, and after a
/// `copytruncate` rotation its next lines start the emptied file (no hole of the old size).
#[tokio::test]
async fn ceph_csi_operators_log_rotation_arguments_start_the_sidecar_and_logrotate_rotates_its_file() {
    let deployment = Deployment::new("rook-ceph-logs").await;
    let driver_name = "rook-ceph.rbd.csi.ceph.com";
    let driver = RecordingDriver::start(driver_name, false, true);
    driver.advertise(&["service.NODE_SERVICE", "reclaim_space.ONLINE"]);
    let node = "worker-1";
    let owner = (Workload::DaemonSet, "rook-ceph.rbd.csi.ceph.com-nodeplugin");
    let pod = deployment.pod(node, owner, "rook-ceph.rbd.csi.ceph.com-nodeplugin-l0g5r").await;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("csi-logs")).unwrap();
    let mut args = ceph_csi_operator_args(&pod, node, &driver.endpoint(), free_port());
    args.extend(["--logtostderr=false".into(), "--alsologtostderr=true".into()]);
    args.push("--log_file=csi-logs/csi-addons.log".into());
    let mut sidecar = SidecarProcess::verbatim_in(&args, Some(root.path()));
    deployment.connected(1).await;

    let file = root.path().join("csi-logs/csi-addons.log");
    let before = std::fs::read_to_string(&file).unwrap();
    assert!(before.contains("registered"), "the log file lacks the registration:\n{before}");
    assert!(!before.contains('\x1b'), "the log file holds terminal colour codes:\n{before:?}");
    assert!(!sidecar.log().contains('\x1b'), "stderr, not a terminal, holds colour codes");
    for line in before.lines() {
        assert!(sidecar.log().contains(line), "a line of the file is not on stderr: {line}");
    }

    let config = root.path().join("logrotate.conf");
    let rules = "{\n  copytruncate\n  rotate 2\n  size 1\n  missingok\n  nocompress\n}\n";
    std::fs::write(&config, format!("{}/csi-logs/*.log {rules}", root.path().display())).unwrap();
    let state = root.path().join("logrotate.state");
    let installed =
        std::process::Command::new(integration_tests::root().join("hack/packages.sh")).arg("logrotate").status();
    assert!(installed.is_ok_and(|s| s.success()), "hack/packages.sh logrotate failed");
    let rotated = std::process::Command::new("logrotate")
        .arg("--state")
        .arg(&state)
        .arg(&config)
        .output()
        .expect("running logrotate");
    assert!(rotated.status.success(), "logrotate: {}", String::from_utf8_lossy(&rotated.stderr));
    assert_eq!(std::fs::read_to_string(root.path().join("csi-logs/csi-addons.log.1")).unwrap(), before);

    // SIGTERM: the sidecar logs its shutdown, after the truncation.
    assert!(sidecar.terminate().success(), "{}", sidecar.log());
    let after = std::fs::read(&file).unwrap();
    assert!(!after.is_empty() && after[0] != 0, "the next lines do not start the emptied file: {after:?}");
    let after = String::from_utf8(after).unwrap();
    assert!(after.contains("shutting down") && !after.contains("registered"), "{after}");
}
