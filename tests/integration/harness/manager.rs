//! The manager as a real process, and the Kubernetes objects its reconcilers act on: CSI PVs and
//! PVCs bound by direct writes (no PV binder runs here), VolumeAttachments, jobs.
use std::process::{Child, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::json;
use testenv::manager::Ports;
use testenv::poll::MINUTE;

use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{Serving, SidecarPod, SidecarProcess, Workload, free_port, http_get, sidecar_pod};
use crate::harness::support::{create_job, dynamic, unique, workspace_binary};

pub struct Manager {
    pub child: Child,
    pub health: u16,
    pub metrics: u16,
    _dir: tempfile::TempDir,
    log: std::path::PathBuf,
}

impl Drop for Manager {
    fn drop(&mut self) {
        testenv::process::stop(&mut self.child, Duration::from_secs(5));
    }
}

impl Manager {
    /// A manager whose settings live in `namespace` and which watches only that namespace (tests
    /// share one API server; each manager must leave the others' objects alone).
    pub fn start(namespace: &str, kubeconfig: &std::path::Path, extra: &[&str]) -> Self {
        let (health, metrics) = (free_port(), free_port());
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("manager.log");
        let mut command = testenv::manager::ours(&workspace_binary("csi-addons-manager"));
        testenv::manager::configure(
            &mut command,
            Some(namespace),
            kubeconfig,
            Ports { health, metrics: Some(metrics) },
        );
        // Plain-HTTP metrics unless the test is about the secure ones.
        if !extra.iter().any(|a| a.contains("metrics-secure")) {
            command.arg("-metrics-secure=false");
        }
        command
            .arg(format!("--watch-namespace={namespace}"))
            .args(["--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s"])
            .args(["--leader-election-retry-period=1s"])
            .args(extra)
            .env("RUST_LOG", "info,operator=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = testenv::process::spawn(command).unwrap();
        Manager { child, health, metrics, _dir: dir, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `check` for up to 60 s; the panic carries the manager's log.
    pub async fn eventually(&self, what: &str, check: impl AsyncFn(&Manager) -> bool) {
        if testenv::poll::until(MINUTE, async || check(self).await.then_some(())).await.is_none() {
            panic!("timed out waiting for {what}; manager log:\n{}", self.log());
        }
    }

    pub async fn leading(&self) -> Option<bool> {
        let (_, body) = http_get(self.metrics, "/metrics").await?;
        let line = body.lines().find(|l| l.starts_with("leader_election_master_status{"))?;
        Some(line.ends_with(" 1"))
    }

    pub async fn metrics_text(&self) -> String {
        http_get(self.metrics, "/metrics").await.map(|(_, body)| body).unwrap_or_default()
    }
}

/// A CSI PV of `driver` and a PVC bound to it (both statuses Bound), with `annotations` on the
/// PVC and `class` as its StorageClass. Returns the PV's name.
pub async fn bound_pvc(
    client: &kube::Client,
    namespace: &str,
    pvc: &str,
    driver: &str,
    class: Option<&str>,
    annotations: serde_json::Value,
) -> String {
    let pv = unique("pv");
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": pvc, "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": class.unwrap_or(""), "volumeName": pv},
    }))
    .unwrap();
    let claim = pvcs.create(&PostParams::default(), &claim).await.unwrap();
    create_pv(client, &pv, driver, namespace, pvc, claim.metadata.uid.as_deref()).await;
    set_phase(client, namespace, pvc, &pv, "Bound").await;
    pv
}

/// A CSI PV claimed by `namespace/pvc`.
pub async fn create_pv(client: &kube::Client, pv: &str, driver: &str, namespace: &str, pvc: &str, uid: Option<&str>) {
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": driver, "volumeHandle": format!("handle-{pv}")},
            "claimRef": {"namespace": namespace, "name": pvc, "uid": uid},
        },
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &volume).await.unwrap();
}

