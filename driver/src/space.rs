//! Measuring and releasing the space a volume's backing file takes on the host.
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::fcntl::FallocateFlags;
use nix::unistd::Whence;

use crate::mounts::MountError;

/// Bytes the host has allocated to `file` (what reclaiming space lowers); for a directory
/// volume, to everything under it.
pub fn allocated_bytes(file: &Path) -> std::io::Result<i64> {
    Ok(i64::try_from(allocated_blocks(file)?.saturating_mul(512)).unwrap_or(i64::MAX))
}

fn allocated_blocks(path: &Path) -> std::io::Result<u64> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return Ok(meta.blocks());
    }
    let mut blocks = 0u64;
    for entry in std::fs::read_dir(path)? {
        blocks = blocks.saturating_add(allocated_blocks(&entry?.path())?);
    }
    Ok(blocks)
}

/// Removes a volume's or snapshot's data, file or directory. Idempotent.
pub fn remove_data(path: &Path) -> std::io::Result<()> {
    let removed = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Copies a directory volume's tree to `to` (replaced atomically, files copied sparsely). Symlinks
/// are copied as links, never followed, so a volume cannot make the driver read outside it.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<u64> {
    fn copy_into(from: &Path, to: &Path) -> std::io::Result<u64> {
        std::fs::create_dir_all(to)?;
        let mut copied = 0;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            let (source, target) = (entry.path(), to.join(entry.file_name()));
            let kind = entry.file_type()?;
            if kind.is_dir() {
                copied += copy_into(&source, &target)?;
            } else if kind.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
            } else if kind.is_file() {
                copied += sparse_copy(&source, &target)?;
            }
        }
        Ok(copied)
    }
    let tmp = to.with_extension("partial");
    remove_data(&tmp)?;
    let copied = copy_into(from, &tmp)?;
    remove_data(to)?;
    std::fs::rename(&tmp, to)?;
    Ok(copied)
}

/// Runs fstrim on the filesystem mounted at `mount_point`: the filesystem tells the loop device
/// which blocks are free, and the loop device punches them out of the backing file.
pub fn fstrim(mount_point: &Path) -> Result<(), MountError> {
    let out = std::process::Command::new("fstrim").arg(mount_point).output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(MountError::Command {
            command: format!("fstrim {}", mount_point.display()),
            detail: format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
        }),
        Err(e) => Err(MountError::Command { command: "fstrim".into(), detail: e.to_string() }),
    }
}

const CHUNK: usize = 64 * 1024;

/// Deallocates every all-zero 64 KiB chunk of `file` that is allocated (for raw block volumes and
/// unformatted ones, where no filesystem can say what is free). The file's size and content stay
/// the same: a punched hole reads as zeros.
pub fn punch_zero_ranges(file: &Path) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(file)?;
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; CHUNK];
    let mut offset: u64 = 0;
    while offset < len {
        // Jump to the next allocated range; past the last one there is nothing to do.
        let data = match nix::unistd::lseek(&f, to_off(offset)?, Whence::SeekData) {
            Ok(pos) => u64::try_from(pos).map_err(std::io::Error::other)?,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let chunk_start = data - data % CHUNK as u64;
        let n = usize::try_from((len - chunk_start).min(CHUNK as u64)).map_err(std::io::Error::other)?;
        f.seek(SeekFrom::Start(chunk_start))?;
        f.read_exact(&mut buf[..n])?;
        if buf[..n].iter().all(|b| *b == 0) {
            let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
            nix::fcntl::fallocate(&f, flags, to_off(chunk_start)?, to_off(n as u64)?)?;
        }
        offset = chunk_start + n as u64;
    }
    f.sync_all()
}

