//! Helpers for the sidecar suites: the real `csi-addons-sidecar` process with the test control
//! plane's kubeconfig, the Pods and workloads it registers for, a test CA, and gRPC clients.
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::api::{Api, PostParams};
use serde_json::json;
use testenv::poll::MINUTE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::harness::support::workspace_binary;

/// The manager's identity in the tests: a ServiceAccount in another namespace than the sidecar's.
pub const MANAGER_SA: &str = "csi-addons-controller-manager";

/// A CA and a serving certificate for `localhost` / `127.0.0.1`, as files.
pub struct TestPki {
    _dir: tempfile::TempDir,
    pub ca_pem: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestPki {
    pub fn new() -> Self {
        Self::for_names(&["localhost", "127.0.0.1"])
    }

    /// A CA and a serving certificate for `names` (DNS names or IP addresses).
    pub fn for_names(names: &[&str]) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, "sidecar-test-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let serving = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
        let cert = serving.signed_by(&key, &issuer).unwrap();
        let pki = TestPki {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca_pem: ca_cert.pem(),
            _dir: dir,
        };
        std::fs::write(&pki.cert, cert.pem()).unwrap();
        std::fs::write(&pki.key, key.serialize_pem()).unwrap();
        pki
    }
}

/// The workload kinds a sidecar Pod can belong to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Workload {
    DaemonSet,
    StatefulSet,
    Deployment,
}

/// A Pod in the API server as the sidecar's Pod would be: on `node`, owned as `workload` is.
pub struct SidecarPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// What the Pod itself is owned by (the ReplicaSet for a Deployment).
    pub pod_owner: OwnerReference,
}

fn owner_of<K: Resource<DynamicType = ()>>(object: &K) -> OwnerReference {
    let mut reference = object.controller_owner_ref(&()).unwrap();
    reference.block_owner_deletion = None;
    reference
}

fn template(app: &str) -> serde_json::Value {
    json!({
        "selector": {"matchLabels": {"app": app}},
        "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "c", "image": "sidecar"}]}}
    })
}

/// Creates the workload (and for a Deployment its ReplicaSet) and a Pod it owns. No workload
/// controllers run in the test control plane, so nothing else touches them.
pub async fn sidecar_pod(
    client: &kube::Client,
    namespace: &str,
    node: &str,
    workload: Workload,
    owner_name: &str,
) -> SidecarPod {
    let name = format!("{}-{}", owner_name.chars().take(40).collect::<String>(), crate::harness::support::unique("p"));
    sidecar_pod_named(client, namespace, node, (workload, owner_name), &name).await
}

/// Creates `object`, or reads it when it exists (a second Pod of one workload).
async fn create_or_get<K>(api: &Api<K>, object: &K) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(created) => created,
        Err(kube::Error::Api(s)) if s.code == 409 => {
            api.get(&object.meta().name.clone().unwrap_or_default()).await.unwrap()
        }
        Err(e) => panic!("creating {:?}: {e}", object.meta().name),
    }
}

/// `sidecar_pod` with the Pod named `name`, as a project names its Pods (a Deployment's ReplicaSet
/// is `<owner>-5d4f8b7c9`).
pub async fn sidecar_pod_named(
    client: &kube::Client,
    namespace: &str,
    node: &str,
    (workload, owner_name): (Workload, &str),
    name: &str,
) -> SidecarPod {
    let meta = |name: &str| json!({"name": name, "namespace": namespace});
    let pod_owner = match workload {
        Workload::DaemonSet => {
            let ds: DaemonSet =
                serde_json::from_value(json!({"metadata": meta(owner_name), "spec": template(owner_name)})).unwrap();
            owner_of(&create_or_get(&Api::<DaemonSet>::namespaced(client.clone(), namespace), &ds).await)
        }
        Workload::StatefulSet => {
            let sts: StatefulSet =
                serde_json::from_value(json!({"metadata": meta(owner_name), "spec": template(owner_name)})).unwrap();
            owner_of(&create_or_get(&Api::<StatefulSet>::namespaced(client.clone(), namespace), &sts).await)
        }
        Workload::Deployment => {
            let deploy: Deployment =
                serde_json::from_value(json!({"metadata": meta(owner_name), "spec": template(owner_name)})).unwrap();
            let deploy = create_or_get(&Api::<Deployment>::namespaced(client.clone(), namespace), &deploy).await;
            let mut rs: ReplicaSet = serde_json::from_value(
                json!({"metadata": meta(&format!("{owner_name}-5d4f8b7c9")), "spec": template(owner_name)}),
            )
            .unwrap();
            rs.metadata.owner_references = Some(vec![owner_of(&deploy)]);
            owner_of(&create_or_get(&Api::<ReplicaSet>::namespaced(client.clone(), namespace), &rs).await)
        }
    };
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "containers": [{"name": "csi-addons", "image": "sidecar"}]}
    }))
    .unwrap();
    pod.metadata.owner_references = Some(vec![pod_owner.clone()]);
    let pod = Api::<Pod>::namespaced(client.clone(), namespace).create(&PostParams::default(), &pod).await.unwrap();
    SidecarPod {
        namespace: namespace.to_owned(),
        name: pod.metadata.name.unwrap(),
        uid: pod.metadata.uid.unwrap(),
        pod_owner,
    }
}

/// A free loopback TCP port below the ephemeral range (see [`testenv::free_port`]).
pub fn free_port() -> u16 {
    testenv::free_port().unwrap()
}

/// How the sidecar serves the controller.
pub enum Serving<'a> {
    /// `--tls-cert-file` / `--tls-key-file` from this PKI.
    Tls(&'a TestPki),
    /// Upstream's default: auth on, a self-signed certificate.
    SelfSigned,
    /// `--enable-auth=false`.
    Plain,
}

