//! Benchmarks (`make bench`, ignored by `make test`), ours next to upstream's v0.14.0 on the same
//! control plane in the same run, one manager after the other, each as its own ServiceAccount
//! bound to its own release RBAC:
//! - job throughput: ReclaimSpaceJobs through each side's own manager and sidecar against the
//!   reference driver (raw-block volumes, so each call is a quick hole punch); ours at 1,000 and
//!   10,000 jobs (`BENCH_JOBS`, comma-separated sizes), upstream at the first size only, so what a
//!   job adds is compared per job (the idle part with many CSIAddonsNodes is `bench_idle.rs`).
//!
//! Prints figures and writes them as JSON; asserts only that the work was done.
use std::time::{Duration, Instant};

use kube::api::ListParams;
use serde_json::json;

use crate::benches::report::{plot_rss_against, row, table, write_json};
use crate::harness::driver::Harness;
use crate::harness::manager::ManagerIdentity;
use crate::harness::rig::{self, Build, ManagerProcess, SidecarRun};
use crate::harness::support::dynamic;

/// Polls until every CSIAddonsNode of `namespace` named `prefix…` is Connected (`limit` at most);
/// the seconds.
pub(crate) async fn all_connected(
    client: &kube::Client,
    namespace: &str,
    prefix: &str,
    manager: &mut ManagerProcess,
    limit: Duration,
) -> f64 {
    let nodes = dynamic(client, namespace, "CSIAddonsNode");
    let started = Instant::now();
    loop {
        manager.assert_running();
        let mut list = nodes.list(&ListParams::default()).await.unwrap().items;
        list.retain(|n| n.metadata.name.as_deref().is_some_and(|name| name.starts_with(prefix)));
        let connected = list.iter().filter(|n| n.data.pointer("/status/state") == Some(&json!("Connected"))).count();
        if connected == list.len() {
            return started.elapsed().as_secs_f64();
        }
        assert!(
            started.elapsed() < limit,
            "{connected} of {} CSIAddonsNodes Connected; manager log:\n{}",
            list.len(),
            testenv::process::tail(&manager.log, 40)
        );
        // A list of 10,000 nodes four times a second would load the API server more than the
        // managers measured: the pause grows with the nodes (2 s at 10,000).
        tokio::time::sleep(Duration::from_millis((list.len() as u64 / 5).max(250))).await;
    }
}

#[derive(Default, Debug)]
struct Throughput {
    seconds: f64,
    /// Of `seconds`, until the last job was created (the bench's own writes bound the rate).
    created: f64,
    succeeded: usize,
    manager_peak_mib: f64,
    /// The manager's RSS when the jobs are about to be created, and of it the mapped binary.
    manager_before_mib: f64,
    manager_code_mib: f64,
    manager_cpu: f64,
    sidecar_peak_mib: f64,
    sidecar_cpu: f64,
    driver_calls: usize,
    requests: Option<rig::Requests>,
    pool_errors: usize,
    reconcile_errors: usize,
}

