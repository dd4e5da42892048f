//! The manager under ten thousand PVCs at its shipped memory limit: bound claims (written as the
//! PV binder leaves them, with no volume behind them) of a StorageClass that is then annotated with
//! a reclaim-space schedule, so every claim fans out into a ReclaimSpaceCronJob. The leading
//! manager's working set, as the kubelet reports it, is read throughout: idle, once the claims are
//! cached, and once every cron job exists; the bytes per claim and per cron job follow, the figures
//! a user sizes the limit of a larger cluster by. The working set must stay below the Pod's limit,
//! which the container's cgroup must hold, and the kernel must kill nothing (the cgroup counts OOM
//! kills); the same manager Pod must still lead, its container not restarted meanwhile.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use testenv::bound_claims;
use testenv::poll;

use crate::cluster::{self, MANAGER_NAMESPACE};
use crate::driver_pods::csiaddons;

const NAMESPACE: &str = "fan-out";
const CLASS: &str = "reference-csi-fan-out";
const DRIVER: &str = "reference.csi-addons-rs.io";
const SCHEDULE_KEY: &str = "reclaimspace.csiaddons.openshift.io/schedule";
/// A schedule that does not come round while a test runs: midnight on the 29th of February.
const SCHEDULE: &str = "0 0 29 2 *";
/// How long a stage's working set is read after it (the kubelet refreshes it every 10 s or so).
const SETTLE: Duration = Duration::from_secs(20);
const MIB: f64 = 1024.0 * 1024.0;

