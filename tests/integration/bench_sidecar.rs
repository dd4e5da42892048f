//! Benchmark (`make bench`, ignored by `make test`): our sidecar's resident memory next to
//! upstream's v0.14.0 sidecar, in the same run, against the same reference driver: idle once
//! registered (and holding its Lease), then after serving 1,000 ControllerReclaimSpace calls.
//! Prints figures; asserts only that both sidecars worked.
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use api::csiaddons::CSIAddonsNode;
use api::proto::internal as pb;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::driver_harness::{Harness, MIB};
use crate::sidecar_harness::{Serving, SidecarProcess, Workload, free_port, plain_channel, sidecar_pod};
use crate::support::unique;

/// Calls per sidecar; `BENCH_CALLS` overrides it for a quicker run.
fn calls() -> usize {
    std::env::var("BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

/// A `/proc/<pid>/status` figure in KiB (VmRSS, RssAnon, RssFile, Threads as a count).
fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn rss_kib(pid: u32) -> u64 {
    status_field(pid, "VmRSS")
}

fn breakdown(who: &str, pid: u32) {
    println!(
        "  {who}: anonymous {:.1} MiB, file-backed {:.1} MiB, {} threads",
        status_field(pid, "RssAnon") as f64 / 1024.0,
        status_field(pid, "RssFile") as f64 / 1024.0,
        status_field(pid, "Threads")
    );
}

/// Upstream's sidecar reads only the in-cluster config: give it a private /run with a
/// ServiceAccount token, CA and namespace (build-facts.md), in its own mount namespace.
pub fn start_upstream(args: &[String], token: &str, namespace: &str, dir: &std::path::Path) -> Child {
    let cp = testenv::shared();
    std::fs::write(dir.join("token"), token).unwrap();
    std::fs::write(dir.join("namespace"), namespace).unwrap();
    std::fs::copy(cp.ca_cert_path(), dir.join("ca.crt")).unwrap();
    let port = cp.server_url().rsplit(':').next().unwrap().trim_end_matches('/').to_owned();
    let sa = "/run/secrets/kubernetes.io/serviceaccount";
    let script = format!(
        "mount -t tmpfs none /run && mkdir -p {sa} && cp {d}/token {d}/ca.crt {d}/namespace {sa}/ && exec \"$0\" \"$@\"",
        d = dir.display()
    );
    let mut command = Command::new("unshare");
    command
        .args(["-m", "sh", "-c", &script])
        .arg(crate::rig::upstream("sidecar"))
        .args(args)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", port)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("upstream.log")).unwrap());
    testenv::process::spawn(command).unwrap()
}

async fn reclaim_many(port: u16, pv: &str, calls: usize) -> usize {
    let mut client = pb::reclaim_space_client::ReclaimSpaceClient::new(plain_channel(port).await.unwrap());
    let mut ok = 0;
    for _ in 0..calls {
        if client.controller_reclaim_space(pb::ReclaimSpaceRequest { pv_name: pv.into() }).await.is_ok() {
            ok += 1;
        }
    }
    ok
}

#[tokio::test]
#[ignore = "benchmark: make bench"]
async fn bench_sidecar_rss_next_to_upstream() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let driver = Harness::start().await;
    let handle = driver.create("bench-volume", 16 * MIB).await;
    let pv_name = unique("bench-pv");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "reference.csi-addons-rs.io", "volumeHandle": handle}}
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();

    // Upstream: its own namespace, a ServiceAccount bound to cluster-admin (its token is its only
    // credential), a DaemonSet-owned Pod.
    let up_ns = cp.namespace(&client, "bench-upstream").await.unwrap();
    let up_pod = sidecar_pod(&client, &up_ns, "bench-node-up", Workload::DaemonSet, "csi-plugin").await;
    let token = cp.token(&client, &up_ns, "csi-addons-sidecar").await.unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": unique("bench-upstream-sidecar")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "csi-addons-sidecar", "namespace": up_ns}]
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
    let up_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = start_upstream(
        &[
            format!("-csi-addons-address={}", driver.driver.addons_endpoint),
            "-node-id=bench-node-up".into(),
            format!("-controller-port={up_port}"),
            "-controller-ip=127.0.0.1".into(),
            format!("-pod={}", up_pod.name),
            format!("-namespace={up_ns}"),
            format!("-pod-uid={}", up_pod.uid),
            "-enable-auth=false".into(),
        ],
        &token,
        &up_ns,
        dir.path(),
    );
    let up_node = format!("bench-node-up-{up_ns}-daemonset-csi-plugin");
    let nodes = Api::<CSIAddonsNode>::namespaced(client.clone(), &up_ns);
    let mut registered = false;
    for _ in 0..300 {
        if nodes.get_opt(&up_node).await.unwrap().is_some() {
            registered = true;
            break;
        }
        assert!(upstream.try_wait().unwrap().is_none(), "upstream's sidecar exited: {}", upstream_log(dir.path()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(registered, "upstream's sidecar did not register: {}", upstream_log(dir.path()));

    // Ours: the same driver, flags and workload, in another namespace.
    let our_ns = cp.namespace(&client, "bench-ours").await.unwrap();
    let our_pod = sidecar_pod(&client, &our_ns, "bench-node-ours", Workload::DaemonSet, "csi-plugin").await;
    let ours = SidecarProcess::start(&our_pod, "bench-node-ours", &driver.driver.addons_endpoint, Serving::Plain, &[]);
    ours.wait_ready().await;
    ours.wait_leader(true).await;

    tokio::time::sleep(Duration::from_secs(10)).await;
    let (up_idle, our_idle) = (rss_kib(upstream.id()), rss_kib(ours.pid()));
    let calls = calls();
    let up_ok = reclaim_many(up_port, &pv_name, calls).await;
    let our_ok = reclaim_many(ours.port, &pv_name, calls).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (up_busy, our_busy) = (rss_kib(upstream.id()), rss_kib(ours.pid()));

    let mib = |kib: u64| kib as f64 / 1024.0;
    let figures = crate::bench_report::table(
        "sidecar RSS (MiB), the same reference driver",
        &[
            crate::bench_report::row("idle, registered, leader", mib(our_idle), mib(up_idle)),
            crate::bench_report::row(&format!("after {calls} reclaim calls"), mib(our_busy), mib(up_busy)),
        ],
    );
    crate::bench_report::write_json("sidecar-rss", json!({"calls": calls, "figures": figures}));
    println!("successful calls: upstream {up_ok}/{calls}, ours {our_ok}/{calls}");
    breakdown("upstream", upstream.id());
    breakdown("ours", ours.pid());
    testenv::process::stop(&mut upstream, Duration::from_secs(5));
    assert_eq!((up_ok, our_ok), (calls, calls), "upstream log: {}", upstream_log(dir.path()));
}

fn upstream_log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("upstream.log")).unwrap_or_default()
}