/// A running sidecar; killed when dropped.
pub struct SidecarProcess {
    child: Child,
    pub port: u16,
    pub http_port: u16,
    log: PathBuf,
    _log_dir: tempfile::TempDir,
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        testenv::process::stop(&mut self.child, Duration::from_secs(5));
    }
}

impl SidecarProcess {
    /// Starts the sidecar for `pod` against `driver_endpoint`; `extra` flags are appended.
    pub fn start(pod: &SidecarPod, node: &str, driver_endpoint: &str, serving: Serving<'_>, extra: &[String]) -> Self {
        let (port, http_port) = (free_port(), free_port());
        let log_dir = tempfile::tempdir().unwrap();
        let log = log_dir.path().join("sidecar.log");
        // The benchmark runs a release build.
        let binary = std::env::var_os("CSI_ADDONS_SIDECAR")
            .filter(|p| !p.is_empty())
            .map_or_else(|| workspace_binary("csi-addons-sidecar"), PathBuf::from);
        let mut command = Command::new(binary);
        command
            .arg(format!("-csi-addons-address={driver_endpoint}"))
            .arg(format!("-node-id={node}"))
            .arg(format!("-controller-port={port}"))
            .arg("-controller-ip=127.0.0.1")
            .arg(format!("-pod={}", pod.name))
            .arg(format!("-namespace={}", pod.namespace))
            .arg(format!("-pod-uid={}", pod.uid))
            .arg(format!("--http-address=127.0.0.1:{http_port}"))
            .arg("-leader-election-lease-duration=4s")
            .arg("-leader-election-renew-deadline=3s")
            .arg("-leader-election-retry-period=1s")
            .arg("-v=5")
            .env("KUBECONFIG", testenv::shared().kubeconfig_path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        match serving {
            Serving::Tls(pki) => {
                command.arg(format!("--tls-cert-file={}", pki.cert.display()));
                command.arg(format!("--tls-key-file={}", pki.key.display()));
            }
            Serving::SelfSigned => {}
            Serving::Plain => {
                command.arg("-enable-auth=false");
            }
        }
        command.args(extra);
        let child = testenv::process::spawn(command).unwrap();
        SidecarProcess { child, port, http_port, log, _log_dir: log_dir }
    }

    /// Runs the sidecar with exactly `args` (a project's command line), with the control plane's
    /// kubeconfig as its cluster access. It serves no HTTP: `port` and `http_port` are 0.
    pub fn verbatim(args: &[String]) -> Self {
        Self::verbatim_in(args, None)
    }

    /// As `verbatim`, in working directory `cwd` (where relative paths such as `--log_file`'s
    /// resolve, `/` in a container).
    pub fn verbatim_in(args: &[String], cwd: Option<&std::path::Path>) -> Self {
        let log_dir = tempfile::tempdir().unwrap();
        let log = log_dir.path().join("sidecar.log");
        let mut command = Command::new(workspace_binary("csi-addons-sidecar"));
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        command
            .args(args)
            .env("KUBECONFIG", testenv::shared().kubeconfig_path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = testenv::process::spawn(command).unwrap();
        SidecarProcess { child, port: 0, http_port: 0, log, _log_dir: log_dir }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET on the sidecar's HTTP server: (status code, body), or `None` when not answering.
    pub async fn http(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http_port, path).await
    }

    /// Waits until `/readyz` answers 200 (driver ready and CSIAddonsNode registered).
    pub async fn wait_ready(&self) {
        self.wait_for("/readyz answering 200", async |s| matches!(s.http("/readyz").await, Some((200, _)))).await;
    }

    /// Waits until the metrics say this sidecar holds (`true`) or does not hold its Lease.
    pub async fn wait_leader(&self, leading: bool) {
        let line = format!("csi_addons_sidecar_leader {}", i32::from(leading));
        self.wait_for(&line, async |s| {
            s.http("/metrics").await.is_some_and(|(_, body)| body.lines().any(|l| l == line))
        })
        .await;
    }

    /// Polls `check` for up to 60 s; fails with the sidecar's log.
    pub async fn wait_for(&self, what: &str, check: impl AsyncFn(&SidecarProcess) -> bool) {
        if testenv::poll::until(MINUTE, async || check(self).await.then_some(())).await.is_none() {
            panic!("timed out waiting for {what}; sidecar log:\n{}", self.log());
        }
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits up to 60 s for the process to exit by itself.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        match testenv::poll::until(MINUTE, async || self.exited()).await {
            Some(status) => status,
            None => panic!("the sidecar did not exit; log:\n{}", self.log()),
        }
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for the exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        testenv::process::stop(&mut self.child, Duration::from_secs(15));
        self.child.wait().unwrap()
    }
}

pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((code, body))
}

/// A channel to the sidecar over TLS, trusting `ca_pem`.
pub async fn tls_channel(port: u16, ca_pem: &str) -> Result<Channel, tonic::transport::Error> {
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)).domain_name("localhost");
    Endpoint::from_shared(format!("https://127.0.0.1:{port}"))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// A plain-TCP channel to the sidecar.
pub async fn plain_channel(port: u16) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?.connect_timeout(Duration::from_secs(5)).connect().await
}

/// `message` with `authorization: Bearer <token>`.
pub fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// The manager's token: ServiceAccount `MANAGER_SA` in a namespace of its own, and the identity
/// string to allow.
pub async fn manager_token(client: &kube::Client) -> (String, String) {
    let cp = testenv::shared();
    let namespace = cp.namespace(client, "csi-addons-system").await.unwrap();
    let token = cp.token(client, &namespace, MANAGER_SA).await.unwrap();
    (token, format!("system:serviceaccount:{namespace}:{MANAGER_SA}"))
}
