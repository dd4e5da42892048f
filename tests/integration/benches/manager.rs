//! Benchmark (`make bench`, ignored by `make test`): annotation fan-out, our manager next to
//! upstream's v0.14.0 manager on the same control plane in the same run, one after the other, each
//! as its own ServiceAccount bound to its own release RBAC. N bound CSI PVCs of a StorageClass
//! annotated with a reclaim-space schedule (bound by direct writes: PV claimRef, PVC volumeName,
//! both statuses Bound; one set for both managers); each manager is started against them and timed
//! until every ReclaimSpaceCronJob exists; its RSS is sampled over time (plotted), its peak RSS
//! (VmHWM), RSS when idle afterwards and CPU seconds read from /proc, its requests counted in the
//! audit log. Prints figures and writes them as JSON; asserts only that ours made every cron job
//! (upstream is given 30 minutes, and what it made by then is reported).
//!
//! Each size's figures are kept in the JSON under its N, beside the sizes of earlier runs (so
//! `BENCH_PVCS=100000`, about an hour, can run on its own), with the commit and day they came
//! from; what grows with the PVCs is printed and plotted from all of them.
use std::time::{Duration, Instant};

use api::csiaddons::ReclaimSpaceCronJob;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::PartialObjectMeta;
use serde_json::json;

use crate::benches::report::{plot_rss, plot_rss_against, provenance, row, table, write_json};
use crate::harness::manager::ManagerIdentity;
use crate::harness::rig::{self, Build, ManagerProcess};
use crate::harness::support::unique;

const DRIVER: &str = "bench.csi-addons-rs.io";
/// Upstream's pvc mode builds the same cron jobs from the class's annotation.
const SCHEDULE_KEY: &str = "reclaimspace.csiaddons.openshift.io/schedule";

/// How long a manager is given to make every cron job: ours must, upstream's is reported as far
/// as it got.
const CAP: Duration = Duration::from_secs(1800);

struct Figures {
    /// None when the manager did not make every cron job within `CAP`.
    seconds: Option<f64>,
    /// Cron jobs that existed when it was measured.
    made: usize,
    peak_mib: f64,
    idle_mib: f64,
    anon_mib: f64,
    file_mib: f64,
    cpu: f64,
    requests: Option<rig::Requests>,
    rss: Vec<(f64, f64)>,
}