/// One side: its driver, sidecar and manager, `jobs` ReclaimSpaceJobs, until all have a result.
async fn throughput(build: Build, jobs: usize, dir: &std::path::Path) -> Throughput {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, &format!("bench-jobs-{}-{jobs}", build.key())).await.unwrap();
    // A driver name per side: upstream's manager is cluster-wide and must not find our sidecar.
    let driver_name = format!("bench-{}.csi-addons-rs.io", build.key());
    let driver = Harness::start_with(&["--driver-name", &driver_name]).await;
    let volumes = rig::block_volumes(&driver, "bench", jobs).await;
    testenv::bound_claims::bound_pairs(&client, &namespace, "", &driver_name, &volumes).await;
    let identity = ManagerIdentity::of(build, &client, &namespace).await;
    let sidecar = SidecarRun::start(build, &client, &namespace, "bench-node", &driver.driver.addons_endpoint).await;
    let log = dir.join(format!("jobs-{}.log", build.key()));
    let mut manager = ManagerProcess::start(build, &namespace, &identity.kubeconfig(), &log, &[]);
    all_connected(&client, &namespace, "", &mut manager, Duration::from_secs(120)).await;

    let (manager_before_mib, manager_code_mib) =
        (rig::mib(rig::status_kib(manager.pid(), "VmRSS")), rig::mib(rig::status_kib(manager.pid(), "RssFile")));
    let (mark, manager_cpu, sidecar_cpu) =
        (rig::audit_mark(), rig::cpu_seconds(manager.pid()), rig::cpu_seconds(sidecar.pid()));
    let started = Instant::now();
    rig::create_jobs(&client, &namespace, "bench", 0..jobs).await;
    let created = started.elapsed().as_secs_f64();
    let outcome =
        rig::wait_finished(&client, &namespace, jobs, Duration::from_secs(1800), || manager.assert_running()).await;
    let seconds = started.elapsed().as_secs_f64();
    assert!(outcome.unfinished.is_empty(), "{} jobs unfinished after 30 min", outcome.unfinished.len());
    let log_text = manager.log_text();
    let figures = Throughput {
        seconds,
        created,
        succeeded: outcome.succeeded,
        manager_peak_mib: rig::mib(rig::status_kib(manager.pid(), "VmHWM")),
        manager_before_mib,
        manager_code_mib,
        manager_cpu: rig::cpu_seconds(manager.pid()) - manager_cpu,
        sidecar_peak_mib: rig::mib(rig::status_kib(sidecar.pid(), "VmHWM")),
        sidecar_cpu: rig::cpu_seconds(sidecar.pid()) - sidecar_cpu,
        driver_calls: rig::driver_calls(&driver.driver.dir.path().join("driver.log"), "ControllerReclaimSpace")
            .values()
            .sum(),
        requests: rig::requests_since(mark, identity.user()),
        pool_errors: rig::count_lines(&log_text, "the client connection is closing"),
        reconcile_errors: match build {
            Build::Ours => rig::count_lines(&log_text, "reconcile failed"),
            Build::Upstream => rig::count_lines(&log_text, "Reconciler error"),
        },
    };
    assert_eq!(figures.succeeded, jobs, "{:?}", outcome.failed.first());
    drop(manager);
    rig::remove_all(&client, &namespace, "ReclaimSpaceJob").await;
    // The next run's manager must not cache this one's claims and volumes.
    testenv::bound_claims::remove_bound_pairs(&client, &namespace).await;
    figures
}

/// What the jobs added to one run, per job: the manager's RSS above its RSS before the first job,
/// and its requests (a fixed cost, such as its watches starting, is spread over the jobs).
fn per_job(t: &Throughput, jobs: usize) -> serde_json::Value {
    let n = jobs as f64;
    json!({
        "jobs": jobs,
        "seconds": t.seconds,
        "jobs_per_second": n / t.seconds,
        "manager_peak_mib": t.manager_peak_mib,
        "manager_before_mib": t.manager_before_mib,
        "bytes_per_job": (t.manager_peak_mib - t.manager_before_mib) * 1_048_576.0 / n,
        "requests_per_job": t.requests.as_ref().map(|r| r.total as f64 / n),
        "not_events_per_job": t.requests.as_ref().map(|r| r.not_events() as f64 / n),
        "sidecar_peak_mib": t.sidecar_peak_mib,
    })
}

/// Prints what grows with the jobs: each run's figures per job, and between our two sizes the
/// slope (what one more job costs, whatever is fixed left out).
fn print_growth(ours: &[(usize, Throughput)], theirs: Option<(usize, &Throughput)>) -> serde_json::Value {
    println!("\ncost that grows with the jobs (RSS above the manager's before the first job, and requests, per job):");
    let runs = ours.iter().map(|(n, t)| ("ours", *n, t)).chain(theirs.map(|(n, t)| ("upstream", n, t)));
    let mut by_run = serde_json::Map::new();
    for (who, n, t) in runs {
        let figures = per_job(t, n);
        println!(
            "  {who:8} {n:>6} jobs: {:6.1} jobs/s, peak {:6.1} MiB (before {:5.1}), {:7.0} bytes per job, {:.2} requests per job ({:.2} not Events)",
            n as f64 / t.seconds,
            t.manager_peak_mib,
            t.manager_before_mib,
            figures["bytes_per_job"].as_f64().unwrap_or(f64::NAN),
            figures["requests_per_job"].as_f64().unwrap_or(f64::NAN),
            figures["not_events_per_job"].as_f64().unwrap_or(f64::NAN),
        );
        by_run.insert(format!("{who}-{n}"), figures);
    }
    let mut slope = serde_json::Value::Null;
    if let [(small, a), .., (large, b)] = ours {
        let more = (*large - *small) as f64;
        let requests =
            |t: &Throughput, f: fn(&rig::Requests) -> usize| t.requests.as_ref().map_or(f64::NAN, |r| f(r) as f64);
        let bytes = (b.manager_peak_mib - a.manager_peak_mib) * 1_048_576.0 / more;
        let total = (requests(b, |r| r.total) - requests(a, |r| r.total)) / more;
        let not_events = (requests(b, rig::Requests::not_events) - requests(a, rig::Requests::not_events)) / more;
        println!(
            "  ours from {small} to {large} jobs: each job more adds {bytes:.0} bytes of peak RSS and {total:.2} requests ({not_events:.2} not Events)"
        );
        slope = json!({"from": small, "to": large, "bytes_per_job": bytes, "requests_per_job": total, "not_events_per_job": not_events});
    }
    json!({"by_run": by_run, "ours_slope": slope})
}

