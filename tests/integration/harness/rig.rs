//! What the benchmarks (`make bench`) and the fault suite (`make test-faults`) share: raw-block
//! volumes of the reference driver (bound to PVCs by `testenv::bound_claims`), a manager and a
//! sidecar of either build (ours, or upstream's v0.14.0 as a test peer), batches of
//! ReclaimSpaceJobs and how they ended, figures from /proc, and each user's requests from the API
//! server's audit log.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use api::proto::csi::v1 as csi;
use demo::peers::ServiceAccountFiles;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::poll::MINUTE;

use crate::harness::driver::Harness;
use crate::harness::sidecar::{Serving, SidecarPod, SidecarProcess, Workload, free_port, sidecar_pod};
use crate::harness::support::workspace_binary;

/// Which build runs a half.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Build {
    Ours,
    Upstream,
}

impl Build {
    pub fn key(self) -> &'static str {
        match self {
            Build::Ours => "ours",
            Build::Upstream => "upstream",
        }
    }
}

/// A binary of upstream's v0.14.0 (`manager`, `sidecar`), or its `rbac` YAML: from
/// `UPSTREAM_<WHAT>` when set, else built or fetched once by hack/upstream-binaries.sh.
pub fn upstream(what: &str) -> PathBuf {
    crate::harness::support::test_peer_with(
        &format!("UPSTREAM_{}", what.to_uppercase()),
        "upstream-binaries.sh",
        &[what],
    )
}

fn block_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Block(Default::default())),
    }
}

/// `n` raw-block volumes of 1 MiB (sparse files: reclaiming one is a hole punch), by CreateVolume.
pub async fn block_volumes(driver: &Harness, prefix: &str, n: usize) -> Vec<String> {
    futures::stream::iter(0..n)
        .map(|i| {
            let channel = driver.csi.clone();
            async move {
                let request = csi::CreateVolumeRequest {
                    name: format!("{prefix}-{i}"),
                    capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 20, limit_bytes: 0 }),
                    volume_capabilities: vec![block_capability()],
                    ..Default::default()
                };
                let mut controller = csi::controller_client::ControllerClient::new(channel);
                controller.create_volume(request).await.unwrap().into_inner().volume.unwrap().volume_id
            }
        })
        .buffered(4)
        .collect()
        .await
}

/// A manager process of either build, logging to its own file.
pub struct ManagerProcess {
    child: Child,
    pub log: PathBuf,
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        testenv::process::stop(&mut self.child, Duration::from_secs(10));
    }
}

