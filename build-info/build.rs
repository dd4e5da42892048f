//! Records the git commit the binaries are built from. Kept in its own tiny crate so that a new
//! commit recompiles only this crate, not the generated protocol code.
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=GIT_COMMIT");
    let commit = std::env::var("GIT_COMMIT").ok().filter(|c| !c.is_empty()).or_else(git_commit);
    println!("cargo:rustc-env=CSI_ADDONS_GIT_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
}

fn git_commit() -> Option<String> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let git_dir = run(&manifest_dir, &["rev-parse", "--absolute-git-dir"])?;
    // Rebuild when HEAD moves: HEAD itself, the branch it points to, and packed refs.
    let git_dir = Path::new(&git_dir);
    println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
    println!("cargo:rerun-if-changed={}", git_dir.join("packed-refs").display());
    if let Some(reference) = run(&manifest_dir, &["symbolic-ref", "-q", "HEAD"]) {
        println!("cargo:rerun-if-changed={}", git_dir.join(reference).display());
    }
    run(&manifest_dir, &["rev-parse", "--short=12", "HEAD"])
}

fn run(dir: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("git").current_dir(dir).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
