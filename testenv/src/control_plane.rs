use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};

use crate::error::Error;
use crate::{certs, ports, process};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A running etcd + kube-apiserver (+ kube-controller-manager) with the CRDs installed.
pub struct ControlPlane {
    dir: PathBuf,
    assets: PathBuf,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    server_url: String,
    ca_cert: PathBuf,
    sa_key: PathBuf,
    /// kube-apiserver's arguments, to start it again the same way.
    apiserver_args: Vec<String>,
    /// Where the API server writes its audit log, when asked for one.
    audit_log: Option<PathBuf>,
    processes: Mutex<Processes>,
}

#[derive(Default)]
struct Processes {
    etcd: Option<Child>,
    apiserver: Option<Child>,
    controller_manager: Option<(Vec<String>, Child)>,
}

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The control plane shared by every test of this test binary, started on first use. Panics with
/// the reason if it cannot start: no test of the binary can run without it.
pub fn shared() -> &'static ControlPlane {
    let started = SHARED.get_or_init(|| {
        // A plain thread: the caller may be inside a tokio runtime, where blocking on another
        // runtime is not allowed.
        let started = std::thread::spawn(|| ControlPlane::start().map_err(|e| e.to_string()))
            .join()
            .unwrap_or_else(|_| Err("control plane start-up panicked".to_owned()));
        if started.is_ok() {
            process::at_exit(|| SHARED.get().into_iter().flatten().for_each(ControlPlane::stop));
        }
        started
    });
    match started {
        Ok(cp) => cp,
        Err(e) => panic!("testenv: cannot start the control plane: {e}"),
    }
}

