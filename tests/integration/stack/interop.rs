//! The interop pairs (`make test-interop`, ignored by a plain `cargo test`): the demo story's
//! reclaim-space, fencing and replication steps with one half upstream's v0.14.0 build, with
//! authentication on (bearer tokens over TLS, both builds' default): our manager driving upstream's
//! sidecars, and upstream's manager driving ours.
use demo::peers::Build;
use demo::stack::Options;
use demo::story;

use super::story::{check_protection_effects, options, run};
use crate::harness::support::test_peer;

/// Upstream's v0.14.0 manager, sidecar and CLI (hack/upstream-binaries.sh builds them once).
fn upstream(binary: &str) -> Build {
    Build::Upstream(test_peer("UPSTREAM_BINARIES", "upstream-binaries.sh").join(binary))
}

/// The interop steps with these builds of each half, auth on.
async fn interop(sidecar: Build, manager: Build) {
    let dir = tempfile::tempdir().unwrap();
    let options = Options { sidecar, manager, auth: true, ..options(&dir) };
    check_protection_effects(&run(dir, &options, &story::INTEROP_STEPS).await);
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
