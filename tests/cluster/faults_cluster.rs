//! Faults a cluster really has (`make test-faults-cluster`, on a fresh one-node cluster with the
//! release YAMLs and the hand-installed driver): each strikes while a batch of ReclaimSpaceJobs,
//! one per volume, runs through the shipped manager, sidecars and reference driver, and while a
//! VolumeReplication changes state. Afterwards every job must have ended Succeeded, or Failed with
//! a message (none stuck), none may claim success without a call reaching the driver (none lost),
//! the replication must reach its new state, and both sidecars must be Connected again. The same
//! table as `make test-faults`; the seconds to recover are figures, not assertions.
//!
//! - the kubelet restarted (SIGTERM, then started again as a service manager would): the Pods keep
//!   running, the kubelet takes them over again;
//! - containerd restarted: the containers keep running under their shims;
//! - the controller plugin's driver hung (SIGSTOP) for longer than a call may take: the calls to it
//!   end at the jobs' `spec.timeout`, a job past its `retryDeadlineSeconds` ends Failed with the
//!   timeout's message, and once the driver answers again the rest, and the replication, go on
//!   through the same sidecar;
//! - the leading manager evicted through the Eviction API, as a drain does: the PodDisruptionBudget
//!   allows it (and refuses the standby's eviction meanwhile), another manager takes the Lease
//!   over and carries the batch on;
//! - the node plugin's Pod evicted: its DaemonSet brings it back and its sidecar registers again;
//! - the API server shedding the manager's load for a minute (Priority and Fairness answering 429):
//!   the manager retries after the server's Retry-After and counts the 429s;
//! - the driver's state directory full (its disk filled before the replication changes state): the
//!   calls that must write fail with RESOURCE_EXHAUSTED, which the replication's status shows with
//!   what to do (reclaiming needs no space); once space is freed it goes on, and the state is whole;
//! - the node rebooted (every process of it killed at once, its mounts and loop devices gone, then
//!   booted): the kubelet brings every Pod back, a workload's volume mounted again with its data;
//! - the network between the manager and the controller plugin's sidecar cut for a minute (its
//!   packets dropped): the calls in flight wait and the rest of the batch queues, while a second
//!   driver's jobs, made during the cut, all end Succeeded before it heals;
//! - ten thousand bound PVCs fanning out into a ReclaimSpaceCronJob each: the leading manager holds
//!   them within its shipped memory limit, nothing killed or restarted (see `fan_out`).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use serde_json::json;
use testenv::fault_table::{self, FaultRow};
use testenv::poll;
use testenv::process::signal;

use crate::cluster::{
    self, CONTROLLER_PLUGIN_SELECTOR, DRIVER_NAMESPACE, MANAGER_NAMESPACE, MANAGER_SELECTOR, NODE_PLUGIN_SELECTOR,
};
use crate::driver_pods::{connected_nodes, csiaddons};
use crate::partition::{self, SecondDriver};
use crate::story::replication_api;
use crate::{api_fairness, evictions, fan_out, full_disk, reboot};

const NAMESPACE: &str = "faults";
/// The driver's volumes bound at once (the shipped StorageClass waits for a Pod).
const CLASS: &str = "reference-csi-faults";

/// What the batch's VolumeReplication does across the fault.
const REPLICATED: &str = "Primary → Secondary";

/// Whether `fault` is one of the rows `FAULTS` names (batch names, comma-separated; all when unset).
fn selected(fault: Fault) -> bool {
    std::env::var("FAULTS").map_or(true, |names| names.split(',').any(|n| n.trim() == fault.batch()))
}

