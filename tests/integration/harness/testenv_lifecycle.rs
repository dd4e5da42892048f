//! The control plane never outlives its test binary, even one killed with SIGKILL.
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Not a test of its own: run by `control_plane_processes_die_with_a_killed_test_binary` in a
/// child process, it starts a private control plane, prints its pids and waits to be killed.
#[test]
#[ignore = "helper: started by control_plane_processes_die_with_a_killed_test_binary"]
fn helper_start_control_plane_and_wait() {
    if std::env::var_os("TESTENV_LIFECYCLE_HELPER").is_none() {
        return;
    }
    let cp = testenv::ControlPlane::start().unwrap();
    let pids: Vec<String> = cp.pids().iter().map(u32::to_string).collect();
    println!("PIDS {}", pids.join(" "));
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn control_plane_processes_die_with_a_killed_test_binary() {
    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "harness::testenv_lifecycle::helper_start_control_plane_and_wait",
            "--ignored",
            "--nocapture",
        ])
        .env("TESTENV_LIFECYCLE_HELPER", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = helper.stdout.take().unwrap();
    let pids: Vec<u32> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("PIDS ").map(|p| p.split(' ').map(|n| n.parse().unwrap()).collect()))
        .expect("the helper printed no pids (did its control plane start?)");
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver");
    for pid in &pids {
        assert!(Path::new(&format!("/proc/{pid}")).exists(), "{pid} is not running before the kill");
    }

    helper.kill().unwrap(); // SIGKILL: no destructor, no atexit hook runs.
    helper.wait().unwrap();
    // Its directory stays until the next start sweeps it; sweep it now, not to leave it behind.
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("csi-addons-testenv-{}-0", helper.id())));

    let deadline = Instant::now() + Duration::from_secs(30);
    let alive = |pid: &u32| {
        // A zombie is dead too: its parent (the helper) is gone and init reaps it.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    while pids.iter().any(alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let survivors: Vec<&u32> = pids.iter().filter(|p| alive(p)).collect();
    assert!(survivors.is_empty(), "processes outlived the killed test binary: {survivors:?}");
}
