//! The fault suite (`make test-faults`, ignored by `make test`: it restarts the shared API server).
//! Each fault strikes while a batch of ReclaimSpaceJobs is in flight through our manager, sidecar
//! and the reference driver: kill -9 the manager and start it again; kill -9 the sidecar and start
//! it again; kill -9 the driver and start it again; kill -9 kube-apiserver and start it again; the
//! same while the manager is paused, half of the jobs created meanwhile (its watches must list
//! again, and the jobs new in that list must run); two managers electing a leader, the leader
//! killed. Afterwards every job must have ended Succeeded
//! or Failed with a message (none stuck), and no job may claim success without a driver call.
//! Driver calls are counted per volume: a second call for one job is a duplicate, reported with
//! its cause (ReclaimSpace is idempotent; a call whose result was not yet written when the
//! manager or API server died is made again). Prints a table; the recovery seconds are figures.
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use testenv::fault_table::{self, FaultRow};
use testenv::poll::MINUTE;
use testenv::process::signal;

use crate::harness::driver::Harness;
use crate::harness::manager::ManagerIdentity;
use crate::harness::rig::{self, Build, ManagerProcess};
use crate::harness::sidecar::{Serving, SidecarPod, SidecarProcess, Workload, sidecar_pod};

/// Jobs per batch (`FAULT_JOBS`).
fn batch() -> usize {
    std::env::var("FAULT_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(150)
}

const NODE: &str = "fault-node";
/// Short leases, so that a failover is quick: the manager's flags, as the tests of leader election use.
const ELECTION: [&str; 4] = [
    "--leader-elect",
    "--leader-election-lease-duration=4s",
    "--leader-election-renew-deadline=3s",
    "--leader-election-retry-period=1s",
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    KillManager,
    KillSidecar,
    KillDriver,
    RestartApiServer,
    /// kube-apiserver restarted while the manager is stopped (SIGSTOP), half of the batch created
    /// before it continues: the restarted server no longer has the manager's resource versions,
    /// so its watches list everything again, and the jobs in that list it has never seen must run.
    RestartApiServerWhilePaused,
    LeaderFailover,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::KillManager => "kill -9 manager, restart",
            Fault::KillSidecar => "kill -9 sidecar, restart",
            Fault::KillDriver => "kill -9 driver, restart",
            Fault::RestartApiServer => "kill -9 kube-apiserver, restart",
            Fault::RestartApiServerWhilePaused => "kube-apiserver restart, new jobs",
            Fault::LeaderFailover => "leader failover (kill -9 leader)",
        }
    }
}

/// One namespace with a driver, a sidecar and our manager(s), for one fault.
struct Scene {
    client: kube::Client,
    namespace: String,
    identity: ManagerIdentity,
    driver: Harness,
    /// Volume i is job fault-i's (PVC data-i).
    volumes: Vec<String>,
    pod: SidecarPod,
    sidecar: SidecarProcess,
    managers: Vec<ManagerProcess>,
    dir: tempfile::TempDir,
}

impl Scene {
    async fn new(fault: Fault, jobs: usize) -> Self {
        let cp = testenv::shared();
        let client = cp.client().await.unwrap();
        let namespace = cp.namespace(&client, "faults").await.unwrap();
        let driver_name = format!("{namespace}.csi-addons-rs.io");
        let driver = Harness::start_with(&["--driver-name", &driver_name]).await;
        let volumes = rig::block_volumes(&driver, "fault", jobs).await;
        testenv::bound_claims::bound_pairs(&client, &namespace, "", &driver_name, &volumes).await;
        let identity = ManagerIdentity::new(&client, &namespace).await;
        let pod = sidecar_pod(&client, &namespace, NODE, Workload::DaemonSet, "csi-plugin").await;
        let sidecar = SidecarProcess::start(&pod, NODE, &driver.driver.addons_endpoint, Serving::Plain, &[]);
        sidecar.wait_leader(true).await;
        let dir = tempfile::tempdir().unwrap();
        let mut scene = Scene { client, namespace, identity, driver, volumes, pod, sidecar, managers: Vec::new(), dir };
        let replicas = if fault == Fault::LeaderFailover { 2 } else { 1 };
        for _ in 0..replicas {
            scene.start_manager();
            if fault == Fault::LeaderFailover {
                // The first one leads: it is the one killed.
                scene.until("a manager to hold the Lease", async |s| s.leader().await).await;
            }
        }
        scene.until("the CSIAddonsNode to be Connected", async |s| s.connected().await.then_some(())).await;
        scene
    }

