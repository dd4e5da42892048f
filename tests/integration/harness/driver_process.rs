//! The reference driver as a real process on real Unix sockets, for every suite that needs one:
//! started on a state directory of its own, killed (and its mounts and loop devices released) on
//! drop, and restartable on the same state.
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::support::workspace_binary;

/// A running reference driver; killed on drop.
pub struct DriverProcess {
    pub child: Child,
    pub endpoint: String,
    pub addons_endpoint: String,
    pub dir: tempfile::TempDir,
    args: Vec<String>,
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        release_machine_state(self.dir.path());
    }
}

/// Unmounts everything under `dir` and detaches loop devices backed by files under it, so a test
/// that failed half-way leaves nothing behind on the machine.
pub fn release_machine_state(dir: &std::path::Path) {
    let prefix = dir.display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<&str> =
        mounts.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(&prefix)).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len())); // innermost first
    for point in points {
        let _ = Command::new("umount").arg("-l").arg(point).status();
    }
    let loops = Command::new("losetup").args(["--noheadings", "--output", "NAME,BACK-FILE"]).output();
    for line in loops.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default().lines() {
        if let Some((device, file)) = line.split_once(' ')
            && file.trim().starts_with(&prefix)
        {
            let _ = Command::new("losetup").args(["--detach", device.trim()]).status();
        }
    }
}

pub fn start_driver(extra: &[&str]) -> DriverProcess {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", dir.path().join("csi.sock").display());
    let addons_endpoint = format!("unix://{}", dir.path().join("csi-addons.sock").display());
    let mut args =
        vec!["--endpoint".to_owned(), endpoint.clone(), "--addons-endpoint".to_owned(), addons_endpoint.clone()];
    args.extend([
        "--node-id".to_owned(),
        "node-1".to_owned(),
        "--state-dir".to_owned(),
        dir.path().join("state").display().to_string(),
    ]);
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let child = spawn_driver(dir.path(), &args);
    DriverProcess { child, endpoint, addons_endpoint, dir, args }
}

/// The reference driver's binary: `REFERENCE_DRIVER` if set, else the workspace's build. The
/// benchmarks run the shipped build (`make bench` sets it): a debug build's JSON state writes would
/// bound how fast they create ten thousand volumes.
pub fn reference_driver() -> std::path::PathBuf {
    std::env::var_os("REFERENCE_DRIVER")
        .filter(|p| !p.is_empty())
        .map_or_else(|| workspace_binary("reference-driver"), std::path::PathBuf::from)
}

/// Starts the driver with `args` and waits until it has (re)created its sockets.
fn spawn_driver(dir: &std::path::Path, args: &[String]) -> Child {
    let sockets = [dir.join("csi.sock"), dir.join("csi-addons.sock")];
    for socket in &sockets {
        let _ = std::fs::remove_file(socket); // a killed driver leaves its sockets behind
    }
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("driver.log")).unwrap();
    let child = Command::new(reference_driver()).args(args).stdout(Stdio::null()).stderr(log).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sockets.iter().all(|s| s.exists()) {
        assert!(Instant::now() < deadline, "the driver did not create its sockets in {}", dir.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

impl DriverProcess {
    /// SIGKILL (no shutdown path runs), then start again on the same state and sockets.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.child = spawn_driver(self.dir.path(), &self.args);
    }

    /// SIGKILL and wait.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