/// How many cron jobs `namespace` holds, from a one-item page and the count of those left (the
/// API server counts them; a full list of 100,000 every 250 ms would load it more than the
/// managers measured).
async fn cron_jobs(client: &kube::Client, namespace: &str) -> usize {
    let page = Api::<PartialObjectMeta<ReclaimSpaceCronJob>>::namespaced(client.clone(), namespace)
        .list_metadata(&ListParams::default().limit(1))
        .await;
    page.map_or(0, |l| {
        let left = l.metadata.remaining_item_count.and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
        l.items.len() + left
    })
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
    let mut seconds = None;
    let mut made = 0;
    while started.elapsed() < CAP {
        manager.assert_running();
        made = cron_jobs(client, namespace).await;
        if made >= n {
            seconds = Some(started.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if seconds.is_none() && build == Build::Ours {
        panic!("ours made {made} of {n} cron jobs in {CAP:?}; log:\n{}", testenv::process::tail(&log, 60));
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let figures = Figures {
        seconds,
        made,
        peak_mib: rig::mib(rig::status_kib(pid, "VmHWM")),
        idle_mib: rig::mib(rig::status_kib(pid, "VmRSS")),
        anon_mib: rig::mib(rig::status_kib(pid, "RssAnon")),
        file_mib: rig::mib(rig::status_kib(pid, "RssFile")),
        cpu: rig::cpu_seconds(pid),
        requests: rig::requests_since(mark, identity.user()),
        rss: sampler.finish(),
    };
    drop(manager);
    remove_cron_jobs(client, namespace).await;
    figures
}

/// Deletes every cron job of `namespace` and waits until none is left. Deleting 100,000 outlasts
/// the API server's request timeout, which ends the request with the deletion part done: it is
/// asked again until none is left.
async fn remove_cron_jobs(client: &kube::Client, namespace: &str) {
    let api = Api::<PartialObjectMeta<ReclaimSpaceCronJob>>::namespaced(client.clone(), namespace);
    let mut asked = None;
    loop {
        let left = cron_jobs(client, namespace).await;
        if left == 0 {
            return;
        }
        if asked.is_none_or(|at: Instant| at.elapsed() > Duration::from_secs(90)) {
            asked = Some(Instant::now());
            let api = api.clone();
            // Not awaited here: its answer lists every object deleted; only the count is watched.
            tokio::spawn(async move { api.delete_collection(&DeleteParams::default(), &ListParams::default()).await });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One manager's figures at one size, as kept in the JSON.
fn side(f: &Figures, n: usize) -> serde_json::Value {
    json!({
        "pvcs": n,
        "seconds": f.seconds,
        "cron_jobs_made": f.made,
        "peak_mib": f.peak_mib,
        "idle_mib": f.idle_mib,
        "anon_mib": f.anon_mib,
        "file_mib": f.file_mib,
        "cpu_seconds": f.cpu,
        "requests": f.requests.as_ref().map(|r| r.total),
        "requests_by_call": f.requests.as_ref().map(|r| &r.by_call),
    })
}

/// The side-by-side table of one size; upstream's seconds are left out when it did not finish.
fn compare(n: usize, ours: &Figures, theirs: &Figures) -> serde_json::Value {
    let requests = |f: &Figures| f.requests.as_ref().map_or(f64::NAN, |r| r.total as f64);
    let throttled = |f: &Figures| f.requests.as_ref().map_or(f64::NAN, |r| r.throttled as f64);
    let seconds = |f: &Figures| f.seconds.unwrap_or(f64::NAN);
    if theirs.seconds.is_none() {
        println!(
            "\n  upstream made {} of {n} cron jobs in {} s; its figures below are as they were then",
            theirs.made,
            CAP.as_secs()
        );
    }
    let rows = [
        row("seconds until every cron job exists", seconds(ours), seconds(theirs)),
        row("cron jobs made", ours.made as f64, theirs.made as f64),
        row("peak RSS (MiB)", ours.peak_mib, theirs.peak_mib),
        row("RSS idle after (MiB)", ours.idle_mib, theirs.idle_mib),
        row("  of which anonymous", ours.anon_mib, theirs.anon_mib),
        row("  of which file-backed", ours.file_mib, theirs.file_mib),
        row("CPU (s)", ours.cpu, theirs.cpu),
        row("API requests (audit log)", requests(ours), requests(theirs)),
        row("API requests answered 429", throttled(ours), throttled(theirs)),
    ];
    table(&format!("annotation fan-out, N = {n}"), &rows)
}

/// The sizes measured before (kept unless measured again), from the results JSON.
fn earlier_sizes() -> serde_json::Map<String, serde_json::Value> {
    let path = crate::benches::report::results_dir().join("annotation-fan-out.json");
    let earlier: serde_json::Value =
        std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    earlier.get("by_pvcs").and_then(|b| b.as_object()).cloned().unwrap_or_default()
}

/// What grows with the PVCs, per manager, from every size with a full count: at each size the
/// requests per PVC, and between consecutive sizes what one more PVC adds to the peak RSS and to
/// the requests (the fixed cost, such as the binary and the watches starting, left out); peak RSS
/// against PVCs plotted (`fan-out-rss-by-pvcs.png`).
fn growth(by_pvcs: &serde_json::Map<String, serde_json::Value>) -> serde_json::Value {
    println!("\ncost that grows with the PVCs (per PVC; between sizes, what each PVC more adds):");
    let mut out = serde_json::Map::new();
    let mut plotted = Vec::new();
    for who in ["ours", "upstream"] {
        let mut points: Vec<(f64, f64, f64)> = by_pvcs
            .values()
            .filter_map(|size| size.get(who))
            .filter(|f| f["seconds"].is_number())
            .filter_map(|f| Some((f["pvcs"].as_f64()?, f["peak_mib"].as_f64()?, f["requests"].as_f64()?)))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut rows = Vec::new();
        for (n, peak, requests) in &points {
            println!("  {who:8} {n:>7} PVCs: peak {peak:7.1} MiB, {:.2} requests per PVC", requests / n);
            rows.push(json!({"pvcs": n, "peak_mib": peak, "requests_per_pvc": requests / n}));
        }
        let mut slopes = Vec::new();
        for pair in points.windows(2) {
            let [(a, peak_a, req_a), (b, peak_b, req_b)] = pair else { continue };
            let bytes = (peak_b - peak_a) * 1_048_576.0 / (b - a);
            let requests = (req_b - req_a) / (b - a);
            println!(
                "  {who:8} from {a} to {b} PVCs: {bytes:.0} bytes of peak RSS and {requests:.2} requests per PVC more"
            );
            slopes.push(json!({"from": a, "to": b, "bytes_per_pvc": bytes, "requests_per_pvc": requests}));
        }
        out.insert(who.into(), json!({"by_size": rows, "slopes": slopes}));
        plotted.push(points.iter().map(|(n, peak, _)| (*n, *peak)).collect::<Vec<_>>());
    }
    plot_rss_against(
        "fan-out-rss-by-pvcs.png",
        "Manager peak RSS against PVCs in the annotation fan-out",
        "bound PVCs of the annotated StorageClass",
        &[("ours", &plotted[0]), ("upstream v0.14.0", &plotted[1])],
    );
    serde_json::Value::Object(out)
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
    let mut by_pvcs = earlier_sizes();
    let sizes = rig::sizes("BENCH_PVCS", "1000,10000");
    for (i, &n) in sizes.iter().enumerate() {
        let namespace = cp.namespace(&client, &format!("bench-{n}")).await.unwrap();
        let creating = Instant::now();
        let handles: Vec<String> = (0..n).map(|i| format!("{namespace}-volume-{i}")).collect();
        testenv::bound_claims::bound_pairs(&client, &namespace, &class_name, DRIVER, &handles).await;
        let created = creating.elapsed().as_secs_f64();
        println!("\nN = {n} (bound pairs written in {created:.1} s)");
        // Ours first: upstream's pvc mode writes annotations onto the PVCs it schedules.
        let ours = measure(&client, &namespace, n, Build::Ours, dir.path()).await;
        println!(
            "  ours: {:.1} s, peak {:.1} MiB, idle {:.1} MiB (anonymous {:.1}, file-backed {:.1}), CPU {:.1} s",
            ours.seconds.unwrap_or(f64::NAN),
            ours.peak_mib,
            ours.idle_mib,
            ours.anon_mib,
            ours.file_mib,
            ours.cpu
        );
        let mut entry = json!({"run": provenance(), "seconds_to_write_the_pairs": created, "ours": side(&ours, n)});
        if !rig::ours_only() {
            let theirs = measure(&client, &namespace, n, Build::Upstream, dir.path()).await;
            entry["figures"] = compare(n, &ours, &theirs);
            entry["upstream"] = side(&theirs, n);
            entry["rss_mib_over_time"] = json!({"ours": ours.rss, "upstream": theirs.rss});
            plot_rss(
                &format!("fan-out-rss-{n}.png"),
                &format!("Manager RSS during the annotation fan-out, N = {n} PVCs"),
                &[("ours", &ours.rss), ("upstream v0.14.0", &theirs.rss)],
            );
        }
        by_pvcs.insert(n.to_string(), entry);
        // Written as each size ends, so a later size's failure keeps it.
        write_json("annotation-fan-out", json!({"by_pvcs": by_pvcs}));
        // Each size's managers see only its own claims and volumes.
        if i + 1 < sizes.len() {
            testenv::bound_claims::remove_bound_pairs(&client, &namespace).await;
        }
    }
    let grows = growth(&by_pvcs);
    write_json("annotation-fan-out", json!({"by_pvcs": by_pvcs, "growth": grows}));
    Api::<StorageClass>::all(client.clone()).delete(&class_name, &Default::default()).await.unwrap();
}
