//! Loop devices, filesystems and mounts: the node side's real effects. Commands (`losetup`,
//! `mkfs.ext4`, `blkid`) do what has no safe syscall wrapper; mounts use the syscalls directly.
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MntFlags, MsFlags};

/// Why a node operation on the machine failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("loop devices are not available on this machine ({0} is missing)")]
    LoopUnavailable(&'static str),
    #[error("{command} failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{action} {path}: {source}")]
    Sys {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn run(program: &str, args: &[&str]) -> Result<String, MountError> {
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| MountError::Command { command: command.clone(), detail: e.to_string() })?;
    if !out.status.success() {
        let detail = format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        return Err(MountError::Command { command, detail });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Why loop-backed filesystem volumes cannot work here, or `None` when they can: they need root,
/// `/dev/loop-control` and `mkfs.ext4`.
pub fn loop_unavailable_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing".into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/sbin".into(), "/usr/sbin".into()]);
    if !dirs.into_iter().any(|d: PathBuf| d.join("mkfs.ext4").is_file()) {
        return Some("mkfs.ext4 is not installed".into());
    }
    None
}

/// Loop devices currently backed by `file`.
pub fn loop_devices_of(file: &Path) -> Result<Vec<String>, MountError> {
    let listing = run("losetup", &["--noheadings", "--output", "NAME", "--associated", &file.to_string_lossy()])?;
    Ok(listing.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect())
}

/// The loop device backing `file`, attaching one if there is none. Idempotent.
pub fn attach(file: &Path) -> Result<String, MountError> {
    const LOOP_CONTROL: &str = "/dev/loop-control";
    if !Path::new(LOOP_CONTROL).exists() {
        return Err(MountError::LoopUnavailable(LOOP_CONTROL));
    }
    if let Some(existing) = loop_devices_of(file)?.into_iter().next() {
        return Ok(existing);
    }
    run("losetup", &["--find", "--show", &file.to_string_lossy()])
}

/// Makes loop devices backed by `file` see its current size (after it grew).
pub fn refresh_size(file: &Path) -> Result<(), MountError> {
    for device in loop_devices_of(file)? {
        run("losetup", &["--set-capacity", &device])?;
    }
    Ok(())
}

/// Grows the mounted ext4 filesystem on `device` to fill it. Some kernels refuse online resizing
/// (EPERM); the caller reports that, and the filesystem grows at the next stage instead.
pub fn grow_filesystem_online(device: &str) -> Result<(), MountError> {
    run("resize2fs", &[device]).map(|_| ())
}

/// Grows the unmounted ext4 filesystem on `device` to fill it (a no-op when it already does).
/// resize2fs insists on a freshly checked filesystem, so check it first.
pub fn grow_filesystem_offline(device: &str) -> Result<(), MountError> {
    let check = Command::new("e2fsck").args(["-f", "-p", device]).output();
    // e2fsck: 0 = clean, 1 = errors corrected; anything else means the filesystem needs a person.
    match check {
        Ok(o) if matches!(o.status.code(), Some(0 | 1)) => {}
        Ok(o) => {
            return Err(MountError::Command {
                command: format!("e2fsck -f -p {device}"),
                detail: format!("{}: {}", o.status, String::from_utf8_lossy(&o.stdout).trim()),
            });
        }
        Err(e) => return Err(MountError::Command { command: "e2fsck".into(), detail: e.to_string() }),
    }
    run("resize2fs", &[device]).map(|_| ())
}

/// Detaches every loop device backed by `file`. Idempotent.
pub fn detach(file: &Path) -> Result<(), MountError> {
    for device in loop_devices_of(file)? {
        run("losetup", &["--detach", &device])?;
    }
    Ok(())
}

/// Formats `device` as ext4 unless it already holds a filesystem (data is never overwritten).
pub fn format_if_blank(device: &str) -> Result<(), MountError> {
    if !has_filesystem(device) {
        run("mkfs.ext4", &["-q", "-F", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", device])?;
    }
    Ok(())
}

/// Whether something is mounted at `path`, from /proc/self/mountinfo.
pub fn is_mount_point(path: &Path) -> Result<bool, MountError> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| MountError::Io {
        action: "reading",
        path: "/proc/self/mountinfo".into(),
        source,
    })?;
    let wanted = path.to_string_lossy();
    Ok(info.lines().filter_map(|l| l.split(' ').nth(4)).any(|mount_point| unescape(mount_point) == wanted))
}

/// A mount point where `device` is mounted, if any (the staging mount or a bind of it).
pub fn mount_point_of(device: &str) -> Result<Option<PathBuf>, MountError> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| MountError::Io {
        action: "reading",
        path: "/proc/self/mountinfo".into(),
        source,
    })?;
    for line in info.lines() {
        // "<id> <parent> <maj:min> <root> <mount point> <options> [optional…] - <fstype> <source> <super options>"
        let Some((before, after)) = line.split_once(" - ") else { continue };
        if after.split(' ').nth(1) == Some(device)
            && let Some(mount_point) = before.split(' ').nth(4)
        {
            return Ok(Some(PathBuf::from(unescape(mount_point))));
        }
    }
    Ok(None)
}

/// Whether `device` holds a filesystem.
pub fn has_filesystem(device: &str) -> bool {
    // blkid exits 2 when it finds no filesystem signature.
    let probe = Command::new("blkid").args(["-p", "-o", "value", "-s", "TYPE", device]).output();
    probe.is_ok_and(|o| o.status.success() && !o.stdout.trim_ascii().is_empty())
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            out.push((bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mounts the ext4 filesystem on `device` at `target` (a directory, created if missing).
pub fn mount_filesystem(device: &str, target: &Path) -> Result<(), MountError> {
    std::fs::create_dir_all(target).map_err(|source| MountError::Io {
        action: "creating",
        path: target.to_owned(),
        source,
    })?;
    nix::mount::mount(Some(device), target, Some("ext4"), MsFlags::empty(), None::<&str>)
        .map_err(|source| MountError::Sys { action: "mounting", path: target.to_owned(), source })
}

/// Bind-mounts `source` at `target` (which must exist), read-only if asked.
pub fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
    nix::mount::mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| MountError::Sys { action: "bind-mounting", path: target.to_owned(), source: e })?;
    if read_only {
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        nix::mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(|e| MountError::Sys {
            action: "remounting read-only",
            path: target.to_owned(),
            source: e,
        })?;
    }
    Ok(())
}

/// Unmounts whatever is mounted at `target`, if anything. Idempotent.
pub fn unmount(target: &Path) -> Result<(), MountError> {
    while is_mount_point(target)? {
        nix::mount::umount2(target, MntFlags::empty()).map_err(|source| MountError::Sys {
            action: "unmounting",
            path: target.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// Total and available bytes and inodes of the filesystem at `path`.
pub struct Usage {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

pub fn usage(path: &Path) -> Result<Usage, MountError> {
    let stat = nix::sys::statvfs::statvfs(path).map_err(|source| MountError::Sys {
        action: "statvfs",
        path: path.to_owned(),
        source,
    })?;
    let fragment = stat.fragment_size();
    Ok(Usage {
        total_bytes: stat.blocks() * fragment,
        available_bytes: stat.blocks_available() * fragment,
        total_inodes: stat.files(),
        free_inodes: stat.files_free(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(super::unescape(r"/var/lib/with\040space"), "/var/lib/with space");
        assert_eq!(super::unescape("/plain"), "/plain");
        assert_eq!(super::unescape(r"/trailing\04"), r"/trailing\04");
    }
}
