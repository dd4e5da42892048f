//! Leftovers of an interrupted run: mounts under the demo's directory (the reference driver's
//! loop-backed volumes and the kubelet paths the story mounted) are detached before the directory
//! is removed, so a second `make demo` needs no manual clean-up.
use std::path::Path;

/// Mount points at or under `dir`, deepest first (from /proc/self/mountinfo).
fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.display().to_string();
    let mut found: Vec<String> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        // mountinfo escapes spaces and the like as octal; the demo's paths have none.
        .filter(|point| *point == prefix || point.starts_with(&format!("{prefix}/")))
        .map(str::to_owned)
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.len()));
    found.dedup();
    found
}

/// Detaches every mount under `dir` and removes it.
pub fn remove_demo_dir(dir: &Path) -> crate::Result<()> {
    unmount_under(dir);
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(crate::Error::Io { what: format!("removing {}", dir.display()), source: e }),
    }
}

/// Detaches every mount under `dir`. Loop devices set up with autoclear go with their last mount.
pub fn unmount_under(dir: &Path) {
    for point in mounts_under(dir) {
        let Ok(path) = std::ffi::CString::new(point.clone()) else { continue };
        // SAFETY: umount2 with a valid NUL-terminated path; MNT_DETACH never blocks on busy mounts.
        let rc = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            eprintln!("demo: could not unmount {point}: {}", std::io::Error::last_os_error());
        }
    }
}
