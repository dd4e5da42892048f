//! The interop pairs (`make test-interop`, ignored by a plain `cargo test`): the demo story's
//! reclaim-space, fencing and replication steps with one half upstream's v0.14.0 build, with
//! authentication on (bearer tokens over TLS, both builds' default): our manager driving upstream's
//! sidecars, and upstream's manager driving ours. Each pair also shows the TLS key exchange group
//! its connections negotiated, read off the wire, and must agree on the post-quantum hybrid
//! X25519MLKEM768, as two of upstream's own halves do (Go 1.24 and later prefer it): upstream's
//! own pair and ours run too, as the measure.
use std::collections::{BTreeMap, BTreeSet};

use api::csiaddons::CSIAddonsNode;
use demo::peers::Build;
use demo::stack::Options;
use demo::story;
use kube::api::{Api, ListParams};

use super::story::{check_protection_effects, options, run_on, start};
use crate::harness::support::test_peer;
use crate::harness::tls_capture::{LoopbackCapture, groups_by_port};

/// Upstream's v0.14.0 manager, sidecar and CLI (hack/upstream-binaries.sh builds them once).
fn upstream(binary: &str) -> Build {
    Build::Upstream(test_peer("UPSTREAM_BINARIES", "upstream-binaries.sh").join(binary))
}

/// The interop steps with these builds of each half, auth on; then the groups each TLS server on
/// loopback chose, printed, and the sidecars' checked.
async fn interop(sidecar: Build, manager: Build) {
    let pair = format!("manager {} to sidecars {}", manager.label(), sidecar.label());
    assert_own_network_namespace();
    let capture = LoopbackCapture::start().expect("capturing loopback (needs CAP_NET_RAW)");
    let dir = tempfile::tempdir().unwrap();
    let options = Options { sidecar, manager, auth: true, ..options(&dir) };
    let stack = start(&options).await;
    let sidecar_ports = sidecar_ports(&stack.client).await;
    let api_port: u16 =
        stack.control_plane.server_url().trim_end_matches('/').rsplit(':').next().unwrap().parse().unwrap();
    check_protection_effects(&run_on(stack, dir, &story::INTEROP_STEPS).await);

    let chosen = groups_by_port(&capture.stop());
    for (port, groups) in &chosen {
        let server = if sidecar_ports.contains(port) {
            "sidecar"
        } else if *port == api_port {
            "kube-apiserver"
        } else {
            "other"
        };
        eprintln!("interop: {pair}: TLS server {server} on port {port} chose {groups:?}");
    }
    for port in &sidecar_ports {
        let groups =
            chosen.get(port).unwrap_or_else(|| panic!("{pair}: no TLS handshake with the sidecar on port {port}"));
        let only_hybrid = BTreeMap::from([("X25519MLKEM768".to_owned(), groups.values().sum())]);
        assert_eq!(groups, &only_hybrid, "{pair}: the sidecar on port {port}");
    }
}

/// The ports of the sidecars' CSIAddonsNode endpoints (`pod://…:port` or `ip:port`).
async fn sidecar_ports(client: &kube::Client) -> BTreeSet<u16> {
    let nodes: Api<CSIAddonsNode> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await.unwrap();
    let ports: BTreeSet<u16> =
        list.items.iter().map(|node| node.spec.driver.endpoint.rsplit(':').next().unwrap().parse().unwrap()).collect();
    assert_eq!(ports.len(), 2, "a sidecar next to each plugin: {:?}", list.items);
    ports
}

/// The capture reads every packet of `lo`: only where that interface is the suite's own, as
/// `make test-interop` arranges (a new network namespace has `lo` and nothing else).
fn assert_own_network_namespace() {
    let devices = std::fs::read_to_string("/proc/self/net/dev").unwrap();
    let names: Vec<&str> = devices.lines().skip(2).filter_map(|l| l.split(':').next()).map(str::trim).collect();
    assert_eq!(names, ["lo"], "the interop suite runs in a network namespace of its own: `make test-interop`");
}

#[tokio::test]
#[ignore = "interop with upstream's v0.14.0 build: `make test-interop`"]
async fn interop_our_manager_drives_upstreams_sidecars() {
    interop(upstream("sidecar"), Build::Ours).await;
}

#[tokio::test]
#[ignore = "interop with upstream's v0.14.0 build: `make test-interop`"]
async fn interop_upstreams_manager_drives_our_sidecars() {
    interop(Build::Ours, upstream("manager")).await;
}

#[tokio::test]
#[ignore = "interop with upstream's v0.14.0 build: `make test-interop`"]
async fn interop_upstreams_manager_drives_upstreams_sidecars() {
    interop(upstream("sidecar"), upstream("manager")).await;
}

#[tokio::test]
#[ignore = "interop with upstream's v0.14.0 build: `make test-interop`"]
async fn interop_our_manager_drives_our_sidecars() {
    interop(Build::Ours, Build::Ours).await;
}