impl ControlPlane {
    /// Starts a new control plane (most tests want [`shared`] instead). Blocks; call it outside
    /// any async runtime.
    ///
    /// When etcd or kube-apiserver exits during start-up, starts again on new ports: a start can
    /// lose a race for its ports with another process on the machine, and every test of a binary
    /// fails without a control plane.
    pub fn start() -> Result<Self, Error> {
        const ATTEMPTS: u32 = 3;
        let mut attempt = 1;
        loop {
            match Self::start_once() {
                Err(e @ Error::Exited { .. }) if attempt < ATTEMPTS => {
                    eprintln!("testenv: control plane start {attempt} of {ATTEMPTS} failed, trying again: {e}");
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    fn start_once() -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Io("starting a runtime".into(), e))?;
        let assets = find_assets()?;
        remove_stale_dirs();
        // One directory per control plane: a test binary may run a second one (the end-to-end
        // suite) beside the shared one, and must not overwrite its certificates.
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}-{nth}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::Io(format!("creating {}", dir.display()), e))?;
        let pki = certs::write(&dir)?;

        let (etcd_port, etcd_peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let server_url = format!("https://127.0.0.1:{api_port}");
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");

        let mut processes = Processes::default();
        let mut etcd = Command::new(assets.join("etcd"));
        etcd.args([
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            "--unsafe-no-fsync=true".into(),
            // 8 GiB rather than etcd's 2 GiB: the benchmark's largest part keeps 100,000 volumes,
            // claims and cron jobs, with their revisions until the API server compacts them.
            "--quota-backend-bytes=8589934592".into(),
            "--log-level=warn".into(),
        ]);
        processes.etcd = Some(spawn_logged(etcd, &dir, "etcd")?);

        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--cert-dir={}", dir.display()),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            format!("--secure-port={api_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            format!("--service-account-issuer={server_url}"),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!("--service-account-signing-key-file={}", pki.sa_key.display()),
            "--authorization-mode=RBAC".into(),
            // No controller mints token Secrets; tokens come from the TokenRequest API.
            "--disable-admission-plugins=ServiceAccount".into(),
            "--allow-privileged=true".into(),
        ];
        let audit_log = audit_requested().then(|| dir.join("audit.log"));
        if let Some(log) = &audit_log {
            let policy = dir.join("audit-policy.yaml");
            std::fs::write(&policy, AUDIT_POLICY).map_err(|e| Error::Io("writing the audit policy".into(), e))?;
            apiserver_args.push(format!("--audit-policy-file={}", policy.display()));
            apiserver_args.push(format!("--audit-log-path={}", log.display()));
            apiserver_args.push("--audit-log-format=json".into());
            // Never rotated (the default rotates at 100 MB): requests are counted from an offset
            // in this one file, and a benchmark part with 10,000 objects writes more than that.
            apiserver_args.push("--audit-log-maxsize=1000000".into());
        }
        let mut apiserver = Command::new(assets.join("kube-apiserver"));
        apiserver.args(&apiserver_args);
        processes.apiserver = Some(spawn_logged(apiserver, &dir, "kube-apiserver")?);

        let kubeconfig = admin_kubeconfig(&server_url, &pki);
        let kubeconfig_path = dir.join("kubeconfig");
        let yaml = serde_yaml::to_string(&kubeconfig).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        std::fs::write(&kubeconfig_path, yaml).map_err(|e| Error::Io("writing the kubeconfig".into(), e))?;

        let cp = ControlPlane {
            dir,
            assets,
            kubeconfig,
            kubeconfig_path,
            server_url,
            ca_cert: pki.ca_cert,
            sa_key: pki.sa_key,
            apiserver_args,
            audit_log,
            processes: Mutex::new(processes),
        };
        let ready = runtime.block_on(async {
            let client = cp.client().await?;
            cp.wait_ready(&client).await?;
            install_crds(&client).await
        });
        match ready {
            Ok(()) => Ok(cp),
            Err(e) => {
                cp.stop();
                Err(e)
            }
        }
    }

    /// A new client with cluster-admin rights. Make one per test runtime: a client belongs to the
    /// tokio runtime it was made on.
    pub async fn client(&self) -> Result<Client, Error> {
        let config = self.config().await?;
        Ok(Client::try_from(config)?)
    }

    /// The admin client configuration.
    pub async fn config(&self) -> Result<Config, Error> {
        Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))
    }

    /// A kubeconfig file with cluster-admin rights, for processes under test and for people.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The CA that signed the API server's certificate.
    pub fn ca_cert_path(&self) -> &Path {
        &self.ca_cert
    }

    /// The directory holding certificates, logs and etcd data; removed on stop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's audit log (JSON lines, Metadata level, one line per finished request), when
    /// `TESTENV_AUDIT=1` asked for one.
    pub fn audit_log(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// Kills kube-apiserver (SIGKILL: no graceful shutdown), starts it again with the same flags
    /// and port, and waits until it is ready. Clients keep working: the port, certificates and etcd
    /// data are the same.
    pub async fn kill_and_restart_apiserver(&self) -> Result<(), Error> {
        self.restart_apiserver_with(&[]).await
    }

    /// As `kill_and_restart_apiserver`, with `extra` flags added to its own (a feature gate turned
    /// off, for one); the next restart without them drops them again.
    pub async fn restart_apiserver_with(&self, extra: &[&str]) -> Result<(), Error> {
        {
            let mut processes = self.lock();
            if let Some(mut child) = processes.apiserver.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let mut apiserver = Command::new(self.assets.join("kube-apiserver"));
            apiserver.args(&self.apiserver_args).args(extra);
            processes.apiserver = Some(spawn_logged(apiserver, &self.dir, "kube-apiserver")?);
        }
        let client = self.client().await?;
        self.wait_ready(&client).await
    }

    /// A new namespace named `<prefix>-<random>`, for one test.
    pub async fn namespace(&self, client: &Client, prefix: &str) -> Result<String, Error> {
        let ns = Namespace {
            metadata: ObjectMeta { generate_name: Some(format!("{prefix}-")), ..Default::default() },
            ..Default::default()
        };
        let created = Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
        created.metadata.name.ok_or_else(|| Error::Kubeconfig("the server returned a namespace without a name".into()))
    }

    /// A bearer token for ServiceAccount `namespace/name` (created if missing), from the
    /// TokenRequest API, as `kubectl create token` gets one.
    pub async fn token(&self, client: &Client, namespace: &str, name: &str) -> Result<String, Error> {
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
        let account = ServiceAccount {
            metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
            ..Default::default()
        };
        match accounts.create(&PostParams::default(), &account).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let request = TokenRequest {
            spec: TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() },
            ..Default::default()
        };
        let response = accounts.create_token_request(name, &PostParams::default(), &request).await?;
        response.status.map(|s| s.token).ok_or_else(|| Error::Kubeconfig("TokenRequest returned no status".into()))
    }

    /// Runs kube-controller-manager with exactly `controllers` (e.g. `persistentvolume-binder`),
    /// restarting it if it runs with another set. Only the named controllers run: with all of them
    /// on, hand-made Pods and owner references are garbage-collected from under the tests.
    pub fn ensure_controller_manager(&self, controllers: &[&str]) -> Result<(), Error> {
        let wanted: Vec<String> = controllers.iter().map(|c| (*c).to_owned()).collect();
        let mut processes = self.lock();
        if let Some((running, child)) = processes.controller_manager.as_mut() {
            if *running == wanted && matches!(child.try_wait(), Ok(None)) {
                return Ok(());
            }
            process::stop(child, STOP_GRACE);
        }
        processes.controller_manager = None;
        let port = free_port()?;
        let mut kcm = Command::new(self.assets.join("kube-controller-manager"));
        kcm.args([
            format!("--kubeconfig={}", self.kubeconfig_path.display()),
            format!("--controllers={}", wanted.join(",")),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--leader-elect=false".into(),
            format!("--root-ca-file={}", self.ca_cert.display()),
            format!("--service-account-private-key-file={}", self.sa_key.display()),
            "--use-service-account-credentials=false".into(),
        ]);
        let mut child = spawn_logged(kcm, &self.dir, "kube-controller-manager")?;
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline || !matches!(child.try_wait(), Ok(None)) {
                let detail = log_tail(&self.dir, "kube-controller-manager");
                process::stop(&mut child, STOP_GRACE);
                return Err(Error::NotReady { what: "kube-controller-manager", detail });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        processes.controller_manager = Some((wanted, child));
        Ok(())
    }

    /// Process ids of etcd and kube-apiserver (and kube-controller-manager when running).
    pub fn pids(&self) -> Vec<u32> {
        let processes = self.lock();
        let kcm = processes.controller_manager.as_ref().map(|(_, c)| c);
        [processes.etcd.as_ref(), processes.apiserver.as_ref(), kcm].into_iter().flatten().map(Child::id).collect()
    }

    /// Stops every process and removes the directory. Idempotent.
    pub fn stop(&self) {
        let mut processes = self.lock();
        if let Some((_, mut kcm)) = processes.controller_manager.take() {
            process::stop(&mut kcm, STOP_GRACE);
        }
        for mut child in [processes.apiserver.take(), processes.etcd.take()].into_iter().flatten() {
            process::stop(&mut child, STOP_GRACE);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Processes> {
        // A panic while holding the lock leaves the process handles usable.
        self.processes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn wait_ready(&self, client: &Client) -> Result<(), Error> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let request =
                http::Request::get("/readyz").body(Vec::new()).map_err(|e| Error::Kubeconfig(e.to_string()))?;
            let last_error = match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            let exited = {
                let mut processes = self.lock();
                let Processes { etcd, apiserver, .. } = &mut *processes;
                [("etcd", etcd), ("kube-apiserver", apiserver)].into_iter().find_map(|(name, child)| {
                    child.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None))).then_some(name)
                })
            };
            if let Some(name) = exited {
                return Err(Error::Exited { name, log: log_tail(&self.dir, name) });
            }
            if Instant::now() > deadline {
                let detail = format!("{last_error}; kube-apiserver log: {}", log_tail(&self.dir, "kube-apiserver"));
                return Err(Error::NotReady { what: "kube-apiserver", detail });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Applies every CRD of the project and waits until each is Established.
async fn install_crds(client: &Client) -> Result<(), Error> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply("csi-addons-testenv").force();
    for crd in api::crds::all().into_iter().chain(api::crds::driver_operator()) {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &params, &Patch::Apply(&crd)).await?;
        let established = await_condition(crds.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout(STARTUP_TIMEOUT, established).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(Error::NotReady { what: "a CRD", detail: format!("{name}: {e}") }),
            Err(_) => return Err(Error::NotReady { what: "a CRD", detail: format!("{name} not Established") }),
        }
    }
    Ok(())
}

