//! Benchmark (`make bench`, ignored by `make test`): our sidecar's resident memory next to
//! upstream's v0.14.0 sidecar, in the same run, against the same reference driver: idle once
//! registered (ours also holding its Lease), then after serving 1,000 ControllerReclaimSpace calls.
//! Prints figures; asserts only that both sidecars worked.
use std::time::Duration;

use api::proto::internal as pb;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::benches::report::{row, table, write_json};
use crate::harness::driver::{Harness, MIB};
use crate::harness::rig::{self, Build, SidecarRun};
use crate::harness::sidecar::plain_channel;
use crate::harness::support::unique;

/// Calls per sidecar; `BENCH_CALLS` overrides it for a quicker run.
fn calls() -> usize {
    std::env::var("BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

fn rss_mib(pid: u32) -> f64 {
    rig::mib(rig::status_kib(pid, "VmRSS"))
}

fn breakdown(who: &str, pid: u32) {
    println!(
        "  {who}: anonymous {:.1} MiB, file-backed {:.1} MiB, {} threads",
        rig::mib(rig::status_kib(pid, "RssAnon")),
        rig::mib(rig::status_kib(pid, "RssFile")),
        rig::status_kib(pid, "Threads")
    );
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

    // Each in a namespace of its own, for a DaemonSet's Pod, against the same driver.
    let mut sidecars = Vec::new();
    for build in [Build::Upstream, Build::Ours] {
        let namespace = cp.namespace(&client, &format!("bench-{}", build.key())).await.unwrap();
        let endpoint = &driver.driver.addons_endpoint;
        sidecars.push(SidecarRun::start(build, &client, &namespace, "bench-node", endpoint).await);
    }
    let [upstream, ours] = &sidecars[..] else { unreachable!("two builds started") };

    tokio::time::sleep(Duration::from_secs(10)).await;
    let (up_idle, our_idle) = (rss_mib(upstream.pid()), rss_mib(ours.pid()));
    let calls = calls();
    let up_ok = reclaim_many(upstream.port(), &pv_name, calls).await;
    let our_ok = reclaim_many(ours.port(), &pv_name, calls).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (up_busy, our_busy) = (rss_mib(upstream.pid()), rss_mib(ours.pid()));

    let figures = table(
        "sidecar RSS (MiB), the same reference driver",
        &[
            row("idle, registered, leader", our_idle, up_idle),
            row(&format!("after {calls} reclaim calls"), our_busy, up_busy),
        ],
    );
    write_json("sidecar-rss", json!({"calls": calls, "figures": figures}));
    println!("successful calls: upstream {up_ok}/{calls}, ours {our_ok}/{calls}");
    breakdown("upstream", upstream.pid());
    breakdown("ours", ours.pid());
    assert_eq!((up_ok, our_ok), (calls, calls), "upstream log: {}", upstream.log());
}
