//! What the test binaries share: where the repository is, and the Go-built test peers. The suites
//! themselves are the binaries: `integration/` (one control plane for all its suites), `checks/`
//! (repository checks that need no control plane) and `cluster/` (the product in real Pods).
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A Go-built test peer: `$ENV` if set, else what `hack/<script>` builds and prints.
pub fn test_peer(env: &str, script: &str) -> PathBuf {
    test_peer_with(env, script, &[])
}

/// As [`test_peer`], `hack/<script>` given `args`.
pub fn test_peer_with(env: &str, script: &str, args: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return path.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack").join(script);
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(out.status.success(), "{} {args:?} failed", script.display());
    String::from_utf8_lossy(&out.stdout).trim().into()
}
