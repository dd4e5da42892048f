//! The network between the manager and one sidecar cut for a minute: every packet to or from the
//! controller plugin's CSI-Addons port dropped inside that Pod's network namespace (so inside the
//! cluster's, never the host's), the way a broken link or a firewall drops them. A second driver
//! instance runs beside the first (`tests/cluster/second-driver/`): its jobs, made once the cut is
//! in place, must all end Succeeded while it lasts, since one driver's silent sidecar may hold up
//! only its own driver's jobs. The first driver's jobs wait or retry, and finish once it heals.
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use serde_json::json;
use testenv::poll;
use testenv::process::pids_where;

use crate::cluster::hack_script;
use crate::driver_pods::csiaddons;

/// How long the cut lasts.
pub const CUT: Duration = Duration::from_secs(60);
/// The sidecars' port, as the driver's YAML publishes it.
const SIDECAR_PORT: &str = "9070";
/// Where the second driver's claims and jobs live.
const NAMESPACE: &str = "faults-second";
const CLASS: &str = "second-reference-csi";
/// Jobs for the second driver.
const JOBS: usize = 20;

/// The second driver, installed, with its bound claims.
pub struct SecondDriver {
    claims: Vec<String>,
}

impl SecondDriver {
    /// Installs the second driver (what an earlier, failed run left of it removed first) and binds
    /// `JOBS` claims of it.
    pub async fn install(client: &Client) -> Self {
        clear(client).await;
        tokio::task::spawn_blocking(|| hack_script("cluster-install.sh", &["second-driver"])).await.unwrap();
        let apply = PatchParams::apply("faults-test").force();
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
        Api::<Namespace>::all(client.clone()).patch(NAMESPACE, &apply, &Patch::Apply(&namespace)).await.unwrap();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
        let names: Vec<String> = (0..JOBS).map(|i| format!("second-{i}")).collect();
        for name in &names {
            let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"storageClassName": CLASS, "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "16Mi"}}}
            }))
            .unwrap();
            claims.create(&PostParams::default(), &claim).await.unwrap();
        }
        let bound = poll::until(3 * poll::MINUTE, async || {
            let list = claims.list(&ListParams::default()).await.ok()?.items;
            let bound = list.iter().filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"));
            (bound.count() == JOBS).then_some(())
        })
        .await;
        assert!(bound.is_some(), "the second driver provisions {JOBS} volumes");
        SecondDriver { claims: names }
    }

    /// Its claims go (the driver deletes their volumes), then the driver.
    pub async fn remove(self, client: &Client) {
        clear(client).await;
    }
}

/// The second driver's claims and jobs, their volumes, then the driver and its state: each step
/// does nothing when there is nothing to remove.
async fn clear(client: &Client) {
    let namespaces = Api::<Namespace>::all(client.clone());
    let _ = namespaces.delete(NAMESPACE, &DeleteParams::default()).await;
    let gone =
        poll::until(3 * poll::MINUTE, async || namespaces.get_opt(NAMESPACE).await.ok()?.is_none().then_some(())).await;
    assert!(gone.is_some(), "the second driver's claims and jobs go with their namespace");
    // Their volumes next, while the driver that deletes them still runs.
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let deleted = poll::until(3 * poll::MINUTE, async || {
        let list = pvs.list(&ListParams::default()).await.ok()?.items;
        let left =
            list.iter().filter(|pv| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(CLASS));
        (left.count() == 0).then_some(())
    })
    .await;
    assert!(deleted.is_some(), "the second driver deletes its volumes once their claims are gone");
    tokio::task::spawn_blocking(|| hack_script("cluster-install.sh", &["remove-second-driver"])).await.unwrap();
}

/// Packets to and from the sidecar port of the Pod whose network namespace `pid` is in, dropped
/// until this is dropped (a failing test heals too).
struct Cut {
    pid: u32,
    /// The rules in place: (chain, match).
    rules: Vec<(&'static str, &'static str)>,
}

impl Cut {
    fn iptables(pid: u32, action: &str, (chain, side): (&str, &str)) -> std::io::Result<std::process::ExitStatus> {
        let netns = format!("--net=/proc/{pid}/ns/net");
        Command::new("nsenter")
            .args([netns.as_str(), "iptables", "-w", action, chain, "-p", "tcp", side, SIDECAR_PORT, "-j", "DROP"])
            .status()
    }