    fn start_manager(&mut self) {
        let log = self.dir.path().join(format!("manager-{}.log", self.managers.len()));
        let mut extra = vec![format!("--watch-namespace={}", self.namespace)];
        extra.extend(ELECTION.map(str::to_owned));
        let manager = ManagerProcess::start(Build::Ours, &self.namespace, &self.identity.kubeconfig(), &log, &extra);
        self.managers.push(manager);
    }

    async fn leader(&self) -> Option<String> {
        let leases = Api::<Lease>::namespaced(self.client.clone(), &self.namespace);
        let lease = leases.get_opt(operator::manager::LEASE_NAME).await.ok()??;
        lease.spec?.holder_identity.filter(|h| !h.is_empty())
    }

    async fn connected(&self) -> bool {
        let nodes = crate::harness::support::dynamic(&self.client, &self.namespace, "CSIAddonsNode");
        let list = nodes.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        // A restarted sidecar registers its new endpoint on the same node object.
        list.iter().any(|n| n.data.pointer("/status/state") == Some(&serde_json::json!("Connected")))
    }

    /// Polls `check` until it yields a value (2 min at most).
    async fn until<T>(&self, what: &str, check: impl AsyncFn(&Scene) -> Option<T>) -> T {
        if let Some(value) = testenv::poll::until(2 * MINUTE, async || check(self).await).await {
            return value;
        }
        let logs: Vec<String> = self.managers.iter().map(|m| testenv::process::tail(&m.log, 30)).collect();
        panic!("timed out waiting for {what}; manager logs:\n{}", logs.join("\n---\n"));
    }

    /// Strikes; returns when the struck part runs again (the failover itself is measured after).
    async fn strike(&mut self, fault: Fault) {
        match fault {
            Fault::KillManager => {
                self.managers[0].kill();
                self.managers.clear();
                self.start_manager();
            }
            Fault::KillSidecar => {
                self.sidecar.kill();
                self.sidecar =
                    SidecarProcess::start(&self.pod, NODE, &self.driver.driver.addons_endpoint, Serving::Plain, &[]);
            }
            Fault::KillDriver => self.driver.driver.kill_and_restart(),
            Fault::RestartApiServer => testenv::shared().kill_and_restart_apiserver().await.unwrap(),
            Fault::RestartApiServerWhilePaused => {
                let manager = self.managers[0].pid();
                signal("-STOP", manager);
                testenv::shared().kill_and_restart_apiserver().await.unwrap();
                let jobs = self.volumes.len();
                rig::create_jobs(&self.client, &self.namespace, "fault", jobs / 2..jobs).await;
                signal("-CONT", manager);
            }
            Fault::LeaderFailover => {
                let before = self.leader().await;
                self.managers.remove(0).kill();
                self.until("another manager to take the Lease", async |s| {
                    s.leader().await.filter(|now| Some(now) != before.as_ref())
                })
                .await;
            }
        }
    }
}