/// Jobs per batch (`FAULT_JOBS`).
fn batch() -> usize {
    std::env::var("FAULT_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(200)
}

/// How long the hung driver stays stopped: longer than one call may take (the jobs' `spec.timeout`).
const HANG: Duration = Duration::from_secs(75);
/// How long the API server sheds the manager's load.
const SHED: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Fault {
    RestartKubelet,
    RestartContainerd,
    HangDriver,
    EvictManager,
    EvictNodePlugin,
    ShedLoad,
    FillStateDir,
    RebootNode,
    PartitionSidecar,
    FanOut,
}

/// The batch a fault strikes: its VolumeReplication, and what the fault made ready before it.
struct Batch<'a> {
    replications: &'a Api<DynamicObject>,
    name: &'a str,
    /// What filled the disk, when the fault struck first.
    ballast: Option<full_disk::Ballast>,
    second: Option<&'a SecondDriver>,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::RestartKubelet => "kubelet restart",
            Fault::RestartContainerd => "containerd restart",
            Fault::HangDriver => "driver hung 75 s (SIGSTOP)",
            Fault::EvictManager => "leading manager evicted",
            Fault::EvictNodePlugin => "node plugin evicted",
            Fault::ShedLoad => "API server sheds load 60 s (429)",
            Fault::FillStateDir => "driver's disk full 45 s",
            Fault::RebootNode => "node reboot",
            Fault::PartitionSidecar => "sidecar cut off 60 s (dropped)",
            Fault::FanOut => "PVC fan-out at the memory limit",
        }
    }

    /// The batch's label, and the name of its VolumeReplication.
    fn batch(self) -> &'static str {
        match self {
            Fault::RestartKubelet => "kubelet",
            Fault::RestartContainerd => "containerd",
            Fault::HangDriver => "hung",
            Fault::EvictManager => "evict-manager",
            Fault::EvictNodePlugin => "evict-node",
            Fault::ShedLoad => "shed",
            Fault::FillStateDir => "full",
            Fault::RebootNode => "reboot",
            Fault::PartitionSidecar => "partition",
            Fault::FanOut => "fan-out",
        }
    }

    /// The batch's jobs' settings beyond their target. For the hung driver: each call may take the
    /// shortest timeout the CRD allows, and a job whose first call times out is past its deadline.
    fn job_settings(self) -> serde_json::Value {
        match self {
            Fault::HangDriver => json!({"timeout": 60, "retryDeadlineSeconds": 30}),
            _ => json!({}),
        }
    }

    /// Whether the fault strikes before the replication is asked to change (the driver must fail to
    /// save the change, not have saved it already).
    fn strikes_first(self) -> bool {
        matches!(self, Fault::FillStateDir)
    }

    /// Strikes and lasts.
    async fn strike(self, client: &Client, batch: Batch<'_>) {
        match self {
            Fault::RestartKubelet => blocking(|| restart("kubelet")).await,
            Fault::RestartContainerd => blocking(|| restart("containerd")).await,
            Fault::HangDriver => {
                let pid = partition::first_controller_driver().await;
                blocking(move || {
                    let hung = Stopped::new(pid);
                    std::thread::sleep(HANG);
                    drop(hung);
                })
                .await
            }
            Fault::EvictManager => evictions::evict_leading_manager(client).await,
            Fault::EvictNodePlugin => evictions::evict_node_plugin(client).await,
            Fault::ShedLoad => api_fairness::shed_manager_load(client, NAMESPACE, SHED).await,
            Fault::FillStateDir => full_disk::hold(batch.ballast, batch.replications, batch.name).await,
            Fault::RebootNode => reboot::reboot_node(client, NAMESPACE, CLASS).await,
            Fault::PartitionSidecar => {
                let second = batch.second.expect("the second driver is installed before the cut");
                let jobs = csiaddons(client, "ReclaimSpaceJob", NAMESPACE);
                let unfinished = async || results(&jobs, batch.name).await.2.len();
                partition::cut_while_the_second_driver_works(client, second, unfinished).await
            }
            Fault::FanOut => fan_out::fan_out_at_the_memory_limit(client).await,
        }
    }
}

/// `hack/cluster.sh restart NAME`.
fn restart(process: &str) {
    cluster::hack_script("cluster.sh", &["restart", process]);
}

/// Runs a strike that blocks (a restart, a sleep) on a thread of its own, and waits for it.
async fn blocking(strike: impl FnOnce() + Send + 'static) {
    tokio::task::spawn_blocking(strike).await.unwrap()
}