/// Claims to fan out (`FANOUT_PVCS`).
fn claims() -> usize {
    std::env::var("FANOUT_PVCS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

/// The manager container's working set as the kubelet reports it, read every 2 s in the
/// background: (when, bytes).
struct WorkingSet {
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl WorkingSet {
    fn read(client: &Client, node: &str, pod: &str) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (client, node, pod, into) = (client.clone(), node.to_owned(), pod.to_owned(), samples.clone());
        let reader = tokio::spawn(async move {
            loop {
                if let Some(bytes) = kubelet_working_set(&client, &node, &pod).await {
                    into.lock().unwrap().push((Instant::now(), bytes));
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
        WorkingSet { samples, reader }
    }

    /// The largest working set read since `since`.
    fn peak_since(&self, since: Instant) -> u64 {
        let samples = self.samples.lock().unwrap();
        samples.iter().filter(|(at, _)| *at >= since).map(|(_, bytes)| *bytes).max().unwrap_or(0)
    }

    /// Reads on for [`SETTLE`]; the largest reading in that time.
    async fn settled(&self) -> u64 {
        let since = Instant::now();
        tokio::time::sleep(SETTLE).await;
        self.peak_since(since)
    }
}

impl Drop for WorkingSet {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// `workingSetBytes` of the `manager` container of `pod`, from the kubelet's summary API (memory
/// and CPU only: the node's root filesystem has no statistics here).
async fn kubelet_working_set(client: &Client, node: &str, pod: &str) -> Option<u64> {
    let path = format!("/api/v1/nodes/{node}/proxy/stats/summary?only_cpu_and_memory=true");
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let summary: serde_json::Value = client.request(request).await.ok()?;
    let pods = summary.get("pods")?.as_array()?;
    let ours = pods.iter().find(|p| p.pointer("/podRef/name").and_then(|n| n.as_str()) == Some(pod))?;
    let containers = ours.get("containers")?.as_array()?;
    let manager = containers.iter().find(|c| c.get("name").and_then(|n| n.as_str()) == Some("manager"))?;
    manager.pointer("/memory/workingSetBytes")?.as_u64()
}

/// The memory cgroup (v1) of the container `container_id` names (`containerd://<id>`).
fn memory_cgroup(container_id: &str) -> PathBuf {
    let id = container_id.rsplit('/').next().unwrap_or_default();
    let root = Path::new("/sys/fs/cgroup/memory");
    let find = |dir: &Path| dir.join(id).is_dir().then(|| dir.join(id));
    let children = std::fs::read_dir(root).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir());
    find(root)
        .or_else(|| children.into_iter().find_map(|dir| find(&dir)))
        .unwrap_or_else(|| panic!("the memory cgroup of container {id} under {}", root.display()))
}

fn cgroup_value(cgroup: &Path, file: &str) -> u64 {
    let text = std::fs::read_to_string(cgroup.join(file)).unwrap_or_else(|e| panic!("{}: {e}", cgroup.display()));
    text.trim().parse().unwrap_or_else(|e| panic!("{}/{file}: {text:?}: {e}", cgroup.display()))
}

/// The `oom_kill` count of `memory.oom_control`: processes the kernel killed at the limit.
fn oom_kills(cgroup: &Path) -> u64 {
    let text = std::fs::read_to_string(cgroup.join("memory.oom_control")).unwrap_or_default();
    let count = text.lines().find_map(|l| l.strip_prefix("oom_kill "));
    count.and_then(|c| c.trim().parse().ok()).expect("memory.oom_control counts OOM kills (Linux 4.13 and later)")
}

/// Bytes of a memory quantity as Kubernetes writes them (`256Mi`, `1Gi`, `500M`, plain bytes).
fn quantity_bytes(quantity: &str) -> Option<u64> {
    let units =
        [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("k", 1_000), ("M", 1_000_000), ("G", 1_000_000_000)];
    let (number, unit) = units
        .iter()
        .find_map(|(suffix, unit)| quantity.strip_suffix(suffix).map(|n| (n, *unit)))
        .unwrap_or((quantity, 1));
    number.parse::<u64>().ok()?.checked_mul(unit)
}

/// The `manager` container's memory limit in `pod`'s spec, and its id.
fn manager_container(pod: &Pod) -> (u64, String) {
    let spec = pod.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == "manager"));
    let limits = spec.and_then(|c| c.resources.as_ref()?.limits.as_ref());
    let limit = limits.and_then(|l| quantity_bytes(&l.get("memory")?.0));
    let limit = limit.expect("the shipped manager container has a memory limit");
    let status = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    let manager = status.and_then(|s| s.iter().find(|c| c.name == "manager"));
    let id = manager.and_then(|c| c.container_id.clone()).expect("the manager container runs");
    (limit, id)
}

async fn cron_jobs(client: &Client) -> usize {
    let api = csiaddons(client, "ReclaimSpaceCronJob", NAMESPACE);
    api.list_metadata(&ListParams::default()).await.map_or(0, |l| l.items.len())
}

/// Fans `claims()` bound claims out into cron jobs under the leading manager, asserts that it holds
/// within its limit, prints what it took, and removes it all again.
pub async fn fan_out_at_the_memory_limit(client: &Client) {
    let n = claims();
    let pods: Api<Pod> = Api::namespaced(client.clone(), MANAGER_NAMESPACE);
    let leader = cluster::ready_leading_manager(client, MANAGER_NAMESPACE).await;
    let pod = pods.get(&leader).await.unwrap();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).expect("the manager Pod is scheduled");
    let (limit, container) = manager_container(&pod);
    let cgroup = memory_cgroup(&container);
    assert_eq!(
        cgroup_value(&cgroup, "memory.limit_in_bytes"),
        limit,
        "the kernel holds the manager to its Pod's limit"
    );
    let oom_before = oom_kills(&cgroup);
    // Earlier rows may have restarted it (the node's reboot restarts every container).
    let restarts_before = cluster::container_restarts(std::slice::from_ref(&pod));
    let working_set = WorkingSet::read(client, &node, &leader);
    let idle = working_set.settled().await;

    let apply = PatchParams::apply("faults-test").force();
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": CLASS},
        "provisioner": DRIVER, "reclaimPolicy": "Retain", "volumeBindingMode": "Immediate"
    }))
    .unwrap();
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes.patch(CLASS, &apply, &Patch::Apply(&class)).await.unwrap();
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    Api::<Namespace>::all(client.clone()).patch(NAMESPACE, &apply, &Patch::Apply(&namespace)).await.unwrap();
    let writing = Instant::now();
    let handles: Vec<String> = (0..n).map(|i| format!("fan-out-volume-{i}")).collect();
    bound_claims::bound_pairs(client, NAMESPACE, CLASS, DRIVER, &handles).await;
    let written = writing.elapsed().as_secs_f64();
    let with_claims = working_set.settled().await;

    let fanning = Instant::now();
    let annotated = json!({"metadata": {"annotations": {SCHEDULE_KEY: SCHEDULE}}});
    classes.patch(CLASS, &PatchParams::default(), &Patch::Merge(&annotated)).await.unwrap();
    let all = poll::until(15 * poll::MINUTE, async || (cron_jobs(client).await >= n).then_some(())).await;
    assert!(all.is_some(), "the manager makes a ReclaimSpaceCronJob for each of {n} claims");
    let fanned = fanning.elapsed().as_secs_f64();
    let with_cron_jobs = working_set.settled().await;
    let peak = working_set.peak_since(writing);
    drop(working_set);

    let pod = pods.get(&leader).await.unwrap();
    let restarts = cluster::container_restarts(std::slice::from_ref(&pod)) - restarts_before;
    assert_eq!(restarts, 0, "the leading manager's container restarted during the fan-out");
    assert_eq!(oom_kills(&cgroup) - oom_before, 0, "the kernel killed nothing in the manager's cgroup");
    let still = cluster::leading_manager(client, MANAGER_NAMESPACE).await.map(|p| cluster::name(&p));
    assert_eq!(still.as_deref(), Some(leader.as_str()), "the same manager Pod leads throughout");
    assert!(peak > 0 && peak < limit, "the working set ({peak} bytes at most) stays below the limit ({limit})");
    let per_object = |from: u64, to: u64| to.saturating_sub(from) as f64 / n as f64;
    println!(
        "fan-out: {n} bound claims written in {written:.1} s; every cron job {fanned:.1} s after the class's annotation"
    );
    println!(
        "fan-out: manager working set (kubelet): idle {:.1} MiB, with the claims {:.1} MiB, with the cron jobs {:.1} MiB, \
         peak {:.1} MiB of its {:.0} MiB limit ({:.0} %); cgroup's highest usage {:.1} MiB; OOM kills 0",
        idle as f64 / MIB,
        with_claims as f64 / MIB,
        with_cron_jobs as f64 / MIB,
        peak as f64 / MIB,
        limit as f64 / MIB,
        100.0 * peak as f64 / limit as f64,
        cgroup_value(&cgroup, "memory.max_usage_in_bytes") as f64 / MIB,
    );
    println!(
        "fan-out: about {:.0} bytes per claim (with its PV), {:.0} per cron job",
        per_object(idle, with_claims),
        per_object(with_claims, with_cron_jobs)
    );

    // The namespace goes first: a terminating namespace takes no new objects, and its cron jobs
    // go in one request (the garbage collector would delete them one by one after their claims).
    let removing = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(NAMESPACE, &DeleteParams::default()).await.unwrap();
    bound_claims::remove_bound_pairs(client, NAMESPACE).await;
    let gone =
        poll::until(5 * poll::MINUTE, async || namespaces.get_opt(NAMESPACE).await.ok()?.is_none().then_some(()));
    assert!(gone.await.is_some(), "the fan-out's namespace, its cron jobs with it, is removed");
    classes.delete(CLASS, &DeleteParams::default()).await.unwrap();
    println!("fan-out: claims, volumes and cron jobs removed in {:.1} s", removing.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::quantity_bytes;

    #[test]
    fn memory_quantities_read_as_kubernetes_writes_them() {
        assert_eq!(quantity_bytes("256Mi"), Some(256 << 20));
        assert_eq!(quantity_bytes("1Gi"), Some(1 << 30));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("1024"), Some(1024));
        assert_eq!(quantity_bytes("lots"), None);
    }
}