#[tokio::test]
#[ignore = "benchmark: make bench"]
async fn bench_jobs_throughput_through_each_sides_sidecar() {
    let sizes = rig::sizes("BENCH_JOBS", "1000,10000");
    let Some(&jobs) = sizes.first() else { panic!("BENCH_JOBS names no size") };
    let dir = tempfile::tempdir().unwrap();
    println!(
        "job throughput: ReclaimSpaceJobs, each side's manager and sidecar, the reference driver; ours at {sizes:?}, upstream at {jobs}"
    );
    let mut ours_by_size = Vec::new();
    for &n in &sizes {
        let run = throughput(Build::Ours, n, dir.path()).await;
        println!(
            "  ours at {n}: {:.1} s (creating {:.1} s), peak {:.2} MiB, requests by call {:?}",
            run.seconds,
            run.created,
            run.manager_peak_mib,
            run.requests.as_ref().map(|r| &r.by_call)
        );
        ours_by_size.push((n, run));
    }
    if rig::ours_only() {
        print_growth(&ours_by_size, None);
        return;
    }
    let theirs = throughput(Build::Upstream, jobs, dir.path()).await;
    let ours = &ours_by_size[0].1;
    let per_job = |t: &Throughput, f: fn(&rig::Requests) -> usize| {
        t.requests.as_ref().map_or(f64::NAN, |r| f(r) as f64 / jobs as f64)
    };
    let rows = [
        row("seconds until every job Succeeded", ours.seconds, theirs.seconds),
        row("  of which creating the jobs", ours.created, theirs.created),
        row("jobs per second", jobs as f64 / ours.seconds, jobs as f64 / theirs.seconds),
        row("manager peak RSS (MiB)", ours.manager_peak_mib, theirs.manager_peak_mib),
        row("  manager RSS before the first job (MiB)", ours.manager_before_mib, theirs.manager_before_mib),
        row("    of which the mapped binary (RssFile)", ours.manager_code_mib, theirs.manager_code_mib),
        row("manager CPU (s)", ours.manager_cpu, theirs.manager_cpu),
        row("sidecar peak RSS (MiB)", ours.sidecar_peak_mib, theirs.sidecar_peak_mib),
        row("sidecar CPU (s)", ours.sidecar_cpu, theirs.sidecar_cpu),
        row("driver calls (ControllerReclaimSpace)", ours.driver_calls as f64, theirs.driver_calls as f64),
        row("API requests per job (audit log)", per_job(ours, |r| r.total), per_job(&theirs, |r| r.total)),
        row(
            "  of which not Events",
            per_job(ours, rig::Requests::not_events),
            per_job(&theirs, rig::Requests::not_events),
        ),
        row(
            "API requests answered 429",
            per_job(ours, |r| r.throttled) * jobs as f64,
            per_job(&theirs, |r| r.throttled) * jobs as f64,
        ),
        row("connection-pool errors in the log", ours.pool_errors as f64, theirs.pool_errors as f64),
        row("reconcile errors in the log", ours.reconcile_errors as f64, theirs.reconcile_errors as f64),
    ];
    let figures = table(&format!("job throughput ({jobs} ReclaimSpaceJobs)"), &rows);
    for (who, t) in [("ours", ours), ("upstream", &theirs)] {
        if let Some(requests) = &t.requests {
            println!("  {who}: requests by call {:?}", requests.by_call);
        }
    }
    let growth = print_growth(&ours_by_size, Some((jobs, &theirs)));
    // Peak RSS against the number of jobs, from the RSS before the first one.
    let ours_points: Vec<(f64, f64)> = std::iter::once((0.0, ours.manager_before_mib))
        .chain(ours_by_size.iter().map(|(n, t)| (*n as f64, t.manager_peak_mib)))
        .collect();
    let upstream_points = [(0.0, theirs.manager_before_mib), (jobs as f64, theirs.manager_peak_mib)];
    plot_rss_against(
        "job-rss-by-jobs.png",
        "Manager peak RSS against ReclaimSpaceJobs run",
        "ReclaimSpaceJobs",
        &[("ours", &ours_points), ("upstream v0.14.0", &upstream_points)],
    );
    write_json(
        "job-throughput",
        json!({"jobs": jobs, "figures": figures, "per_job": growth,
               "requests_by_call": {"ours": ours.requests.as_ref().map(|r| &r.by_call),
                                    "upstream": theirs.requests.as_ref().map(|r| &r.by_call)}}),
    );
}
