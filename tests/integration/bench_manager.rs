//! Benchmark (`make bench-manager`, ignored by `make test`): annotation fan-out, our manager next
//! to upstream's v0.14.0 manager on the same control plane in the same run, one after the other.
//! N bound CSI PVCs of a StorageClass annotated with a reclaim-space schedule (bound by direct
//! writes: PV claimRef, PVC volumeName, both statuses Bound); each manager is started against
//! them and timed until every ReclaimSpaceCronJob exists; its peak RSS (VmHWM), its RSS when idle
//! afterwards and its CPU seconds are read from /proc. Prints figures; asserts only that both
//! managers made every cron job.
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api::csiaddons::ReclaimSpaceCronJob;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use serde_json::json;

use crate::sidecar_harness::free_port;
use crate::support::{unique, workspace_binary};

const DRIVER: &str = "bench.csi-addons-rs.io";
/// Upstream's pvc mode builds the same cron jobs from the class's annotation.
const SCHEDULE_KEY: &str = "reclaimspace.csiaddons.openshift.io/schedule";

/// `BENCH_PVCS`: comma-separated sizes (default 1000,10000).
fn sizes() -> Vec<usize> {
    let text = std::env::var("BENCH_PVCS").unwrap_or_else(|_| "1000,10000".into());
    text.split(',').filter_map(|n| n.trim().parse().ok()).collect()
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of `pid`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, f)| f.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name; 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Figures {
    seconds: f64,
    peak_mib: f64,
    idle_mib: f64,
    anon_mib: f64,
    file_mib: f64,
    cpu: f64,
}

fn our_manager(namespace: &str, dir: &std::path::Path) -> Child {
    let binary = std::env::var_os("CSI_ADDONS_MANAGER")
        .filter(|p| !p.is_empty())
        .map_or_else(|| workspace_binary("csi-addons-manager"), std::path::PathBuf::from);
    let mut command = Command::new(binary);
    command
        .arg(format!("--health-probe-bind-address=127.0.0.1:{}", free_port()))
        .args(["--metrics-bind-address=0", "--enable-auth=false"])
        .arg(format!("--namespace={namespace}"))
        .env("KUBECONFIG", testenv::shared().kubeconfig_path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("ours.log")).unwrap());
    testenv::process::spawn(command).unwrap()
}

fn upstream_binary() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("UPSTREAM_MANAGER").filter(|p| !p.is_empty()) {
        return path.into();
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/upstream-binaries.sh");
    let out = Command::new("bash").arg(script).arg("manager").stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "hack/upstream-binaries.sh failed");
    String::from_utf8(out.stdout).unwrap().trim().into()
}

fn upstream_manager(namespace: &str, dir: &std::path::Path) -> Child {
    let mut command = Command::new(upstream_binary());
    command
        .arg(format!("--health-probe-bind-address=127.0.0.1:{}", free_port()))
        .args(["--metrics-bind-address=0", "--enable-auth=false", "--leader-elect=false"])
        .env("KUBECONFIG", testenv::shared().kubeconfig_path())
        .env("POD_NAMESPACE", namespace)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("upstream.log")).unwrap());
    testenv::process::spawn(command).unwrap()
}

/// N bound pairs in `namespace`, 32 writes in flight.
async fn bound_pairs(client: &kube::Client, namespace: &str, class: &str, n: usize) {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let bound = json!({"status": {"phase": "Bound"}});
    futures::stream::iter(0..n)
        .map(|i| {
            let (pvs, pvcs, bound) = (pvs.clone(), pvcs.clone(), bound.clone());
            async move {
                let (pv_name, pvc_name) = (format!("{namespace}-pv-{i}"), format!("data-{i}"));
                let pv: PersistentVolume = serde_json::from_value(json!({
                    "metadata": {"name": pv_name},
                    "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                             "csi": {"driver": DRIVER, "volumeHandle": pv_name},
                             "claimRef": {"namespace": namespace, "name": pvc_name}},
                }))
                .unwrap();
                pvs.create(&PostParams::default(), &pv).await.unwrap();
                let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": pvc_name},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                             "storageClassName": class, "volumeName": pv_name},
                }))
                .unwrap();
                pvcs.create(&PostParams::default(), &pvc).await.unwrap();
                pvs.patch_status(&pv_name, &PatchParams::default(), &Patch::Merge(&bound)).await.unwrap();
                pvcs.patch_status(&pvc_name, &PatchParams::default(), &Patch::Merge(&bound)).await.unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}

