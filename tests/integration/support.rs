//! Helpers shared by the suites: dynamic access to our kinds by name (from testenv), test peers, names.

pub use testenv::kinds::{api_resource, dynamic_api, is_namespaced, object};

/// A name no other test uses, for cluster-scoped objects in the shared control plane.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The message of an API call that failed with 422 Invalid, or what happened instead.
pub fn invalid_message<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Result<String, String> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 => Ok(status.message),
        other => Err(format!("expected 422 Invalid, got {other:?}")),
    }
}

/// A binary of this workspace (built by `make test` before the suites run), next to this test
/// binary's `deps/` directory.
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(std::path::Path::parent).unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo build --workspace --bins`, as `make test` does)",
        path.display()
    );
    path
}

/// A Go-built test peer: `$ENV` if set, else what `hack/<script>` builds and prints.
pub fn test_peer(env: &str, script: &str) -> std::path::PathBuf {
    test_peer_with(env, script, &[])
}

/// As [`test_peer`], `hack/<script>` given `args`.
pub fn test_peer_with(env: &str, script: &str, args: &[&str]) -> std::path::PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return path.into();
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack").join(script);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{} {args:?} failed", script.display());
    String::from_utf8(out.stdout).unwrap().trim().into()
}

/// A gRPC channel over the Unix socket of `endpoint` (`unix:///path`); tonic dials `unix:` URIs.
pub async fn unix_channel(endpoint: &str) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(endpoint.to_owned())?.connect().await
}
