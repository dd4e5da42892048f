//! The demo's stack: control plane, reference driver (controller and node), a sidecar next to each,
//! csi-provisioner and the manager, as local processes that die with this one.
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

use crate::kube_apply::Applier;
use crate::peers::{Build, ServiceAccountFiles};
use crate::{Error, Result};

pub const DRIVER: &str = "reference.csi-addons-rs.io";
pub const NODE: &str = "demo-node";
/// The node plugin's address: the driver registers it as a fence client and refuses to publish
/// while it is fenced.
pub const NODE_IP: &str = "10.77.0.5";
pub const DRIVER_NAMESPACE: &str = "reference-driver";
pub const MANAGER_NAMESPACE: &str = "csi-addons-system";
pub const DEMO_NAMESPACE: &str = "demo";
const MANAGER_ACCOUNT: &str = "csi-addons-controller-manager";
const SIDECAR_ACCOUNT: &str = "csi-addons-sidecar";

/// Where the stack finds what it runs.
pub struct Options {
    /// Everything the demo writes: state, sockets, logs, the kubelet's directories.
    pub dir: PathBuf,
    /// Holds reference-driver, csi-addons-sidecar and csi-addons-manager.
    pub bin_dir: PathBuf,
    pub csi_provisioner: PathBuf,
    /// Which build runs the sidecars, and which the manager (upstream's for the interop suite).
    pub sidecar: Build,
    pub manager: Build,
    /// Bearer tokens and TLS between the manager and the sidecars, as deployed by default.
    pub auth: bool,
}

impl Options {
    /// The demo: our builds throughout, with the shipped defaults: the manager calls each sidecar
    /// over TLS with its ServiceAccount token, which the sidecar checks with TokenReview against
    /// `--allowed-identities`.
    pub fn demo(dir: PathBuf, bin_dir: PathBuf, csi_provisioner: PathBuf) -> Self {
        Options { dir, bin_dir, csi_provisioner, sidecar: Build::Ours, manager: Build::Ours, auth: true }
    }

    /// Whether a half runs upstream's build.
    fn interop(&self) -> bool {
        self.sidecar.is_upstream() || self.manager.is_upstream()
    }
}

/// A process of the stack and its log.
pub struct Component {
    pub name: &'static str,
    child: Child,
    pub log: PathBuf,
}

pub struct Stack {
    pub dir: PathBuf,
    pub control_plane: testenv::ControlPlane,
    pub client: kube::Client,
    pub applier: Applier,
    components: Vec<Component>,
    /// The node plugin's CSI socket: the story makes the kubelet's calls on it.
    pub node_csi: Channel,
}