/// The controller plugin's driver process, stopped until this is dropped (a failing test too
/// leaves it running again).
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Self {
        signal("-STOP", pid);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

/// An Immediate StorageClass of the driver, the namespace, and `count` bound claims `data-<i>`;
/// their volume handles.
async fn volumes(client: &Client, count: usize) -> Vec<String> {
    let class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": CLASS},
        "provisioner": "reference.csi-addons-rs.io", "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"
    }))
    .unwrap();
    let apply = PatchParams::apply("faults-test").force();
    Api::<StorageClass>::all(client.clone()).patch(CLASS, &apply, &Patch::Apply(&class)).await.unwrap();
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    Api::<Namespace>::all(client.clone()).patch(NAMESPACE, &apply, &Patch::Apply(&namespace)).await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(0..count)
        .map(|i| {
            let claims = claims.clone();
            async move {
                let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": format!("data-{i}")},
                    "spec": {"storageClassName": CLASS, "accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "16Mi"}}}
                }))
                .unwrap();
                claims.create(&PostParams::default(), &claim).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let bound = poll::until(10 * poll::MINUTE, async || {
        let list = claims.list(&ListParams::default()).await.ok()?.items;
        let bound: BTreeMap<String, String> = list
            .into_iter()
            .filter_map(|c| Some((c.metadata.name?, c.spec?.volume_name.filter(|v| !v.is_empty())?)))
            .collect();
        (bound.len() == count).then_some(bound)
    })
    .await
    .unwrap_or_else(|| panic!("the driver provisions {count} volumes"));
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let mut handles = Vec::with_capacity(count);
    for i in 0..count {
        let pv = pvs.get(&bound[&format!("data-{i}")]).await.unwrap();
        handles.push(pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle).unwrap_or_default());
    }
    handles
}