/// Writes the PV's and the PVC's `status.phase`, as the PV binder would.
pub async fn set_phase(client: &kube::Client, namespace: &str, pvc: &str, pv: &str, phase: &str) {
    let patch = json!({"status": {"phase": phase}});
    Api::<PersistentVolume>::all(client.clone())
        .patch_status(pv, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .patch_status(pvc, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// An attached VolumeAttachment of `pv` on `node`, as the attacher would leave it.
pub async fn attach(client: &kube::Client, pv: &str, node: &str, driver: &str) {
    let name = unique("va");
    let attachment: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": driver, "nodeName": node, "source": {"persistentVolumeName": pv}},
    }))
    .unwrap();
    let api = Api::<VolumeAttachment>::all(client.clone());
    api.create(&PostParams::default(), &attachment).await.unwrap();
    let patch = json!({"status": {"attached": true}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// The job's status once it has a result (2 min at most; the panic carries the manager's log).
pub async fn job_result(manager: &Manager, api: &Api<kube::api::DynamicObject>, name: &str) -> serde_json::Value {
    let result = testenv::poll::until(2 * MINUTE, async || {
        let job = api.get_opt(name).await.unwrap()?;
        job.data.get("status").filter(|status| status.get("result").is_some()).cloned()
    })
    .await;
    match result {
        Some(status) => status,
        None => {
            let job = api.get_opt(name).await.unwrap();
            panic!("job {name} has no result: {job:?}\nmanager log:\n{}", manager.log())
        }
    }
}

/// GET `path` over HTTPS from 127.0.0.1:`port`, trusting `ca_pem`, with an optional bearer token.
pub async fn https_get(port: u16, path: &str, ca_pem: &str, token: Option<&str>) -> Option<(u16, String)> {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = cluster_client::tls::crypto_provider();
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.ok()?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    // A peer closing without close_notify still delivered the response.
    let _ = stream.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((code, body))
}

/// A kubeconfig for the manager's own identity: ServiceAccount `csi-addons-controller-manager` in
/// `namespace`, bound to config/rbac's ClusterRole (cluster-wide) and leader-election Role (in
/// `namespace`) as shipped — so a test passing with it shows that RBAC is enough.
pub struct ManagerIdentity {
    dir: tempfile::TempDir,
    user: String,
}

impl ManagerIdentity {
    /// Ours: config/rbac's ClusterRole and leader-election Role.
    pub async fn new(client: &kube::Client, namespace: &str) -> Self {
        let read = |file: &str| -> serde_json::Value {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/rbac").join(file);
            serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        let (role, election) = (read("role.yaml"), read("leader_election_role.yaml"));
        Self::with_roles(client, namespace, "csi-addons-controller-manager", role, (namespace, election)).await
    }

    /// The release RBAC of `build`'s manager.
    pub async fn of(build: crate::harness::rig::Build, client: &kube::Client, namespace: &str) -> Self {
        match build {
            crate::harness::rig::Build::Ours => Self::new(client, namespace).await,
            crate::harness::rig::Build::Upstream => Self::upstream(client, namespace).await,
        }
    }

    /// Upstream's v0.14.0 manager: the ClusterRole and leader-election Role of its
    /// deploy/controller/rbac.yaml, as its users install them.
    pub async fn upstream(client: &kube::Client, namespace: &str) -> Self {
        let text = std::fs::read_to_string(crate::harness::rig::upstream("rbac")).unwrap();
        let documents: Vec<serde_json::Value> =
            serde_yaml::Deserializer::from_str(&text).filter_map(|d| serde_json::Value::deserialize(d).ok()).collect();
        let find = |kind: &str, name: &str| {
            documents.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).cloned().unwrap()
        };
        let role = find("ClusterRole", "csi-addons-manager-role");
        let election = find("Role", "csi-addons-leader-election-role");
        // Its own account: a benchmark runs both managers in one namespace and tells their requests
        // apart by user.
        // Its Role where it looks for csi-addons-config whatever POD_NAMESPACE says.
        let home = "csi-addons-system";
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
        let object = serde_json::from_value(json!({"metadata": {"name": home}})).unwrap();
        if let Err(kube::Error::Api(e)) = namespaces.create(&PostParams::default(), &object).await {
            assert_eq!(e.code, 409, "{e:?}");
        }
        Self::with_roles(client, namespace, "upstream-csi-addons-manager", role, (home, election)).await
    }

    /// ServiceAccount `account` of `namespace` bound to `role` (renamed to be unique) and to the
    /// leader-election Role `election` in its namespace.
    pub async fn with_roles(
        client: &kube::Client,
        namespace: &str,
        account: &str,
        mut role: serde_json::Value,
        (election_namespace, mut election): (&str, serde_json::Value),
    ) -> Self {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
        let cp = testenv::shared();
        let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]);
        let role_name = unique("csi-addons-manager-role");
        role["metadata"] = json!({"name": role_name});
        let role: ClusterRole = serde_json::from_value(role).unwrap();
        Api::<ClusterRole>::all(client.clone()).create(&PostParams::default(), &role).await.unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": role_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": subject,
        }))
        .unwrap();
        Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
        // config/ names kustomize's placeholder namespace; here it is the test's.
        let election_name = unique(election["metadata"]["name"].as_str().unwrap_or("leader-election"));
        election["metadata"] = json!({"name": election_name, "namespace": election_namespace});
        let election: Role = serde_json::from_value(election).unwrap();
        Api::<Role>::namespaced(client.clone(), election_namespace)
            .create(&PostParams::default(), &election)
            .await
            .unwrap();
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": election_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": election_name},
            "subjects": subject,
        }))
        .unwrap();
        Api::<RoleBinding>::namespaced(client.clone(), election_namespace)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        let token = cp.token(client, namespace, account).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": cp.server_url(), "certificate-authority": cp.ca_cert_path()}}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "manager", "context": {"cluster": "test", "user": account}}],
            "current-context": "manager",
        });
        std::fs::write(dir.path().join("kubeconfig"), serde_json::to_string(&kubeconfig).unwrap()).unwrap();
        ManagerIdentity { dir, user: format!("system:serviceaccount:{namespace}:{account}") }
    }

    /// The user name the API server (and its audit log) knows the manager by.
    pub fn user(&self) -> &str {
        &self.user
    }

    pub fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.path().join("kubeconfig")
    }
}