impl Stack {
    /// Starts everything, printing a line per component through `say`.
    pub async fn start(options: &Options, say: &dyn Fn(&str)) -> Result<Stack> {
        crate::cleanup::remove_demo_dir(&options.dir)?;
        for sub in ["logs", "state", "controller", "node", "kubelet"] {
            std::fs::create_dir_all(options.dir.join(sub)).map_err(Error::io(format!("creating {sub}/")))?;
        }
        say("starting etcd, kube-apiserver and kube-controller-manager (persistentvolume-binder only)");
        // ControlPlane::start blocks on a runtime of its own: run it off this one.
        let control_plane = std::thread::spawn(|| {
            let cp = testenv::ControlPlane::start()?;
            cp.ensure_controller_manager(&["persistentvolume-binder"])?;
            Ok::<_, testenv::Error>(cp)
        })
        .join()
        .map_err(|_| Error::Manifest("the control plane start-up panicked".into()))??;
        let client = control_plane.client().await?;
        let applier = Applier::new(&client).await?;
        let mut stack = Stack {
            dir: options.dir.clone(),
            control_plane,
            client,
            applier,
            components: Vec::new(),
            node_csi: Endpoint::from_static("http://localhost").connect_lazy(),
        };
        stack.install(say).await?;

        say("starting the reference driver: controller and node plugins sharing one state directory");
        for (mode, extra) in [("controller", vec![]), ("node", vec!["--node-ip", NODE_IP])] {
            let mut command = Command::new(options.bin_dir.join("reference-driver"));
            let socket = |name: &str| format!("unix://{}", stack.dir.join(mode).join(name).display());
            command
                .args(["--mode", mode, "--driver-name", DRIVER, "--node-id", NODE])
                .args(["--endpoint", &socket("csi.sock"), "--addons-endpoint", &socket("csi-addons.sock")])
                .arg("--state-dir")
                .arg(stack.dir.join("state"))
                .args(extra);
            let name = if mode == "controller" { "reference-driver (controller)" } else { "reference-driver (node)" };
            stack.spawn(name, command)?;
            for socket in ["csi.sock", "csi-addons.sock"] {
                stack.wait_for_file(name, &stack.dir.join(mode).join(socket)).await?;
            }
        }
        stack.node_csi = unix_channel(&stack.dir.join("node/csi.sock")).await?;

        let interop = options.interop();
        if interop {
            say(&format!(
                "interop: sidecars {}, manager {}; the sidecars register pod:// endpoints (upstream's default, and \
                 the only form upstream's manager takes) and their Pods' status.podIP is set to 127.0.0.1",
                options.sidecar.label(),
                options.manager.label()
            ));
        }
        say("registering a sidecar next to each plugin (Pods of a StatefulSet and a DaemonSet; no kubelet runs)");
        if options.auth {
            say("authentication on, as shipped: the sidecars serve TLS (self-signed) and accept only a bearer token \
                 that TokenReview says is csi-addons-controller-manager's");
        } else {
            say("authentication OFF (--enable-auth=false): not a configuration to ship");
        }
        let admin = stack.control_plane.kubeconfig_path().to_path_buf();
        // Upstream's sidecars run as one ServiceAccount, as a driver's Pods do.
        let sidecar_account = match &options.sidecar {
            Build::Ours => None,
            Build::Upstream(binary) => {
                Some((binary, stack.service_account(DRIVER_NAMESPACE, SIDECAR_ACCOUNT, true).await?))
            }
        };
        for (mode, workload, pod) in [
            ("controller", "StatefulSet", "reference-csi-controller-0"),
            ("node", "DaemonSet", "reference-csi-node-d7x4q"),
        ] {
            let uid = stack.sidecar_pod(workload, pod, interop).await?;
            let mut command = match &sidecar_account {
                None => {
                    let mut command = Command::new(options.bin_dir.join("csi-addons-sidecar"));
                    command.env("KUBECONFIG", &admin).env_remove("KUBERNETES_SERVICE_HOST");
                    command
                }
                Some((binary, account)) => account.in_cluster_command(binary, &stack.api_port()),
            };
            // The same flags for either build.
            command
                .arg(format!("-csi-addons-address=unix://{}", stack.dir.join(mode).join("csi-addons.sock").display()))
                .arg(format!("-node-id={NODE}"))
                .arg(format!("-controller-port={}", free_port()?))
                .arg(format!("-pod={pod}"))
                .arg(format!("-namespace={DRIVER_NAMESPACE}"))
                .arg(format!("-pod-uid={uid}"))
                .arg(format!("-stagingpath={}", stack.staging_root().display()))
                .arg(format!("-enable-auth={}", options.auth));
            if !interop {
                // An `ip:port` endpoint on loopback: no Pod IP to look up.
                command.arg("-controller-ip=127.0.0.1");
            }
            stack.spawn(if mode == "controller" { "sidecar (controller)" } else { "sidecar (node)" }, command)?;
        }

        let manager_account =
            stack.service_account(MANAGER_NAMESPACE, MANAGER_ACCOUNT, options.manager.is_upstream()).await?;
        let kubeconfig = stack.manager_kubeconfig(&manager_account).await?;
        let (mut manager, metrics) = match &options.manager {
            Build::Ours => {
                say("starting csi-addons-manager as its ServiceAccount, bound to the release RBAC (no Secrets)");
                let mut manager = testenv::manager::ours(&options.bin_dir.join("csi-addons-manager"));
                manager.arg(format!("--sidecar-token-file={}", manager_account.token().display()));
                (manager, Some(free_port()?))
            }
            Build::Upstream(binary) => {
                say("starting upstream's manager v0.14.0 as the manager's ServiceAccount (cluster-admin: a test peer)");
                let mut manager = manager_account.in_cluster_command(binary, &stack.api_port());
                manager.arg("--leader-elect=false");
                (manager, None)
            }
        };
        let ports = testenv::manager::Ports { health: free_port()?, metrics };
        testenv::manager::configure(&mut manager, Some(MANAGER_NAMESPACE), &kubeconfig, ports);
        manager.arg(format!("--enable-auth={}", options.auth));
        stack.spawn("csi-addons-manager", manager)?;

        say("starting csi-provisioner v6.3.0 against the controller plugin");
        let mut provisioner = Command::new(&options.csi_provisioner);
        provisioner
            .arg(format!("--csi-address={}", stack.dir.join("controller/csi.sock").display()))
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["--leader-election=false", "--timeout=60s", "--extra-create-metadata", "-v=2"])
            // No kubelet registers a CSINode with the driver's topology keys: provision without topology.
            .arg("--feature-gates=Topology=false");
        stack.spawn("csi-provisioner", provisioner)?;