impl ManagerProcess {
    /// Runs cluster-wide with its settings in `namespace`, as `kubeconfig`'s user, metrics off, no
    /// sidecar authentication; `extra` flags are appended (both builds take the same names).
    pub fn start(build: Build, namespace: &str, kubeconfig: &Path, log: &Path, extra: &[String]) -> Self {
        // Upstream's manager keeps its settings in csi-addons-system (its role may not read another
        // namespace's ConfigMaps) and takes the namespace of its Lease from POD_NAMESPACE.
        let (mut command, settings) = match build {
            Build::Ours => {
                let binary = std::env::var_os("CSI_ADDONS_MANAGER")
                    .filter(|p| !p.is_empty())
                    .map_or_else(|| workspace_binary("csi-addons-manager"), PathBuf::from);
                (testenv::manager::ours(&binary), Some(namespace))
            }
            Build::Upstream => {
                let mut command = Command::new(upstream("manager"));
                command.env("POD_NAMESPACE", namespace).env_remove("KUBERNETES_SERVICE_HOST");
                (command, None)
            }
        };
        let ports = testenv::manager::Ports { health: free_port(), metrics: None };
        testenv::manager::configure(&mut command, settings, kubeconfig, ports);
        command.arg("--enable-auth=false").args(extra);
        if !extra.iter().any(|a| a.starts_with("--leader-elect")) {
            command.arg("--leader-elect=false");
        }
        let child = testenv::process::spawn_logged(command, log).unwrap();
        ManagerProcess { child, log: log.to_owned() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the log if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the manager exited ({status}); log:\n{}", testenv::process::tail(&self.log, 60));
        }
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sidecar of either build for a DaemonSet Pod on `node`, against `driver_endpoint`, serving
/// plain gRPC on 127.0.0.1:`port()`. Ours holds its driver's Lease before `start` returns.
/// Upstream's runs as a ServiceAccount bound to cluster-admin (a test peer, whose RBAC is not ours
/// to prove) and registers a `pod://` endpoint (the only form its manager dials), so its Pod gets
/// 127.0.0.1 as the IP a kubelet would give it.
pub enum SidecarRun {
    Ours(SidecarProcess),
    Upstream { child: Child, port: u16, log: PathBuf, _dir: tempfile::TempDir },
}

impl Drop for SidecarRun {
    fn drop(&mut self) {
        if let SidecarRun::Upstream { child, .. } = self {
            testenv::process::stop(child, Duration::from_secs(5));
        }
    }
}

impl SidecarRun {
    pub async fn start(
        build: Build,
        client: &kube::Client,
        namespace: &str,
        node: &str,
        driver_endpoint: &str,
    ) -> Self {
        let pod = sidecar_pod(client, namespace, node, Workload::DaemonSet, "csi-plugin").await;
        let mut run = match build {
            Build::Ours => {
                let sidecar = SidecarProcess::start(&pod, node, driver_endpoint, Serving::Plain, &[]);
                sidecar.wait_ready().await;
                sidecar.wait_leader(true).await;
                SidecarRun::Ours(sidecar)
            }
            Build::Upstream => Self::upstream(client, &pod, node, driver_endpoint).await,
        };
        let nodes = crate::harness::support::dynamic(client, namespace, "CSIAddonsNode");
        let registered = testenv::poll::until(MINUTE, async || {
            if !nodes.list(&ListParams::default()).await.unwrap().items.is_empty() {
                return Some(());
            }
            if let SidecarRun::Upstream { child, log, .. } = &mut run {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "upstream's sidecar exited:\n{}",
                    testenv::process::tail(log, 30)
                );
            }
            None
        })
        .await;
        match registered {
            Some(()) => run,
            None => panic!("the {} sidecar did not register a CSIAddonsNode", build.key()),
        }
    }

    async fn upstream(client: &kube::Client, pod: &SidecarPod, node: &str, driver_endpoint: &str) -> Self {
        let cp = testenv::shared();
        let status = json!({"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}});
        Api::<Pod>::namespaced(client.clone(), &pod.namespace)
            .patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        let token = cp.token(client, &pod.namespace, "csi-addons-sidecar").await.unwrap();
        let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": crate::harness::support::unique("upstream-sidecar")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "csi-addons-sidecar", "namespace": pod.namespace}]
        }))
        .unwrap();
        Api::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let account =
            ServiceAccountFiles::write(dir.path().join("account"), &token, cp.ca_cert_path(), &pod.namespace).unwrap();
        let api_port = cp.server_url().trim_end_matches('/').rsplit(':').next().unwrap().to_owned();
        let (port, log) = (free_port(), dir.path().join("upstream-sidecar.log"));
        let mut command = account.in_cluster_command(&upstream("sidecar"), &api_port);
        command
            .arg(format!("-csi-addons-address={driver_endpoint}"))
            .arg(format!("-node-id={node}"))
            .arg(format!("-controller-port={port}"))
            .arg(format!("-pod={}", pod.name))
            .arg(format!("-namespace={}", pod.namespace))
            .arg(format!("-pod-uid={}", pod.uid))
            .arg("-enable-auth=false");
        let child = testenv::process::spawn_logged(command, &log).unwrap();
        SidecarRun::Upstream { child, port, log, _dir: dir }
    }

    pub fn pid(&self) -> u32 {
        match self {
            SidecarRun::Ours(sidecar) => sidecar.pid(),
            SidecarRun::Upstream { child, .. } => child.id(),
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            SidecarRun::Ours(sidecar) => sidecar.port,
            SidecarRun::Upstream { port, .. } => *port,
        }
    }

    pub fn log(&self) -> String {
        match self {
            SidecarRun::Ours(sidecar) => sidecar.log(),
            SidecarRun::Upstream { log, .. } => std::fs::read_to_string(log).unwrap_or_default(),
        }
    }
}