async fn cron_jobs(client: &kube::Client, namespace: &str) -> usize {
    Api::<PartialObjectMeta<ReclaimSpaceCronJob>>::namespaced(client.clone(), namespace)
        .list_metadata(&ListParams::default())
        .await
        .map_or(0, |l| l.items.len())
}

/// Runs one manager until `n` cron jobs exist, then idles it 10 s; removes the cron jobs after.
async fn measure(
    client: &kube::Client,
    namespace: &str,
    n: usize,
    mut manager: Child,
    log: &std::path::Path,
) -> Figures {
    let pid = manager.id();
    let started = Instant::now();
    let mut done = None;
    while started.elapsed() < Duration::from_secs(1800) {
        if let Some(status) = manager.try_wait().unwrap() {
            panic!("the manager exited ({status}); log:\n{}", std::fs::read_to_string(log).unwrap_or_default());
        }
        if cron_jobs(client, namespace).await >= n {
            done = Some(started.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seconds = done.unwrap_or_else(|| {
        panic!("not every cron job was made; log:\n{}", std::fs::read_to_string(log).unwrap_or_default())
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    let figures = Figures {
        seconds,
        peak_mib: mib(status_kib(pid, "VmHWM")),
        idle_mib: mib(status_kib(pid, "VmRSS")),
        anon_mib: mib(status_kib(pid, "RssAnon")),
        file_mib: mib(status_kib(pid, "RssFile")),
        cpu: cpu_seconds(pid),
    };
    testenv::process::stop(&mut manager, Duration::from_secs(10));
    let api = Api::<ReclaimSpaceCronJob>::namespaced(client.clone(), namespace);
    api.delete_collection(&DeleteParams::default(), &ListParams::default()).await.unwrap();
    while cron_jobs(client, namespace).await > 0 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    figures
}

#[tokio::test]
#[ignore = "benchmark: make bench-manager"]
async fn bench_manager_annotation_fan_out() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let class_name = unique("bench-weekly");
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": class_name, "annotations": {SCHEDULE_KEY: "@weekly"}},
        "provisioner": DRIVER,
    }))
    .unwrap();
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
    let upstream = upstream_binary();
    println!("annotation fan-out: every ReclaimSpaceCronJob for N bound PVCs of an annotated StorageClass");
    println!("upstream: {}", upstream.display());
    for n in sizes() {
        let namespace = cp.namespace(&client, &format!("bench-{n}")).await.unwrap();
        let creating = Instant::now();
        bound_pairs(&client, &namespace, &class_name, n).await;
        println!("\nN = {n} (bound pairs written in {:.1} s)", creating.elapsed().as_secs_f64());
        // Ours first: upstream's pvc mode writes annotations onto the PVCs it schedules.
        let ours =
            measure(&client, &namespace, n, our_manager(&namespace, dir.path()), &dir.path().join("ours.log")).await;
        // BENCH_OURS_ONLY=1: a quick look at ours alone.
        if std::env::var("BENCH_OURS_ONLY").is_ok_and(|v| v == "1") {
            println!(
                "  ours only: {:.1} s, peak {:.1} MiB, idle {:.1} MiB (anonymous {:.1}, file-backed {:.1}), CPU {:.1} s",
                ours.seconds, ours.peak_mib, ours.idle_mib, ours.anon_mib, ours.file_mib, ours.cpu
            );
            continue;
        }
        let theirs =
            measure(&client, &namespace, n, upstream_manager(&namespace, dir.path()), &dir.path().join("upstream.log"))
                .await;
        println!("  {:<28} {:>10} {:>10} {:>8}", "", "ours", "upstream", "ours/up");
        for (what, a, b) in [
            ("every cron job (s)", ours.seconds, theirs.seconds),
            ("peak RSS (MiB)", ours.peak_mib, theirs.peak_mib),
            ("RSS idle after (MiB)", ours.idle_mib, theirs.idle_mib),
            ("  of which anonymous", ours.anon_mib, theirs.anon_mib),
            ("  of which file-backed", ours.file_mib, theirs.file_mib),
            ("CPU (s)", ours.cpu, theirs.cpu),
        ] {
            println!("  {what:<28} {a:>10.1} {b:>10.1} {:>7.1}%", 100.0 * a / b.max(f64::MIN_POSITIVE));
        }
    }
    Api::<StorageClass>::all(client.clone()).delete(&class_name, &Default::default()).await.unwrap();
}