/// The namespace goes, and with it the claims; the driver deletes their volumes (their PVs go), and
/// the StorageClass goes last.
async fn remove_volumes(client: &Client) {
    let _ = Api::<Namespace>::all(client.clone()).delete(NAMESPACE, &DeleteParams::default()).await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let gone = poll::until(10 * poll::MINUTE, async || {
        let list = pvs.list(&ListParams::default()).await.ok()?.items;
        let left =
            list.iter().filter(|pv| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(CLASS));
        (left.count() == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the driver deletes the batch's volumes once their claims are gone");
    Api::<StorageClass>::all(client.clone()).delete(CLASS, &DeleteParams::default()).await.unwrap();
}

/// How often the driver has been asked to reclaim each volume, from the controller plugin's log and,
/// once its container was started again (the node rebooted), its previous container's log: the
/// counts before and after a batch then both hold the calls of the container that ran before.
async fn driver_calls(client: &Client) -> BTreeMap<String, usize> {
    let pods = cluster::running_pods(client, DRIVER_NAMESPACE, CONTROLLER_PLUGIN_SELECTOR).await;
    let mut calls = BTreeMap::new();
    for pod in pods {
        let name = cluster::name(&pod);
        let mut log = String::new();
        if cluster::container_restarts(std::slice::from_ref(&pod)) > 0 {
            log = cluster::previous_logs(client, DRIVER_NAMESPACE, &name, "driver").await;
        }
        log += &cluster::logs(client, DRIVER_NAMESPACE, &name, "driver").await;
        for (volume, count) in testenv::process::calls_per_volume(&log, "ControllerReclaimSpace") {
            *calls.entry(volume).or_default() += count;
        }
    }
    calls
}

/// The driver's calls once the batch is over, read again while the log reads back fewer calls for
/// some volume than it did before the batch: it only grows while the container runs, so a shorter
/// read means the Pod was not listed as Running for a moment or the kubelet did not serve the log
/// (as after containerd restarts), and would count every job as lost. Panics if it stays short.
async fn driver_calls_after(client: &Client, before: &BTreeMap<String, usize>, fault: &str) -> BTreeMap<String, usize> {
    let complete = |after: &BTreeMap<String, usize>| {
        before.iter().all(|(volume, count)| after.get(volume).copied().unwrap_or(0) >= *count)
    };
    let read =
        poll::until(2 * poll::MINUTE, async || Some(driver_calls(client).await).filter(|after| complete(after))).await;
    if let Some(after) = read {
        return after;
    }
    let (was, now) = (before.values().sum::<usize>(), driver_calls(client).await.values().sum::<usize>());
    panic!("{fault}: the driver's log reads back {now} calls where it held {was} before the batch: lost or not served")
}

/// Every job of the batch `prefix`: (succeeded, failed with messages, unfinished names).
async fn results(jobs: &Api<DynamicObject>, prefix: &str) -> (Vec<String>, Vec<(String, String)>, Vec<String>) {
    let list = jobs.list(&ListParams::default().labels(&format!("batch={prefix}"))).await.map(|l| l.items);
    let (mut succeeded, mut failed, mut unfinished) = (Vec::new(), Vec::new(), Vec::new());
    for job in list.unwrap_or_default() {
        let name = job.metadata.name.clone().unwrap_or_default();
        match job.data.pointer("/status/result").and_then(|r| r.as_str()) {
            Some("Succeeded") => succeeded.push(name),
            Some("Failed") => {
                let message = job.data.pointer("/status/message").and_then(|m| m.as_str()).unwrap_or_default();
                failed.push((name, message.to_owned()));
            }
            _ => unfinished.push(name),
        }
    }
    (succeeded, failed, unfinished)
}

/// What the table cannot say of jobs left without a result: each one's status, and what every
/// manager Pod's log says of it (its last lines), so a failed run shows where they stopped.
async fn show_unfinished(client: &Client, jobs: &Api<DynamicObject>, names: &[String]) {
    let managers = cluster::running_pods(client, MANAGER_NAMESPACE, MANAGER_SELECTOR).await;
    let mut logs = Vec::new();
    for pod in &managers {
        let name = cluster::name(pod);
        logs.push((name.clone(), cluster::logs(client, MANAGER_NAMESPACE, &name, "manager").await));
    }
    for job in names {
        let status = jobs.get(job).await.ok().and_then(|j| j.data.get("status").cloned());
        eprintln!("{job}: status {}", status.unwrap_or_default());
        // The job's name ends in its index: match it whole.
        let named = |line: &&str| line.contains(&format!("/{job}.")) || line.contains(&format!("job={job} "));
        for (pod, log) in &logs {
            let lines: Vec<&str> = log.lines().filter(named).collect();
            eprintln!("{job}: {} lines in {pod}'s log; the last:", lines.len());
            for line in &lines[lines.len().saturating_sub(5)..] {
                eprintln!("  {line}");
            }
        }
    }
}

/// Container restarts in the cluster's Pods, but the batch's workloads.
async fn restarts(client: &Client) -> i32 {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    let product: Vec<Pod> = list.into_iter().filter(|p| p.metadata.namespace.as_deref() != Some(NAMESPACE)).collect();
    cluster::container_restarts(&product)
}

async fn run(client: &Client, fault: Fault, handles: &[String]) -> FaultRow {
    let prefix = fault.batch();
    let second = match fault {
        Fault::PartitionSidecar => Some(SecondDriver::install(client).await),
        _ => None,
    };
    let jobs = csiaddons(client, "ReclaimSpaceJob", NAMESPACE);
    let replications = replication_api(client, "VolumeReplication", Some(NAMESPACE));
    let replication: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "replication.storage.openshift.io/v1alpha1", "kind": "VolumeReplication",
        "metadata": {"name": prefix},
        "spec": {"volumeReplicationClass": "reference-csi-replication", "replicationState": "primary",
                 "autoResync": false, "dataSource": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "data-0"}}
    }))
    .unwrap();
    replications.create(&PostParams::default(), &replication).await.unwrap();
    let state = async |wanted: &str| {
        poll::until(3 * poll::MINUTE, async || {
            let object = replications.get(prefix).await.ok()?;
            (object.data.pointer("/status/state")?.as_str()? == wanted).then_some(())
        })
        .await
        .is_some()
    };
    assert!(state("Primary").await, "{}: the replication starts as Primary", fault.label());
    let before = driver_calls(client).await;
    let restarts_before = restarts(client).await;
    futures::stream::iter(0..handles.len())
        .map(|i| {
            let jobs = jobs.clone();
            async move {
                let mut spec = fault.job_settings();
                spec["target"] = json!({"persistentVolumeClaim": format!("data-{i}")});
                let job: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "ReclaimSpaceJob",
                    "metadata": {"name": format!("{prefix}-{i}"), "labels": {"batch": prefix}},
                    "spec": spec
                }))
                .unwrap();
                jobs.create(&PostParams::default(), &job).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    // Mid-batch: once the first job has a result.
    let first =
        poll::until(2 * poll::MINUTE, async || (!results(&jobs, prefix).await.0.is_empty()).then_some(())).await;
    assert!(first.is_some(), "{}: a job of the batch ends before the fault", fault.label());
    let struck_first = Instant::now();
    let ballast = fault.strikes_first().then(full_disk::fill);
    let patch = json!({"spec": {"replicationState": "secondary"}});
    replications.patch(prefix, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let in_flight = results(&jobs, prefix).await.2.len();
    let struck = if fault.strikes_first() { struck_first } else { Instant::now() };
    let batch = Batch { replications: &replications, name: prefix, ballast, second: second.as_ref() };
    fault.strike(client, batch).await;
    let ended = poll::until(10 * poll::MINUTE, async || {
        let (_, _, unfinished) = results(&jobs, prefix).await;
        unfinished.is_empty().then_some(())
    })
    .await;
    let recovery = struck.elapsed().as_secs_f64();
    let secondary = state("Secondary").await;
    let connected =
        poll::until(3 * poll::MINUTE, async || (connected_nodes(client).await.len() == 2).then_some(())).await;
    assert!(connected.is_some(), "{}: both sidecars are Connected again", fault.label());
    let plugins = cluster::running_pods(client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
    assert_eq!(plugins.len(), 1, "{}: the node plugin runs", fault.label());
    let (succeeded, failed, unfinished) = results(&jobs, prefix).await;
    let after = driver_calls_after(client, &before, fault.label()).await;
    // Calls made during this batch (the log is the container's since it started; it did not restart).
    let calls = |handle: &String| {
        after.get(handle).copied().unwrap_or(0).saturating_sub(before.get(handle).copied().unwrap_or(0))
    };
    let lost = succeeded
        .iter()
        .filter_map(|name| name.rsplit('-').next()?.parse::<usize>().ok())
        .filter(|&i| calls(&handles[i]) == 0)
        .count();
    let duplicates = handles.iter().map(|h| calls(h).saturating_sub(1)).sum();
    let restarted = restarts(client).await - restarts_before;
    let replication = if secondary { REPLICATED } else { "not Secondary" }.to_owned();
    if ended.is_none() {
        eprintln!(
            "{}: {} jobs unfinished: {:?}",
            fault.label(),
            unfinished.len(),
            &unfinished[..unfinished.len().min(5)]
        );
        show_unfinished(client, &jobs, &unfinished[..unfinished.len().min(3)]).await;
    }
    println!("{}: {restarted} container restarts in the cluster's Pods", fault.label());
    replications.delete(prefix, &DeleteParams::default()).await.unwrap();
    if let Some(second) = second {
        second.remove(client).await;
    }
    FaultRow {
        fault: fault.label(),
        jobs: handles.len(),
        in_flight,
        succeeded: succeeded.len(),
        failed,
        stuck: unfinished.len(),
        lost,
        duplicates,
        recovery,
        extra: Some(("replication", replication)),
    }
}

#[tokio::test]
#[ignore = "restarts the one-node cluster's kubelet and containerd, stops its driver, evicts Pods, fills its disk, reboots the node, cuts a sidecar off, fans 10,000 PVCs out: make test-faults-cluster"]
async fn faults_cluster_lose_no_job_and_leave_none_running() {
    let client = cluster::client().await;
    let made = Instant::now();
    let handles = volumes(&client, batch()).await;
    println!("{} volumes provisioned and bound in {:.1} s", handles.len(), made.elapsed().as_secs_f64());
    let mut outcomes = Vec::new();
    let faults = [
        Fault::RestartKubelet,
        Fault::RestartContainerd,
        Fault::HangDriver,
        Fault::EvictManager,
        Fault::EvictNodePlugin,
        Fault::ShedLoad,
        Fault::FillStateDir,
        Fault::RebootNode,
        Fault::PartitionSidecar,
        Fault::FanOut,
    ];
    for fault in faults.into_iter().filter(|f| selected(*f)) {
        outcomes.push(run(&client, fault, &handles).await);
    }
    fault_table::print(&outcomes);
    remove_volumes(&client).await;
    fault_table::assert_nothing_stuck_or_lost(&outcomes);
    for o in &outcomes {
        let replication = o.extra.as_ref().map(|(_, state)| state.as_str());
        assert_eq!(replication, Some(REPLICATED), "{}: the replication reaches Secondary", o.fault);
    }
}