        let nodes = stack.applier.api("csiaddons.openshift.io/v1alpha1", "CSIAddonsNode", DRIVER_NAMESPACE)?;
        stack
            .until("both CSIAddonsNodes to be Connected", 90, async || {
                let list = nodes.list(&ListParams::default()).await?;
                let connected =
                    list.items.iter().filter(|n| n.data.pointer("/status/state") == Some(&json!("Connected")));
                Ok((connected.count() == 2).then_some(()))
            })
            .await?;
        say("both CSIAddonsNodes Connected");
        Ok(stack)
    }

    /// Namespaces, the demo's Node, and the manager's RBAC from deploy/controller/rbac.yaml.
    async fn install(&self, say: &dyn Fn(&str)) -> Result<()> {
        say("installing the CSI-Addons CRDs and the manager's RBAC (deploy/controller/rbac.yaml)");
        for namespace in [MANAGER_NAMESPACE, DRIVER_NAMESPACE, DEMO_NAMESPACE] {
            self.applier
                .apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}))
                .await?;
        }
        // The Node the demo's plugins stand for (no kubelet registers it).
        self.applier.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})).await?;
        let rbac = repository().join("deploy/controller/rbac.yaml");
        let yaml = std::fs::read_to_string(&rbac).map_err(Error::io(format!("reading {}", rbac.display())))?;
        self.applier.apply_yaml(&yaml).await
    }

    /// A ServiceAccount's token (TokenRequest) written as a Pod would find it; with `cluster_admin`,
    /// bound to cluster-admin, as upstream's binaries are: test peers here, whose RBAC is not ours
    /// to prove.
    async fn service_account(
        &self,
        namespace: &str,
        account: &str,
        cluster_admin: bool,
    ) -> Result<ServiceAccountFiles> {
        let token = self.control_plane.token(&self.client, namespace, account).await?;
        if cluster_admin {
            self.applier
                .apply(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": format!("interop-upstream-{account}")},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
                }))
                .await?;
        }
        let dir = self.dir.join("serviceaccounts").join(account);
        ServiceAccountFiles::write(dir, &token, self.control_plane.ca_cert_path(), namespace)
    }

    /// The API server's port on 127.0.0.1.
    fn api_port(&self) -> String {
        let url = self.control_plane.server_url();
        url.trim_end_matches('/').rsplit(':').next().unwrap_or_default().to_owned()
    }

    /// A kubeconfig with the manager's ServiceAccount token.
    async fn manager_kubeconfig(&self, account: &ServiceAccountFiles) -> Result<PathBuf> {
        let token = std::fs::read_to_string(account.token()).map_err(Error::io("reading the manager's token"))?;
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "demo", "cluster": {
                "server": self.control_plane.server_url(),
                "certificate-authority": self.control_plane.ca_cert_path(),
            }}],
            "users": [{"name": MANAGER_ACCOUNT, "user": {"token": token}}],
            "contexts": [{"name": "manager", "context": {"cluster": "demo", "user": MANAGER_ACCOUNT}}],
            "current-context": "manager",
        });
        let path = self.dir.join("manager.kubeconfig");
        std::fs::write(&path, kubeconfig.to_string()).map_err(Error::io("writing the manager's kubeconfig"))?;
        Ok(path)
    }

    /// The workload and its Pod that a sidecar registers for; returns the Pod's UID. With
    /// `loopback_ip`, the Pod's status gets the IP a kubelet would give it: 127.0.0.1, where the
    /// sidecar listens, for managers that dial `pod://` endpoints through the Pod's IP.
    async fn sidecar_pod(&self, kind: &str, pod: &str, loopback_ip: bool) -> Result<String> {
        let app = pod.rsplit_once('-').map_or(pod, |(base, _)| base);
        let spec = json!({
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "plugin", "image": "reference-driver"}]}},
        });
        let workload = self
            .applier
            .apply(json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": app, "namespace": DRIVER_NAMESPACE}, "spec": spec}))
            .await?;
        let owner = json!({
            "apiVersion": "apps/v1", "kind": kind, "name": app,
            "uid": workload.metadata.uid.unwrap_or_default(), "controller": true,
        });
        let pods: Api<DynamicObject> = self.applier.api("v1", "Pod", DRIVER_NAMESPACE)?;
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": DRIVER_NAMESPACE, "labels": {"app": app}, "ownerReferences": [owner]},
            "spec": {"nodeName": NODE, "containers": [{"name": "csi-addons", "image": "csi-addons-sidecar"}]},
        }))
        .map_err(|e| Error::Manifest(e.to_string()))?;
        let created = pods.create(&PostParams::default(), &object).await?;
        if loopback_ip {
            let status = json!({"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}});
            pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(&status)).await?;
        }
        Ok(created.metadata.uid.unwrap_or_default())
    }

    /// The kubelet's CSI staging root the node sidecar is told about.
    pub fn staging_root(&self) -> PathBuf {
        self.dir.join("kubelet/plugins/kubernetes.io/csi")
    }

    fn spawn(&mut self, name: &'static str, command: Command) -> Result<()> {
        let log = self.dir.join("logs").join(format!("{}.log", name.replace([' ', '(', ')'], "")));
        let child = testenv::process::spawn_logged(command, &log).map_err(Error::io(format!("starting {name}")))?;
        self.components.push(Component { name, child, log });
        Ok(())
    }

    /// The last lines of a component's log (the control plane's own components included).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let log = match self.components.iter().find(|c| c.name == component) {
            Some(c) => c.log.clone(),
            None => self.control_plane.dir().join(format!("{component}.log")),
        };
        testenv::process::tail(&log, lines)
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// A component that has exited, if any (named, with its exit status).
    pub fn exited(&mut self) -> Option<String> {
        self.components
            .iter_mut()
            .find_map(|c| c.child.try_wait().ok().flatten().map(|status| format!("{} exited ({status})", c.name)))
    }

    async fn wait_for_file(&mut self, component: &'static str, path: &Path) -> Result<()> {
        let created = testenv::poll::try_until(Duration::from_secs(30), async || match self.exited() {
            _ if path.exists() => Ok(Some(())),
            Some(exited) => Err(Error::Manifest(exited)),
            None => Ok(None),
        })
        .await?;
        created.ok_or_else(|| Error::Timeout { what: format!("{component} to create {}", path.display()), seconds: 30 })
    }

    /// Polls `check` until it yields a value; after `seconds`, a timeout that names `what`.
    pub async fn until<T>(&self, what: &str, seconds: u64, check: impl AsyncFnMut() -> Result<Option<T>>) -> Result<T> {
        testenv::poll::try_until(Duration::from_secs(seconds), check)
            .await?
            .ok_or_else(|| Error::Timeout { what: what.to_owned(), seconds })
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // The manager and sidecars first, so that nothing acts on a half-stopped stack.
        for component in self.components.iter_mut().rev() {
            testenv::process::stop(&mut component.child, Duration::from_secs(5));
        }
        self.control_plane.stop();
        // What a story stopped midway left staged or published (the logs stay for reading).
        crate::cleanup::unmount_under(&self.dir);
    }
}

/// The repository the demo runs from (its deploy/ and config/).
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn free_port() -> Result<u16> {
    testenv::free_port().map_err(Error::io("finding a free port"))
}

/// A gRPC channel over a Unix socket.
pub async fn unix_channel(path: &Path) -> Result<Channel> {
    let failed = |e: tonic::transport::Error| Error::Connect {
        endpoint: path.display().to_string(),
        source: std::io::Error::other(e),
    };
    Endpoint::from_shared(format!("unix://{}", path.display())).map_err(failed)?.connect().await.map_err(failed)
}
