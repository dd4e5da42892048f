//! Where volume data lives and which identifiers are acceptable. Every path the driver touches is
//! built from a validated ID under the state directory, so no request can reach outside it.
use std::io::Read;
use std::path::{Path, PathBuf};

use tonic::Status;

/// The CSI spec asks plugins to accept names and IDs of at least 128 bytes; we accept exactly up to
/// that and refuse longer ones clearly.
pub const MAX_NAME_BYTES: usize = 128;

/// Checks a volume or snapshot ID received from a caller: non-empty, at most 128 bytes, and only
/// `[A-Za-z0-9._-]` without a leading dot (so never `..` or a path).
pub fn validate_id(what: &str, id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    if id.len() > MAX_NAME_BYTES {
        return Err(Status::invalid_argument(format!("{what} is longer than {MAX_NAME_BYTES} bytes")));
    }
    if id.starts_with('.') || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(Status::not_found(format!("{what} {id:?} does not name anything this driver created")));
    }
    Ok(())
}

/// Checks a volume or snapshot name: non-empty and at most 128 bytes (any characters: names are
/// only compared, never used in paths).
pub fn validate_name(what: &str, name: &str) -> Result<(), Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Status::invalid_argument(format!("{what} is longer than {MAX_NAME_BYTES} bytes")));
    }
    Ok(())
}

/// A new random identifier, 32 hex digits.
pub fn new_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Paths of volume data under the state directory. A volume's data is a sparse file, or, for
/// filesystem volumes on machines without loop devices, a directory at the same path; copies
/// (snapshots, clones, replicas) take the form of their source.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
    directories: bool,
}

impl Layout {
    pub fn new(state_dir: &Path, directories: bool) -> Self {
        Layout { root: state_dir.to_owned(), directories }
    }

    /// The sparse file (or directory) holding a volume's data. `id` must have passed [`validate_id`].
    pub fn volume_file(&self, id: &str) -> PathBuf {
        self.root.join("volumes").join(format!("{id}.img"))
    }

    /// The sparse copy holding a snapshot's data. `id` must have passed [`validate_id`].
    pub fn snapshot_file(&self, id: &str) -> PathBuf {
        self.root.join("snapshots").join(format!("{id}.img"))
    }

    /// Creates (or grows to) a sparse file of `bytes` for volume `id`; a directory instead for a
    /// filesystem volume (`filesystem`) when this machine keeps them so, or when its data is
    /// already one (a copy of a directory volume). Idempotent.
    pub fn create_volume_file(&self, id: &str, bytes: u64, filesystem: bool) -> std::io::Result<()> {
        let path = self.volume_file(id);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if path.is_dir() || (self.directories && filesystem && !path.exists()) {
            // A directory has no size to grow: capacity is what the state records.
            return std::fs::create_dir_all(&path);
        }
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path)?;
        if file.metadata()?.len() < bytes {
            file.set_len(bytes)?;
        }
        file.sync_all()
    }

    /// Removes a volume's data. Idempotent.
    pub fn remove_volume_file(&self, id: &str) -> std::io::Result<()> {
        crate::space::remove_data(&self.volume_file(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_could_escape_the_state_directory_are_refused() {
        for id in ["../etc", "..", ".hidden", "a/b", "a\0b", "vol id"] {
            assert!(validate_id("volume ID", id).is_err(), "{id:?} accepted");
        }
        assert_eq!(validate_id("volume ID", "").unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(validate_id("volume ID", &"a".repeat(129)).unwrap_err().code(), tonic::Code::InvalidArgument);
        validate_id("volume ID", &"a".repeat(128)).unwrap();
        validate_id("volume ID", &new_id().unwrap()).unwrap();
    }

    #[test]
    fn names_up_to_128_bytes_are_accepted() {
        validate_name("name", &"n".repeat(128)).unwrap();
        assert_eq!(validate_name("name", &"n".repeat(129)).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(validate_name("name", "").unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn volume_files_are_sparse_and_creation_is_idempotent() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), false);
        layout.create_volume_file("v1", 1 << 30, true).unwrap();
        layout.create_volume_file("v1", 1 << 30, true).unwrap();
        let meta = std::fs::metadata(layout.volume_file("v1")).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        assert!(meta.blocks() * 512 < 1 << 20, "a new 1 GiB volume allocates almost nothing");
        layout.remove_volume_file("v1").unwrap();
        layout.remove_volume_file("v1").unwrap();
        assert!(!layout.volume_file("v1").exists());
    }

    #[test]
    fn without_loop_devices_filesystem_volumes_are_directories() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), true);
        layout.create_volume_file("fs", 1 << 30, true).unwrap();
        layout.create_volume_file("fs", 2 << 30, true).unwrap();
        assert!(layout.volume_file("fs").is_dir());
        layout.create_volume_file("raw", 1 << 20, false).unwrap();
        assert!(layout.volume_file("raw").is_file(), "block volumes stay files");
        std::fs::write(layout.volume_file("fs").join("data"), b"x").unwrap();
        layout.remove_volume_file("fs").unwrap();
        layout.remove_volume_file("fs").unwrap();
        assert!(!layout.volume_file("fs").exists());
    }
}