/// A namespace, a driver advertising `capabilities`, and the manager (auth off on both sides).
pub struct Stage {
    pub client: kube::Client,
    pub namespace: String,
    pub driver_name: String,
    pub driver: RecordingDriver,
    pub manager: Manager,
    identity: ManagerIdentity,
    controller: bool,
    /// The manager's flags (those of a restart too).
    flags: Vec<String>,
}

impl Stage {
    pub async fn new(prefix: &str, capabilities: &[&str]) -> Self {
        Self::with_flags(prefix, capabilities, &[]).await
    }

    /// A stage whose manager also gets `flags`.
    pub async fn with_flags(prefix: &str, capabilities: &[&str], flags: &[&str]) -> Self {
        let cp = testenv::shared();
        let client = cp.client().await.unwrap();
        let namespace = cp.namespace(&client, prefix).await.unwrap();
        let driver_name = format!("{prefix}.csi-addons-rs.io");
        let driver = RecordingDriver::start(&driver_name, true, false);
        driver.advertise(capabilities);
        // The manager runs as its own ServiceAccount with config/rbac's roles: they are enough.
        let identity = ManagerIdentity::new(&client, &namespace).await;
        let mut all = vec!["--enable-auth=false".to_owned()];
        all.extend(flags.iter().map(|f| (*f).to_owned()));
        let manager =
            Manager::start(&namespace, &identity.kubeconfig(), &all.iter().map(String::as_str).collect::<Vec<_>>());
        let controller = capabilities.contains(&"service.CONTROLLER_SERVICE");
        Stage { client, namespace, driver_name, driver, manager, identity, controller, flags: all }
    }

    /// Stops the manager (SIGTERM), then starts another with the same identity and flags, as a
    /// Pod restart or a failover would.
    pub fn restart_manager(&mut self) {
        testenv::process::stop(&mut self.manager.child, Duration::from_secs(10));
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        self.manager = Manager::start(&self.namespace, &self.identity.kubeconfig(), &flags);
    }

    /// Another manager with the same identity and flags, beside the stage's (with
    /// `--leader-elect`, a standby).
    pub fn another_manager(&self) -> Manager {
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        Manager::start(&self.namespace, &self.identity.kubeconfig(), &flags)
    }

    /// Starts the sidecar of `node` and waits until the manager has connected to it.
    pub async fn sidecar(&self, node: &str) -> SidecarProcess {
        let pod = sidecar_pod(&self.client, &self.namespace, node, Workload::DaemonSet, "plugin").await;
        self.sidecar_in(&pod, node).await
    }

    /// Starts a sidecar in `pod` on `node` and waits until the manager has connected to it.
    pub async fn sidecar_in(&self, pod: &SidecarPod, node: &str) -> SidecarProcess {
        let sidecar = SidecarProcess::start(pod, node, &self.driver.endpoint(), Serving::Plain, &[]);
        // Only a sidecar of a driver with a controller service competes for the driver's Lease.
        if self.controller {
            sidecar.wait_leader(true).await;
        } else {
            sidecar.wait_ready().await;
        }
        let nodes = dynamic(&self.client, &self.namespace, "CSIAddonsNode");
        self.manager
            .eventually("the CSIAddonsNode to be Connected", async |_| {
                let list = nodes.list(&ListParams::default()).await.unwrap();
                list.items.iter().any(|n| n.data.pointer("/status/state") == Some(&json!("Connected")))
            })
            .await;
        sidecar
    }

    /// The namespaced Api of a csiaddons.openshift.io kind in the stage's namespace.
    pub fn api(&self, kind: &str) -> Api<kube::api::DynamicObject> {
        dynamic(&self.client, &self.namespace, kind)
    }

    /// Creates a job and returns its status once it has a result.
    pub async fn job(&self, kind: &str, name: &str, spec: serde_json::Value) -> serde_json::Value {
        create_job(&self.client, &self.namespace, kind, name, spec).await;
        job_result(&self.manager, &self.api(kind), name).await
    }

    /// The message of a Warning event `reason` on `object`, if there is one.
    pub async fn warning(&self, object: &str, reason: &str) -> Option<String> {
        warning_in(&Api::namespaced(self.client.clone(), &self.namespace), object, reason).await
    }
}

/// The message of a Warning event `reason` on `object` among `events`, if one comes within ten
/// seconds: the manager records an event just after the status a caller has seen.
pub async fn warning_in(events: &Api<Event>, object: &str, reason: &str) -> Option<String> {
    testenv::poll::until(Duration::from_secs(10), async || {
        let list = events.list(&ListParams::default()).await.unwrap();
        let found = list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some(object)
                && e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
        });
        found.map(|event| event.message)
    })
    .await
    .flatten()
}
