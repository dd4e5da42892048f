//! Benchmark (`make bench`, ignored by `make test`): each manager idle with N CSIAddonsNodes
//! (`BENCH_NODES`, 1,000 by default), ours next to upstream's v0.14.0 on the same control plane in
//! the same run, one after the other, each as its own ServiceAccount bound to its own release RBAC.
//! Each node names a sidecar Pod of its own (a connection each), all of them the address of one
//! live sidecar. Each size writes its JSON (`idle-nodes.json` for 1,000, `idle-nodes-<N>.json`
//! otherwise), with the commit and day it came from; what grows with the nodes is printed and
//! plotted from every size measured. Asserts only that every node was Connected.
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::benches::jobs::all_connected;
use crate::benches::report::{plot_rss_against, provenance, results_dir, row, table, write_json};
use crate::harness::driver::Harness;
use crate::harness::manager::ManagerIdentity;
use crate::harness::rig::{self, Build, ManagerProcess, SidecarRun};
use crate::harness::support::dynamic;

/// `n` Pods `<template>-<i>` like `template` (its labels, owner and spec), each with the address
/// 127.0.0.1 in its status; their names.
async fn pods_like(pods: &kube::Api<Pod>, template: &Pod, n: usize) -> Vec<String> {
    let status = json!({"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}});
    let prefix = template.metadata.name.clone().unwrap_or_default();
    futures::stream::iter(0..n)
        .map(|i| {
            let name = format!("{prefix}-{i}");
            let pod = Pod {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    labels: template.metadata.labels.clone(),
                    owner_references: template.metadata.owner_references.clone(),
                    ..Default::default()
                },
                spec: template.spec.clone(),
                status: None,
            };
            let status = &status;
            async move {
                pods.create(&PostParams::default(), &pod).await.unwrap();
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
                name
            }
        })
        .buffered(32)
        .collect()
        .await
}

/// Raises this process's limit of open files to its hard limit, for the managers and the sidecar
/// it starts to inherit; the limit.
fn raise_open_files() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 0 };
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_or(0, |()| hard)
}

/// How long each manager idles after every node is Connected before its RSS is read.
const IDLE_AFTER: Duration = Duration::from_secs(150);

/// One manager's figures in the idle part.
#[derive(Debug)]
struct IdleNodes {
    seconds: f64,
    /// CPU seconds and API requests until every node was Connected.
    cpu: f64,
    /// The API server's and etcd's CPU seconds meanwhile.
    server_cpu: f64,
    requests: f64,
    rss: f64,
    peak: f64,
    threads: f64,
    anon: f64,
}

#[tokio::test]
#[ignore = "benchmark: make bench"]
async fn bench_manager_idle_with_many_csiaddonsnodes() {
    let n = rig::sizes("BENCH_NODES", "1000").first().copied().unwrap_or(1000);
    let open_files = raise_open_files();
    // Upstream's manager holds a connection per node, and the one live sidecar answers them all:
    // each of the two needs a descriptor per node.
    assert!(open_files > n as u64 + 1000, "{open_files} open files allowed: too few for {n} nodes (ulimit -Hn)");
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "bench-nodes").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let driver_name = "bench-nodes.csi-addons-rs.io";
    let driver = Harness::start_with(&["--driver-name", driver_name]).await;
    // One live sidecar (ours: the managers are measured, not it). Each node names a Pod of its own
    // in a pod:// endpoint, as each node's sidecar is a Pod of its own in a cluster, so each manager
    // keeps a connection per node; every one of those Pods has the live sidecar's address.
    let run = SidecarRun::start(Build::Ours, &client, &namespace, "bench-node", &driver.driver.addons_endpoint).await;
    let SidecarRun::Ours(sidecar) = &run else { unreachable!("asked for ours") };
    let pods = kube::Api::<Pod>::namespaced(client.clone(), &namespace);
    let template = pods.list(&ListParams::default()).await.unwrap().items.remove(0);
    let creating = std::time::Instant::now();
    let pod_names = pods_like(&pods, &template, n).await;
    let nodes = dynamic(&client, &namespace, "CSIAddonsNode");
    futures::stream::iter(0..n)
        .map(|i| {
            let nodes = nodes.clone();
            let endpoint = format!("pod://{}.{namespace}:{}", pod_names[i], sidecar.port);
            async move {
                let node: kube::api::DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "CSIAddonsNode",
                    "metadata": {"name": format!("idle-{i}")},
                    "spec": {"driver": {"name": driver_name, "endpoint": endpoint, "nodeID": format!("idle-node-{i}")}},
                }))
                .unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    println!(
        "manager idle with {n} CSIAddonsNodes, each naming a Pod of its own (one live sidecar behind them all); \
         the benchmark wrote the Pods and nodes in {:.1} s",
        creating.elapsed().as_secs_f64()
    );
    let mut measured = Vec::new();
    let builds: &[Build] = if rig::ours_only() { &[Build::Ours] } else { &[Build::Ours, Build::Upstream] };
    for &build in builds {
        // Each manager starts from nodes with no status and no finalizer, as after an install.
        let names: Vec<String> = nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        futures::stream::iter(names)
            .for_each_concurrent(32, |name| {
                let nodes = nodes.clone();
                async move {
                    let params = PatchParams::default();
                    let _ = nodes.patch_status(&name, &params, &Patch::Merge(&json!({"status": null}))).await;
                    let _ =
                        nodes.patch(&name, &params, &Patch::Merge(&json!({"metadata": {"finalizers": null}}))).await;
                }
            })
            .await;
        let identity = ManagerIdentity::of(build, &client, &namespace).await;
        let log = dir.path().join(format!("nodes-{}.log", build.key()));
        let mark = rig::audit_mark();
        let server_cpu = || cp.pids().into_iter().map(rig::cpu_seconds).sum::<f64>();
        let server_cpu_before = server_cpu();
        let mut manager = ManagerProcess::start(build, &namespace, &identity.kubeconfig(), &log, &[]);
        // Only the idle ones: the sidecar's own node has an ip:port endpoint, which upstream's
        // manager cannot parse.
        let seconds = all_connected(&client, &namespace, "idle-", &mut manager, Duration::from_secs(900)).await;
        let pid = manager.pid();
        let cpu = rig::cpu_seconds(pid);
        let server_cpu = server_cpu() - server_cpu_before;
        let requests = rig::requests_since(mark, identity.user());
        // Past our manager's default `--sidecar-idle-timeout` (2 minutes) and its next look: an
        // idle manager, as a cluster has it between jobs.
        tokio::time::sleep(IDLE_AFTER).await;
        manager.assert_running();
        let idle = IdleNodes {
            seconds,
            cpu,
            server_cpu,
            requests: requests.as_ref().map_or(f64::NAN, |r| r.total as f64),
            rss: rig::mib(rig::status_kib(pid, "VmRSS")),
            peak: rig::mib(rig::status_kib(pid, "VmHWM")),
            threads: rig::status_kib(pid, "Threads") as f64,
            anon: rig::mib(rig::status_kib(pid, "RssAnon")),
        };
        println!("{}: {idle:?}; requests until Connected: {:?}", build.key(), requests.map(|r| r.by_call));
        measured.push(idle);
        drop(manager);
    }
    drop(run);
    rig::remove_all(&client, &namespace, "CSIAddonsNode").await;
    let [ours, up] = &measured[..] else {
        return;
    };
    let rows = [
        row("seconds until every node Connected", ours.seconds, up.seconds),
        row("  manager CPU seconds by then", ours.cpu, up.cpu),
        row("  manager API requests by then", ours.requests, up.requests),
        row("  API server and etcd CPU seconds by then", ours.server_cpu, up.server_cpu),
        row("manager RSS idle 150 s afterwards (MiB)", ours.rss, up.rss),
        row("  of which heap and stacks (RssAnon)", ours.anon, up.anon),
        row("manager peak RSS (MiB)", ours.peak, up.peak),
        row("manager threads", ours.threads, up.threads),
    ];
    let figures = table(&format!("manager idle with {n} CSIAddonsNodes"), &rows);
    // The default size keeps its file's name; another size gets a file of its own.
    let file = if n == 1000 { "idle-nodes".to_owned() } else { format!("idle-nodes-{n}") };
    write_json(&file, json!({"nodes": n, "run": provenance(), "figures": figures}));
    growth();
}