    fn start(pid: u32) -> Self {
        let mut cut = Cut { pid, rules: Vec::new() };
        for rule in [("INPUT", "--dport"), ("OUTPUT", "--sport")] {
            let added = Self::iptables(pid, "-I", rule);
            assert!(
                added.as_ref().is_ok_and(|s| s.success()),
                "iptables -I {} in the controller plugin's Pod: {added:?}",
                rule.0
            );
            cut.rules.push(rule);
        }
        cut
    }
}

impl Drop for Cut {
    /// Best effort: the Pod may be gone, and a panic here would hide the test's own.
    fn drop(&mut self) {
        for rule in self.rules.drain(..) {
            let removed = Self::iptables(self.pid, "-D", rule);
            if !removed.as_ref().is_ok_and(|s| s.success()) {
                eprintln!("iptables -D {} in the controller plugin's Pod: {removed:?}", rule.0);
            }
        }
    }
}

/// The first driver's controller plugin process (the second's is told apart by its driver name).
/// Waited for: after a restart or the node's reboot, the old container's process can still be
/// exiting beside the new one. (A driver's child that has not yet run its command is not counted:
/// see `pids_where`.)
pub(crate) async fn first_controller_driver() -> u32 {
    let one = poll::until(2 * poll::MINUTE, async || match first_controller_drivers()[..] {
        [pid] => Some(pid),
        _ => None,
    })
    .await;
    one.unwrap_or_else(|| {
        panic!("one controller plugin of the first driver runs, found {:?}", first_controller_drivers())
    })
}

fn first_controller_drivers() -> Vec<u32> {
    let pids = pids_where(|args| {
        args.first().is_some_and(|a| a.ends_with("reference-driver")) && args.iter().any(|a| a == "--mode=controller")
    });
    pids.into_iter()
        .filter(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            !environ.split(|&b| b == 0).any(|v| v.starts_with(b"DRIVER_NAME=second-"))
        })
        .collect()
}

/// Each job's result, by name.
async fn results(jobs: &Api<DynamicObject>) -> BTreeMap<String, String> {
    let list = jobs.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter_map(|job| {
            let result = job.data.pointer("/status/result")?.as_str()?.to_owned();
            Some((job.metadata.name?, result))
        })
        .collect()
}

/// Cuts the first driver's controller sidecar off the manager for [`CUT`]; meanwhile one job per
/// claim of `second` must end Succeeded, while `unfinished` (the first driver's batch still
/// running) says the cut holds that batch up. Prints how long they took.
pub async fn cut_while_the_second_driver_works(
    client: &Client,
    second: &SecondDriver,
    unfinished: impl AsyncFn() -> usize,
) {
    let cut = Cut::start(first_controller_driver().await);
    let struck = Instant::now();
    let jobs = csiaddons(client, "ReclaimSpaceJob", NAMESPACE);
    futures::stream::iter(&second.claims)
        .map(|claim| {
            let jobs = jobs.clone();
            async move {
                let job: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "ReclaimSpaceJob",
                    "metadata": {"name": claim}, "spec": {"target": {"persistentVolumeClaim": claim}}
                }))
                .unwrap();
                jobs.create(&PostParams::default(), &job).await.unwrap();
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    // The cut stays until they have ended: what is asserted is that they ended while it was in
    // place. Two minutes, less than the manager's call timeout (3 min): were every worker waiting on
    // the silent sidecar, none would be free before its calls timed out.
    let ended = poll::until(2 * poll::MINUTE, async || {
        let results = results(&jobs).await;
        (results.len() == second.claims.len()).then_some(results)
    })
    .await;
    let took = struck.elapsed();
    let results =
        ended.unwrap_or_else(|| panic!("the second driver's {JOBS} jobs end while the first's sidecar is cut off"));
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.as_str() != "Succeeded").collect();
    assert!(failed.is_empty(), "the second driver's jobs all Succeeded during the cut: {failed:?}");
    let held_up = unfinished().await;
    assert!(held_up > 0, "the cut holds the first driver's batch up meanwhile");
    println!(
        "sidecar cut off: the second driver's {} jobs all Succeeded {:.1} s after the cut began, while it lasted \
         and {held_up} of the first driver's jobs waited",
        results.len(),
        took.as_secs_f64()
    );
    tokio::time::sleep(CUT.saturating_sub(struck.elapsed())).await;
    drop(cut);
}