async fn run(fault: Fault) -> FaultRow {
    let jobs = batch();
    let mut scene = Scene::new(fault, jobs).await;
    // The fault that pauses the manager creates the second half itself, while it is paused.
    let first = if fault == Fault::RestartApiServerWhilePaused { jobs / 2 } else { jobs };
    rig::create_jobs(&scene.client, &scene.namespace, "fault", 0..first).await;
    // Mid-batch: once the first job has a result, while the others run or wait.
    let in_flight = scene
        .until("the first job to finish", async |s| {
            let now = rig::outcome(&s.client, &s.namespace).await;
            let unfinished = now.unfinished.len();
            (now.seen() >= first && unfinished < first).then_some(unfinished + jobs - first)
        })
        .await;
    let struck = Instant::now();
    scene.strike(fault).await;
    let outcome = rig::wait_finished(&scene.client, &scene.namespace, jobs, Duration::from_secs(300), || {
        scene.managers.iter_mut().for_each(|m| m.assert_running());
    })
    .await;
    let recovery = struck.elapsed().as_secs_f64();
    let calls = rig::driver_calls(&scene.driver.driver.dir.path().join("driver.log"), "ControllerReclaimSpace");
    let failed_names: std::collections::BTreeSet<&str> = outcome.failed.iter().map(|(n, _)| n.as_str()).collect();
    let lost = (0..jobs)
        .filter(|i| !failed_names.contains(format!("fault-{i}").as_str()))
        .filter(|i| !outcome.unfinished.contains(&format!("fault-{i}")))
        .filter(|&i| !calls.contains_key(&scene.volumes[i]))
        .count();
    let duplicates = calls.values().map(|n| n.saturating_sub(1)).sum();
    if !outcome.unfinished.is_empty() {
        for manager in &scene.managers {
            eprintln!("{}: manager log:\n{}", fault.label(), testenv::process::tail(&manager.log, 40));
        }
    }
    FaultRow {
        fault: fault.label(),
        jobs,
        in_flight,
        succeeded: outcome.succeeded,
        failed: outcome.failed,
        stuck: outcome.unfinished.len(),
        lost,
        duplicates,
        recovery,
        extra: None,
    }
}

#[tokio::test]
#[ignore = "fault suite: make test-faults (restarts the shared API server)"]
async fn faults_lose_no_job_and_leave_none_running() {
    let mut results = Vec::new();
    for fault in [
        Fault::KillManager,
        Fault::KillSidecar,
        Fault::KillDriver,
        Fault::RestartApiServer,
        Fault::RestartApiServerWhilePaused,
        Fault::LeaderFailover,
    ] {
        let result = run(fault).await;
        println!(
            "{}: {} of {} in flight at the fault, {} succeeded, {} failed, {} stuck, {} lost, {} duplicate calls, {:.1} s",
            fault.label(),
            result.in_flight,
            result.jobs,
            result.succeeded,
            result.failed.len(),
            result.stuck,
            result.lost,
            result.duplicates,
            result.recovery
        );
        results.push(result);
    }
    fault_table::print(&results);
    fault_table::assert_nothing_stuck_or_lost(&results);
}

/// An API server that does not stream initial lists in a watch (the WatchList feature off, as
/// before Kubernetes 1.32 by default): the manager's watches find out at their first request,
/// list in pages instead, and the jobs run as ever.
#[tokio::test]
#[ignore = "fault suite: make test-faults (restarts the shared API server)"]
async fn faults_without_streamed_lists_the_manager_lists_in_pages() {
    let cp = testenv::shared();
    cp.restart_apiserver_with(&["--feature-gates=WatchList=false"]).await.unwrap();
    let jobs = 20;
    // One manager (the fault only sets how many), started against the server without WatchList.
    let mut scene = Scene::new(Fault::KillManager, jobs).await;
    rig::create_jobs(&scene.client, &scene.namespace, "fault", 0..jobs).await;
    let outcome = rig::wait_finished(&scene.client, &scene.namespace, jobs, 2 * MINUTE, || {
        scene.managers.iter_mut().for_each(|m| m.assert_running());
    })
    .await;
    let log = scene.managers[0].log_text();
    drop(scene);
    // The suite's other tests get the server as it was.
    cp.kill_and_restart_apiserver().await.unwrap();
    assert_eq!(outcome.succeeded, jobs, "failed: {:?}, unfinished: {:?}", outcome.failed, outcome.unfinished);
    assert_eq!(
        rig::count_lines(&log, "does not stream initial lists"),
        1,
        "the manager says once that it lists in pages; log:\n{log}"
    );
}