/// Copies `from` to `to` (replaced atomically), writing only the allocated ranges so holes stay
/// holes; a directory volume is copied as a tree. Returns the bytes of data copied.
pub fn sparse_copy(from: &Path, to: &Path) -> std::io::Result<u64> {
    use std::io::Write;
    if from.is_dir() {
        return copy_tree(from, to);
    }
    let mut source = std::fs::File::open(from)?;
    let len = source.metadata()?.len();
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = to.with_extension("partial");
    let mut dest = std::fs::File::create(&tmp)?;
    dest.set_len(len)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    let mut offset = 0u64;
    while offset < len {
        let data = match nix::unistd::lseek(&source, to_off(offset)?, Whence::SeekData) {
            Ok(pos) => u64::try_from(pos).map_err(std::io::Error::other)?,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = u64::try_from(nix::unistd::lseek(&source, to_off(data)?, Whence::SeekHole)?)
            .map_err(std::io::Error::other)?;
        let mut at = data;
        source.seek(SeekFrom::Start(at))?;
        dest.seek(SeekFrom::Start(at))?;
        while at < hole {
            let n = usize::try_from((hole - at).min(buf.len() as u64)).map_err(std::io::Error::other)?;
            source.read_exact(&mut buf[..n])?;
            dest.write_all(&buf[..n])?;
            at += n as u64;
            copied += n as u64;
        }
        offset = hole;
    }
    dest.sync_all()?;
    std::fs::rename(&tmp, to)?;
    Ok(copied)
}

fn to_off(n: u64) -> std::io::Result<i64> {
    i64::try_from(n).map_err(std::io::Error::other)
}

/// Whether `error`, or an error that caused it, is a full filesystem or an exhausted quota.
pub fn is_out_of_space(error: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>().is_some_and(|io| matches!(io.kind(), StorageFull | QuotaExceeded))
            || e.downcast_ref::<nix::Error>()
                .is_some_and(|errno| matches!(errno, nix::Error::ENOSPC | nix::Error::EDQUOT))
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The status of an operation that failed on the machine: RESOURCE_EXHAUSTED when a filesystem it
/// writes to is full, saying what the user can do (the callers retry), INTERNAL otherwise.
pub fn failure_status(error: impl std::error::Error + 'static) -> tonic::Status {
    if is_out_of_space(&error) {
        tonic::Status::resource_exhausted(format!(
            "{error}: the driver's filesystem is full; free space on it, then retry"
        ))
    } else {
        tonic::Status::internal(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_full_filesystem_is_resource_exhausted_through_its_causes_and_other_errors_internal() {
        let full = MountError::Io {
            action: "creating",
            path: "/state/reclaim/v1".into(),
            source: std::io::Error::from_raw_os_error(nix::libc::ENOSPC),
        };
        assert!(is_out_of_space(&full));
        let status = failure_status(full);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().starts_with("creating /state/reclaim/v1: No space left on device"), "{status:?}");
        assert!(status.message().ends_with("free space on it, then retry"), "{status:?}");
        let quota = MountError::Sys { action: "mounting", path: "/t".into(), source: nix::Error::EDQUOT };
        assert_eq!(failure_status(quota).code(), tonic::Code::ResourceExhausted);
        let denied = std::io::Error::from_raw_os_error(nix::libc::EACCES);
        assert!(!is_out_of_space(&denied));
        assert_eq!(failure_status(denied).code(), tonic::Code::Internal);
    }

    #[test]
    fn zeroed_ranges_are_released_and_data_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vol.img");
        let mut f = std::fs::File::create(&path).unwrap();
        f.set_len(16 << 20).unwrap();
        // 4 MiB of zeros written for real (allocated), then 64 KiB of data.
        f.write_all(&vec![0u8; 4 << 20]).unwrap();
        f.write_all(&vec![7u8; 64 * 1024]).unwrap();
        f.sync_all().unwrap();
        let before = allocated_bytes(&path).unwrap();
        assert!(before >= 4 << 20, "{before}");

        punch_zero_ranges(&path).unwrap();

        let after = allocated_bytes(&path).unwrap();
        assert!(after <= 128 * 1024, "{after} bytes still allocated");
        let content = std::fs::read(&path).unwrap();
        assert_eq!(content.len(), 16 << 20);
        assert!(content[..4 << 20].iter().all(|b| *b == 0));
        assert!(content[4 << 20..(4 << 20) + 64 * 1024].iter().all(|b| *b == 7));
    }
}