/// Every size measured so far, from the results folder: (nodes, its figures), smallest first.
fn measured_sizes() -> Vec<(f64, serde_json::Value)> {
    let mut sizes: Vec<(f64, serde_json::Value)> = std::fs::read_dir(results_dir())
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("idle-nodes"))
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| serde_json::from_slice::<serde_json::Value>(&std::fs::read(e.path()).ok()?).ok())
        // Only sizes that say which commit they came from: files before that measured another shape
        // (one sidecar Pod for every node) and must not be set against these.
        .filter(|v| v["run"].is_object())
        .filter_map(|v| Some((v["nodes"].as_f64()?, v["figures"].clone())))
        .collect();
    sizes.sort_by(|a, b| a.0.total_cmp(&b.0));
    sizes
}

/// What grows with the nodes, per manager: at each size the requests per node, and between
/// consecutive sizes what one more node adds to the peak RSS, the idle RSS and the requests (the
/// fixed cost left out); peak RSS against nodes plotted (`idle-rss-by-nodes.png`).
fn growth() {
    let sizes = measured_sizes();
    println!("\ncost that grows with the nodes (per node; between sizes, what each node more adds):");
    let figure = |f: &serde_json::Value, what: &str, who: &str| f[what][who].as_f64().unwrap_or(f64::NAN);
    let mut plotted = Vec::new();
    for who in ["ours", "upstream"] {
        for (n, f) in &sizes {
            let requests = figure(f, "  manager API requests by then", who);
            println!(
                "  {who:8} {n:>6} nodes: peak {:6.1} MiB, {:.2} requests per node until Connected",
                figure(f, "manager peak RSS (MiB)", who),
                requests / n
            );
        }
        for pair in sizes.windows(2) {
            let [(a, fa), (b, fb)] = pair else { continue };
            let per_node = |what: &str, scale: f64| (figure(fb, what, who) - figure(fa, what, who)) * scale / (b - a);
            println!(
                "  {who:8} from {a} to {b} nodes: {:.0} bytes of peak RSS, {:.0} of idle RSS and {:.2} requests per node more",
                per_node("manager peak RSS (MiB)", 1_048_576.0),
                per_node("manager RSS idle 150 s afterwards (MiB)", 1_048_576.0),
                per_node("  manager API requests by then", 1.0)
            );
        }
        plotted.push(sizes.iter().map(|(n, f)| (*n, figure(f, "manager peak RSS (MiB)", who))).collect::<Vec<_>>());
    }
    plot_rss_against(
        "idle-rss-by-nodes.png",
        "Manager peak RSS against CSIAddonsNodes, idle",
        "CSIAddonsNodes",
        &[("ours", &plotted[0]), ("upstream v0.14.0", &plotted[1])],
    );
}