/// How a batch of jobs stands.
#[derive(Debug, Default)]
pub struct Outcome {
    pub succeeded: usize,
    /// Name and message of each Failed job.
    pub failed: Vec<(String, String)>,
    /// Jobs with no result yet.
    pub unfinished: Vec<String>,
}

impl Outcome {
    /// How many jobs the list held.
    pub fn seen(&self) -> usize {
        self.succeeded + self.failed.len() + self.unfinished.len()
    }
}

/// Every ReclaimSpaceJob of `namespace` by result. A list the API server refuses is retried
/// (for up to a minute): just after a restart the server can answer 429 while its
/// cache of the kind fills, and an empty outcome would read as "every job finished".
pub async fn outcome(client: &kube::Client, namespace: &str) -> Outcome {
    let jobs = crate::harness::support::dynamic(client, namespace, "ReclaimSpaceJob");
    // From the API server's watch cache: polling must not load etcd while the managers work.
    let listed = testenv::poll::until(MINUTE, async || match jobs.list(&ListParams::default().match_any()).await {
        Ok(list) => Some(list.items),
        Err(error) => {
            eprintln!("listing ReclaimSpaceJobs again: {error}");
            None
        }
    })
    .await
    .unwrap_or_else(|| panic!("listing ReclaimSpaceJobs failed for a minute"));
    let mut outcome = Outcome::default();
    for job in listed {
        let name = job.metadata.name.clone().unwrap_or_default();
        match job.data.pointer("/status/result").and_then(|r| r.as_str()) {
            Some("Succeeded") => outcome.succeeded += 1,
            Some("Failed") => {
                let message = job.data.pointer("/status/message").and_then(|m| m.as_str()).unwrap_or_default();
                outcome.failed.push((name, message.to_owned()));
            }
            _ => outcome.unfinished.push(name),
        }
    }
    outcome
}

