//! Benchmark (`make bench`, ignored by `make test`): annotation fan-out, our manager next to
//! upstream's v0.14.0 manager on the same control plane in the same run, one after the other, each
//! as its own ServiceAccount bound to its own release RBAC. N bound CSI PVCs of a StorageClass
//! annotated with a reclaim-space schedule (bound by direct writes: PV claimRef, PVC volumeName,
//! both statuses Bound; one set for both managers); each manager is started against them and timed
//! until every ReclaimSpaceCronJob exists; its RSS is sampled over time (plotted), its peak RSS
//! (VmHWM), RSS when idle afterwards and CPU seconds read from /proc, its requests counted in the
//! audit log. Prints figures and writes them as JSON; asserts only that both made every cron job.
use std::time::{Duration, Instant};

use api::csiaddons::ReclaimSpaceCronJob;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::PartialObjectMeta;
use serde_json::json;

use crate::bench_report::{plot_rss, row, table, write_json};
use crate::manager_harness::ManagerIdentity;
use crate::rig::{self, Build, ManagerProcess};
use crate::support::unique;

const DRIVER: &str = "bench.csi-addons-rs.io";
/// Upstream's pvc mode builds the same cron jobs from the class's annotation.
const SCHEDULE_KEY: &str = "reclaimspace.csiaddons.openshift.io/schedule";

struct Figures {
    seconds: f64,
    peak_mib: f64,
    idle_mib: f64,
    anon_mib: f64,
    file_mib: f64,
    cpu: f64,
    requests: Option<rig::Requests>,
    rss: Vec<(f64, f64)>,
}

async fn cron_jobs(client: &kube::Client, namespace: &str) -> usize {
    Api::<PartialObjectMeta<ReclaimSpaceCronJob>>::namespaced(client.clone(), namespace)
        .list_metadata(&ListParams::default())
        .await
        .map_or(0, |l| l.items.len())
}

/// Runs one manager until `n` cron jobs exist, then idles it 10 s; removes the cron jobs after.
async fn measure(client: &kube::Client, namespace: &str, n: usize, build: Build, dir: &std::path::Path) -> Figures {
    let identity = ManagerIdentity::of(build, client, namespace).await;
    let mark = rig::audit_mark();
    let log = dir.join(format!("fan-out-{n}-{}.log", build.key()));
    let mut manager = ManagerProcess::start(build, namespace, &identity.kubeconfig(), &log, &[]);
    let pid = manager.pid();
    let sampler = rig::RssSampler::start(pid);
    let started = Instant::now();
    let mut done = None;
    while started.elapsed() < Duration::from_secs(1800) {
        manager.assert_running();
        if cron_jobs(client, namespace).await >= n {
            done = Some(started.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seconds =
        done.unwrap_or_else(|| panic!("not every cron job was made; log:\n{}", testenv::process::tail(&log, 60)));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let figures = Figures {
        seconds,
        peak_mib: rig::mib(rig::status_kib(pid, "VmHWM")),
        idle_mib: rig::mib(rig::status_kib(pid, "VmRSS")),
        anon_mib: rig::mib(rig::status_kib(pid, "RssAnon")),
        file_mib: rig::mib(rig::status_kib(pid, "RssFile")),
        cpu: rig::cpu_seconds(pid),
        requests: rig::requests_since(mark, identity.user()),
        rss: sampler.finish(),
    };
    drop(manager);
    let api = Api::<ReclaimSpaceCronJob>::namespaced(client.clone(), namespace);
    api.delete_collection(&DeleteParams::default(), &ListParams::default()).await.unwrap();
    while cron_jobs(client, namespace).await > 0 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    figures
}

#[tokio::test]
#[ignore = "benchmark: make bench"]
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
    println!("annotation fan-out: every ReclaimSpaceCronJob for N bound PVCs of an annotated StorageClass");
    let mut results = serde_json::Map::new();
    for n in rig::sizes("BENCH_PVCS", "1000,10000") {
        let namespace = cp.namespace(&client, &format!("bench-{n}")).await.unwrap();
        let creating = Instant::now();
        let handles: Vec<String> = (0..n).map(|i| format!("{namespace}-volume-{i}")).collect();
        testenv::bound_claims::bound_pairs(&client, &namespace, &class_name, DRIVER, &handles).await;
        println!("\nN = {n} (bound pairs written in {:.1} s)", creating.elapsed().as_secs_f64());
        // Ours first: upstream's pvc mode writes annotations onto the PVCs it schedules.
        let ours = measure(&client, &namespace, n, Build::Ours, dir.path()).await;
        if rig::ours_only() {
            println!(
                "  ours only: {:.1} s, peak {:.1} MiB, idle {:.1} MiB (anonymous {:.1}, file-backed {:.1}), CPU {:.1} s",
                ours.seconds, ours.peak_mib, ours.idle_mib, ours.anon_mib, ours.file_mib, ours.cpu
            );
            continue;
        }
        let theirs = measure(&client, &namespace, n, Build::Upstream, dir.path()).await;
        let requests = |f: &Figures| f.requests.as_ref().map_or(f64::NAN, |r| r.total as f64);
        let throttled = |f: &Figures| f.requests.as_ref().map_or(f64::NAN, |r| r.throttled as f64);
        let rows = [
            row("seconds until every cron job exists", ours.seconds, theirs.seconds),
            row("peak RSS (MiB)", ours.peak_mib, theirs.peak_mib),
            row("RSS idle after (MiB)", ours.idle_mib, theirs.idle_mib),
            row("  of which anonymous", ours.anon_mib, theirs.anon_mib),
            row("  of which file-backed", ours.file_mib, theirs.file_mib),
            row("CPU (s)", ours.cpu, theirs.cpu),
            row("API requests (audit log)", requests(&ours), requests(&theirs)),
            row("API requests answered 429", throttled(&ours), throttled(&theirs)),
        ];
        let figures = table(&format!("annotation fan-out, N = {n}"), &rows);
        plot_rss(
            &format!("fan-out-rss-{n}.png"),
            &format!("Manager RSS during the annotation fan-out, N = {n} PVCs"),
            &[("ours", &ours.rss), ("upstream v0.14.0", &theirs.rss)],
        );
        results.insert(
            n.to_string(),
            json!({"figures": figures, "rss_mib_over_time": {"ours": ours.rss, "upstream": theirs.rss}}),
        );
    }
    if !results.is_empty() {
        write_json("annotation-fan-out", json!({"by_pvcs": results}));
    }
    Api::<StorageClass>::all(client.clone()).delete(&class_name, &Default::default()).await.unwrap();
}
