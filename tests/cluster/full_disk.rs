//! The reference driver's state directory full, as a node's data disk fills up: a ballast file takes
//! every free block of the filesystem that `hack/cluster.sh` mounts there (never the host's own disk),
//! and goes again after a while. Meanwhile the driver's errors must reach the statuses as a message
//! that says what to do, and its state must stay whole: no torn or leftover file.
use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::core::DynamicObject;
use nix::fcntl::{FallocateFlags, fallocate};

use crate::cluster::DRIVER_STATE_DIR;

/// How long the disk stays full.
pub const FULL: Duration = Duration::from_secs(45);
/// The words of the driver's RESOURCE_EXHAUSTED messages that say what to do.
const ADVICE: &str = "free space";

/// A file holding every free block of the driver's disk until dropped.
pub struct Ballast {
    path: PathBuf,
}

impl Drop for Ballast {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Fills the driver's disk; asserts that a small write there then fails for want of space.
pub fn fill() -> Ballast {
    let dir = Path::new(DRIVER_STATE_DIR);
    let ballast = Ballast { path: dir.join("ballast") };
    let file = File::create(&ballast.path).expect("a ballast file on the driver's disk");
    // Reserved blocks (fallocate writes no data, so the host's disk does not fill): in halving
    // chunks until not even a block is left.
    let (mut offset, mut chunk) = (0i64, 1i64 << 30);
    while chunk >= 4096 {
        match fallocate(&file, FallocateFlags::empty(), offset, chunk) {
            Ok(()) => offset += chunk,
            Err(nix::Error::ENOSPC) => chunk /= 2,
            Err(e) => panic!("fallocate {}: {e}", ballast.path.display()),
        }
    }
    let probe = dir.join("probe");
    let written = std::fs::write(&probe, [7u8; 4096]).and_then(|()| File::open(&probe)?.sync_all());
    let _ = std::fs::remove_file(&probe);
    match written {
        Err(e) if e.kind() == ErrorKind::StorageFull => {}
        other => panic!("{DRIVER_STATE_DIR} is full after {offset} bytes of ballast, so a write fails: {other:?}"),
    }
    println!("state directory full: {} MiB of ballast in {DRIVER_STATE_DIR}", offset >> 20);
    ballast
}

/// The status message, or a condition's, of `object` that carries the driver's advice.
fn advice(object: &DynamicObject) -> Option<String> {
    let status = object.data.get("status")?;
    let own = status.get("message").into_iter();
    let conditions = status.get("conditions").and_then(|c| c.as_array()).into_iter().flatten();
    own.chain(conditions.filter_map(|c| c.get("message")))
        .filter_map(|m| m.as_str())
        .find(|m| m.contains(ADVICE))
        .map(str::to_owned)
}

/// Keeps the disk full for [`FULL`] (`ballast` filled it, `None`: fills it now), then frees it.
/// Asserts that the replication `replication`, whose change the driver could not save, said the
/// disk is full, and that the driver's state file is whole with no temporary file left. The batch's
/// jobs need no space (reclaiming frees it: the volumes, never formatted, have their zeroed ranges
/// punched out), so they are not watched here; the fault table shows how they ended.
pub async fn hold(ballast: Option<Ballast>, replications: &Api<DynamicObject>, replication: &str) {
    let ballast = ballast.unwrap_or_else(fill);
    let full = Instant::now();
    let mut said = None;
    while full.elapsed() < FULL {
        if said.is_none()
            && let Ok(object) = replications.get(replication).await
        {
            said = advice(&object);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(ballast);
    let said = said.expect("the replication's status says the driver's disk is full");
    println!("state directory full: the replication said: {said}");
    let dir = Path::new(DRIVER_STATE_DIR);
    let state = std::fs::read(dir.join("state.json")).expect("the driver's state file is there");
    serde_json::from_slice::<serde_json::Value>(&state).expect("the driver's state file is whole JSON");
    // A save in progress has one for a moment; a failed one must not leave it.
    let tmp = dir.join("state.json.tmp");
    let gone = testenv::poll::until(Duration::from_secs(10), async || (!tmp.exists()).then_some(())).await;
    assert!(gone.is_some(), "no temporary state file is left behind");
}