fn admin_kubeconfig(server_url: &str, pki: &certs::Pki) -> Kubeconfig {
    let yaml = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {
            "server": server_url,
            "certificate-authority-data": base64(pki.ca_pem.as_bytes()),
        }}],
        "users": [{"name": "admin", "user": {
            "client-certificate-data": base64(pki.admin_cert_pem.as_bytes()),
            "client-key-data": base64(pki.admin_key_pem.as_bytes()),
        }}],
        "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": "admin"}}],
        "current-context": "testenv",
    });
    // The literal above has the shape of a kubeconfig; a failure here is a bug in this file.
    #[allow(clippy::expect_used)]
    serde_json::from_value(yaml).expect("the admin kubeconfig literal is a valid Kubeconfig")
}

fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Records who did what (user, verb, resource, response code), not bodies; once per request, when
/// it has finished.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
";

/// `TESTENV_AUDIT=1`: the benchmarks count each manager's requests from the audit log.
fn audit_requested() -> bool {
    std::env::var("TESTENV_AUDIT").is_ok_and(|v| v == "1")
}

const DIR_PREFIX: &str = "csi-addons-testenv-";

/// Removes directories left by test binaries that were killed (their pid is gone).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(suffix) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else { continue };
        // `<pid>-<n>` (older binaries wrote `<pid>`).
        let pid = suffix.split('-').next().unwrap_or_default();
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn find_assets() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/control-plane.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Io(format!("running {}", script.display()), e))?;
    if !out.status.success() {
        return Err(Error::Assets(format!("{} failed ({})", script.display(), out.status)));
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok(PathBuf::from(dir))
}

fn free_port() -> Result<u16, Error> {
    ports::free_port().map_err(|e| Error::Io("finding a free port".into(), e))
}

fn spawn_logged(command: Command, dir: &Path, name: &str) -> Result<Child, Error> {
    let log_path = dir.join(format!("{name}.log"));
    // A fresh log per start (a restarted controller-manager's old lines would mislead).
    std::fs::File::create(&log_path).map_err(|e| Error::Io(format!("creating {}", log_path.display()), e))?;
    process::spawn_logged(command, &log_path).map_err(|e| Error::Io(format!("starting {name}"), e))
}

fn log_tail(dir: &Path, name: &str) -> String {
    process::tail(&dir.join(format!("{name}.log")), 15)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, expected) in vectors {
            assert_eq!(super::base64(input.as_bytes()), expected, "{input:?}");
        }
        assert_eq!(super::base64(&[0xfb, 0xff]), "+/8=");
    }
}