/// ReclaimSpaceJob `<prefix>-<i>` for PVC `data-<i>`, for each i in `range`, 32 creates in flight.
pub async fn create_jobs(client: &kube::Client, namespace: &str, prefix: &str, range: std::ops::Range<usize>) {
    futures::stream::iter(range)
        .map(|i| async move {
            let spec = json!({"target": {"persistentVolumeClaim": format!("data-{i}")}});
            crate::harness::support::create_job(client, namespace, "ReclaimSpaceJob", &format!("{prefix}-{i}"), spec)
                .await;
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}

/// Polls every 500 ms until all `jobs` jobs of `namespace` are listed and none is unfinished, or
/// `limit` has passed; returns the last outcome. The count matters: a cache that has not caught up
/// with the creates would otherwise look finished. `tick` runs on every poll (to check that
/// processes still run).
pub async fn wait_finished(
    client: &kube::Client,
    namespace: &str,
    jobs: usize,
    limit: Duration,
    mut tick: impl FnMut(),
) -> Outcome {
    let started = Instant::now();
    loop {
        tick();
        let now = outcome(client, namespace).await;
        if (now.unfinished.is_empty() && now.seen() >= jobs) || started.elapsed() > limit {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes every `kind` (a CSI-Addons kind) in `namespace`, finalizers first: no manager runs to
/// release them. A benchmark part leaves nothing behind that the next part's managers would
/// reconcile (1,000 CSIAddonsNodes of a stopped sidecar would keep both managers retrying).
pub async fn remove_all(client: &kube::Client, namespace: &str, kind: &str) {
    let api = crate::harness::support::dynamic(client, namespace, kind);
    let unfinalized = json!({"metadata": {"finalizers": null}});
    for object in api.list(&ListParams::default()).await.unwrap().items {
        let name = object.metadata.name.unwrap_or_default();
        if object.metadata.finalizers.is_some_and(|f| !f.is_empty()) {
            let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&unfinalized)).await;
        }
    }
    api.delete_collection(&DeleteParams::default(), &ListParams::default()).await.unwrap();
}

/// The sizes a benchmark part runs at: `env`, comma-separated (`1000,10000`), else `default`.
pub fn sizes(env: &str, default: &str) -> Vec<usize> {
    let text = std::env::var(env).unwrap_or_else(|_| default.into());
    text.split(',').filter_map(|n| n.trim().parse().ok()).collect()
}

/// `BENCH_ONLY=ours`: measure only our build and print its figures (for quick iterations; the
/// comparison needs both).
pub fn ours_only() -> bool {
    std::env::var("BENCH_ONLY").is_ok_and(|v| v == "ours")
}

/// A `/proc/<pid>/status` figure in KiB (0 when the process is gone).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// User + system CPU seconds of `pid`.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, f)| f.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name; 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
}

/// RSS of a process over time, sampled every 250 ms on a thread of its own.
pub struct RssSampler {
    samples: std::sync::Arc<std::sync::Mutex<Vec<(f64, f64)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    pub fn start(pid: u32) -> Self {
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (into, stopping) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                let rss = mib(status_kib(pid, "VmRSS"));
                into.lock().unwrap().push((started.elapsed().as_secs_f64(), rss));
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        RssSampler { samples, stop, thread: Some(thread) }
    }

    /// The samples so far: (seconds since start, MiB).
    pub fn finish(mut self) -> Vec<(f64, f64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap())
    }
}

/// Where the audit log stands now (its length), to count what comes after.
pub fn audit_mark() -> u64 {
    testenv::shared().audit_log().and_then(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.len())
}

/// Requests of one user, from the audit log.
#[derive(Debug, Default)]
pub struct Requests {
    pub total: usize,
    /// By verb and resource (`patch csiaddonsnodes/status`).
    pub by_call: BTreeMap<String, usize>,
    /// Answered 429 Too Many Requests (priority and fairness turned them away).
    pub throttled: usize,
}

impl Requests {
    /// All but the Events written (the core and the events.k8s.io API's).
    pub fn not_events(&self) -> usize {
        let events: usize = self.by_call.iter().filter(|(call, _)| call.ends_with(" events")).map(|(_, n)| n).sum();
        self.total - events
    }
}

/// `user`'s requests logged after `mark`; None when the API server keeps no audit log
/// (TESTENV_AUDIT=1 asks for one).
pub fn requests_since(mark: u64, user: &str) -> Option<Requests> {
    use std::io::{BufRead, Seek};
    let path = testenv::shared().audit_log()?;
    let mut file = std::fs::File::open(path).ok()?;
    file.seek(std::io::SeekFrom::Start(mark)).ok()?;
    let mut requests = Requests::default();
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if event.pointer("/user/username").and_then(|u| u.as_str()) != Some(user) {
            continue;
        }
        requests.total += 1;
        let verb = event.get("verb").and_then(|v| v.as_str()).unwrap_or("?");
        let resource = event.pointer("/objectRef/resource").and_then(|r| r.as_str()).unwrap_or("-");
        let call = match event.pointer("/objectRef/subresource").and_then(|r| r.as_str()) {
            Some(sub) => format!("{verb} {resource}/{sub}"),
            None => format!("{verb} {resource}"),
        };
        *requests.by_call.entry(call).or_default() += 1;
        if event.pointer("/responseStatus/code").and_then(|c| c.as_i64()) == Some(429) {
            requests.throttled += 1;
        }
    }
    Some(requests)
}

/// The reference driver's `method` calls (one log line each), by volume id, from `log`.
pub fn driver_calls(log: &Path, method: &str) -> BTreeMap<String, usize> {
    testenv::process::calls_per_volume(&std::fs::read_to_string(log).unwrap_or_default(), method)
}

/// Lines of `log` that contain `needle`.
pub fn count_lines(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn driver_call_lines_are_counted_per_volume_with_or_without_colours() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("driver.log");
    std::fs::write(
        &log,
        "2026 INFO reference_driver::addons::reclaim: ControllerReclaimSpace volume=a\n\
         2026 \u{1b}[32m INFO\u{1b}[0m x: ControllerReclaimSpace \u{1b}[3mvolume\u{1b}[0m\u{1b}[2m=\u{1b}[0ma\n\
         2026 INFO x: NodeReclaimSpace volume=b\n",
    )
    .unwrap();
    let calls = driver_calls(&log, "ControllerReclaimSpace");
    assert_eq!(calls, BTreeMap::from([("a".to_owned(), 2)]));
}
