//! Child processes that never outlive the test binary.
//!
//! Every process is spawned from one thread that lives as long as the test binary, with
//! `PR_SET_PDEATHSIG`: when the binary ends in any way (done, panic, SIGINT, SIGKILL) the kernel
//! kills the children. On a normal exit an `atexit` hook also stops them gracefully and removes the
//! control plane's directory.
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, OnceLock};

type SpawnRequest = (Command, Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = channel::<SpawnRequest>();
        // The thread ends only with the process: the sender lives in a static.
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(|e| eprintln!("testenv: cannot start the spawner thread: {e}"));
        Mutex::new(tx)
    })
}

/// Spawns `command` so that it dies with this process.
pub fn spawn(mut command: Command) -> std::io::Result<Child> {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = channel();
    spawner()
        .lock()
        .map_err(|_| std::io::Error::other("spawner lock poisoned"))?
        .send((command, tx))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    rx.recv().map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// Stops a child: SIGTERM, up to `grace` to exit, then SIGKILL.
pub fn stop(child: &mut Child, grace: std::time::Duration) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: plain kill(2) on our own child's pid, which we have not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `hook` when the process exits normally (the test harness ends with `exit`). Only the first
/// hook registered is kept: the shared control plane is the only user.
pub fn at_exit(hook: fn()) {
    static HOOK: OnceLock<fn()> = OnceLock::new();
    extern "C" fn run_hook() {
        if let Some(hook) = HOOK.get() {
            hook();
        }
    }
    if HOOK.set(hook).is_ok() {
        // SAFETY: registers a plain extern "C" fn that captures nothing.
        unsafe { libc::atexit(run_hook) };
    }
}

/// Spawns `command` as [`spawn`] does, its stdout and stderr appended to `log`.
pub fn spawn_logged(mut command: Command, log: &std::path::Path) -> std::io::Result<Child> {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    let err = out.try_clone()?;
    command.stdin(std::process::Stdio::null()).stdout(out).stderr(err);
    spawn(command)
}

/// The last `lines` lines of the file at `path` (empty when it cannot be read).
pub fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sends `signal` (as `kill` names it: `-STOP`, `-CONT`, `-9`) to process `pid`.
pub fn signal(signal: &str, pid: u32) {
    let sent = Command::new("kill").args([signal, &pid.to_string()]).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill {signal} {pid}");
}

/// The processes of this machine, in any container, whose arguments satisfy `matches`, by PID.
/// Processes that end while they are read are skipped, and so is a match whose parent matches
/// too: a process that starts a command (the reference driver runs `losetup`) has a child that
/// carries the parent's arguments until it execs, which is not a second copy of the program.
pub fn pids_where(matches: impl Fn(&[String]) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> =
            raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if matches(&args) {
            found.push((pid, parent_of(pid)));
        }
    }
    let matched: Vec<u32> = found.iter().map(|(pid, _)| *pid).collect();
    found.into_iter().filter(|(_, parent)| parent.is_none_or(|p| !matched.contains(&p))).map(|(pid, _)| pid).collect()
}

/// The parent's PID, from `/proc/PID/status`; `None` once the process has ended.
fn parent_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok())
}

/// The reference driver's `method` calls in its log's text (one line each, naming `volume=<id>`),
/// by volume id; colour codes are ignored.
pub fn calls_per_volume(log: &str, method: &str) -> std::collections::BTreeMap<String, usize> {
    let mut calls = std::collections::BTreeMap::new();
    for line in log.lines().map(strip_ansi).filter(|l| l.contains(method)) {
        if let Some(volume) = line.split_whitespace().find_map(|w| w.strip_prefix("volume=")) {
            *calls.entry(volume.to_owned()).or_default() += 1;
        }
    }
    calls
}

/// `line` without terminal colour codes (ESC '[' … 'm').
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell's subshell is a fork that keeps the shell's arguments while its command runs: the
    /// shell is found, the fork is not.
    #[test]
    fn a_forked_child_with_its_parents_arguments_is_not_a_second_process() {
        let marker = format!("pids-where-{}", std::process::id());
        let mut shell =
            Command::new("sh").args(["-c", "(sleep 30; true); true", &marker]).process_group(0).spawn().unwrap();
        let matches = |args: &[String]| args.contains(&marker);
        let mut forks = 0;
        for _ in 0..100 {
            forks = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline"))
                        .is_ok_and(|c| c.windows(marker.len()).any(|w| w == marker.as_bytes()))
                })
                .count();
            if forks == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let found = pids_where(matches);
        // The whole group, so that the subshell and its sleep go too.
        let group = format!("-{}", shell.id());
        assert!(Command::new("kill").args(["-KILL", "--", &group]).status().unwrap().success());
        shell.wait().unwrap();
        assert_eq!(forks, 2, "the shell and its subshell carry the marker");
        assert_eq!(found, vec![shell.id()]);
    }
}
