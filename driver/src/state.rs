//! The driver's persistent state: every volume, snapshot, fence and replication it knows, in one
//! JSON document under the state directory.
//!
//! Each change is written to a temporary file, fsynced, renamed over `state.json` and the directory
//! fsynced, so a crash (kill -9) between or during calls leaves either the old or the new state,
//! never a torn one.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How a volume is presented to workloads.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AccessType {
    /// A filesystem (a formatted sparse file, or a directory where formatting is unavailable).
    Mount,
    /// A raw block device (a loop device over a sparse file).
    Block,
}

/// A volume the driver created.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Volume {
    pub id: String,
    pub name: String,
    pub capacity_bytes: i64,
    pub access_type: AccessType,
    /// Parameters the volume was created with (StorageClass parameters).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// The snapshot or volume it was created from, if any.
    #[serde(default)]
    pub content_source: Option<String>,
    /// Nodes the volume is published to by ControllerPublishVolume, with their read-only flag.
    #[serde(default)]
    pub published_nodes: BTreeMap<String, bool>,
    /// ID of the volume's current encryption key (changed by EncryptionKeyRotate).
    #[serde(default)]
    pub key_id: Option<String>,
}

/// A snapshot: a point-in-time copy of a volume's data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: i64,
    pub created_unix_ms: i64,
}

/// A volume group (CSI-Addons VolumeGroup).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Group {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Member volumes, in the order they were given.
    #[serde(default)]
    pub volume_ids: Vec<String>,
}

/// The replication role of a source on this site.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Secondary,
}

/// The outcome of the last copy to the second site.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncRecord {
    /// When it finished, in milliseconds since the Unix epoch.
    pub finished_unix_ms: i64,
    pub bytes: i64,
    pub duration_ms: i64,
}

/// A replicated volume or volume group.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Replication {
    pub role: Role,
    /// Seconds between syncs while primary.
    pub interval_secs: u64,
    /// The replica's volume ID on the second site, per source volume ID.
    pub destinations: BTreeMap<String, String>,
    /// For a group: the group's ID on the second site.
    #[serde(default)]
    pub destination_group_id: Option<String>,
    #[serde(default)]
    pub last_sync: Option<SyncRecord>,
}

/// The whole state document.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct State {
    /// Volumes by ID.
    #[serde(default)]
    pub volumes: BTreeMap<String, Volume>,
    /// CIDR blocks cut off from the storage (NetworkFence), as given.
    #[serde(default)]
    pub fenced_cidrs: std::collections::BTreeSet<String>,
    /// Storage clients (node plugins) by node ID, with their addresses: what GetFenceClients
    /// reports.
    #[serde(default)]
    pub clients: BTreeMap<String, Vec<String>>,
    /// Nodes whose node plugin has started: where ControllerPublishVolume can attach volumes.
    #[serde(default)]
    pub nodes: std::collections::BTreeSet<String>,
    /// Snapshots by ID.
    #[serde(default)]
    pub snapshots: BTreeMap<String, Snapshot>,
    /// Volume groups by ID.
    #[serde(default)]
    pub groups: BTreeMap<String, Group>,
    /// Replications by source: `volume/<id>` or `volumegroup/<id>`.
    #[serde(default)]
    pub replications: BTreeMap<String, Replication>,
}

impl State {
    /// The volume named `name`, if one exists.
    pub fn volume_by_name(&self, name: &str) -> Option<&Volume> {
        self.volumes.values().find(|v| v.name == name)
    }

    /// Bytes promised to existing volumes.
    pub fn allocated_bytes(&self) -> i64 {
        self.volumes.values().map(|v| v.capacity_bytes).sum()
    }
}

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid state: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads and writes [`State`] atomically under a directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

const STATE_FILE: &str = "state.json";

impl Store {
    /// A store in `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            action: "creating",
            path: dir.to_owned(),
            source,
        })?;
        Ok(Store { dir: dir.to_owned() })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Holds an exclusive lock on the state across processes (the controller and node plugins of
    /// one machine share the directory) until the returned guard is dropped.
    pub fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>, StoreError> {
        let path = self.dir.join("state.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| StoreError::Io { action: "opening", path: path.clone(), source })?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, errno)| StoreError::Io {
            action: "locking",
            path,
            source: errno.into(),
        })
    }

    /// The saved state, or an empty one when nothing was saved yet. A leftover temporary file from
    /// a crash mid-write is ignored: the rename never happened, so the previous state stands.
    pub fn load(&self) -> Result<State, StoreError> {
        let mut loaded = Loaded::default();
        self.refresh(&mut loaded)?;
        Ok(loaded.state)
    }

    /// Brings `loaded` up to date with the saved state, parsing only when the file's bytes
    /// differ from those it was parsed from (most calls change nothing; parsing the state of
    /// thousands of volumes on every call made a busy driver CPU-bound).
    pub fn refresh(&self, loaded: &mut Loaded) -> Result<(), StoreError> {
        let path = self.dir.join(STATE_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                *loaded = Loaded::default();
                return Ok(());
            }
            Err(source) => return Err(StoreError::Io { action: "reading", path, source }),
        };
        if loaded.bytes.as_ref() != Some(&bytes) {
            loaded.state = serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt { path, source })?;
            loaded.bytes = Some(bytes);
        }
        Ok(())
    }

    /// Replaces the saved state with `state`, durably; returns the bytes written.
    pub fn save(&self, state: &State) -> Result<Vec<u8>, StoreError> {
        let path = self.dir.join(STATE_FILE);
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> StoreError + 'p {
            move |source| StoreError::Io { action, path: path.to_owned(), source }
        }
        // Serialising plain data into memory cannot fail; an error would leave the old state.
        let bytes =
            serde_json::to_vec_pretty(state).map_err(|source| StoreError::Corrupt { path: path.clone(), source })?;
        let written = std::fs::File::create(&tmp).map_err(io("creating", &tmp)).and_then(|mut file| {
            file.write_all(&bytes).map_err(io("writing", &tmp))?;
            file.sync_all().map_err(io("syncing", &tmp))
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path).map_err(io("renaming", &tmp))) {
            // The state stands as it was; a torn temporary file would only hold space a full
            // filesystem needs.
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io("syncing", &self.dir))?;
        Ok(bytes)
    }
}

/// The state as last read from disk, with the bytes it was parsed from.
#[derive(Debug, Default)]
pub struct Loaded {
    pub state: State,
    /// None: nothing saved yet.
    bytes: Option<Vec<u8>>,
}

impl Loaded {
    /// `state`, just saved as `bytes`.
    pub fn saved(state: State, bytes: Vec<u8>) -> Self {
        Loaded { state, bytes: Some(bytes) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(id: &str) -> Volume {
        Volume {
            id: id.into(),
            name: format!("name-{id}"),
            capacity_bytes: 1 << 20,
            access_type: AccessType::Mount,
            parameters: BTreeMap::new(),
            content_source: None,
            published_nodes: BTreeMap::new(),
            key_id: None,
        }
    }

    #[test]
    fn an_empty_directory_loads_as_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Store::open(dir.path()).unwrap().load().unwrap(), State::default());
    }

    #[test]
    fn saved_state_loads_back_in_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = State::default();
        state.volumes.insert("v1".into(), volume("v1"));
        Store::open(dir.path()).unwrap().save(&state).unwrap();
        assert_eq!(Store::open(dir.path()).unwrap().load().unwrap(), state);
    }

    #[test]
    fn a_refresh_follows_saves_of_other_stores_and_removal() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (Store::open(dir.path()).unwrap(), Store::open(dir.path()).unwrap());
        let mut loaded = Loaded::default();
        ours.refresh(&mut loaded).unwrap();
        assert_eq!(loaded.state, State::default());
        let mut state = State::default();
        state.volumes.insert("v1".into(), volume("v1"));
        let bytes = ours.save(&state).unwrap();
        loaded = Loaded::saved(state.clone(), bytes);
        // Another process (the node plugin, the controller) saves: the next refresh sees it.
        state.volumes.insert("v2".into(), volume("v2"));
        theirs.save(&state).unwrap();
        ours.refresh(&mut loaded).unwrap();
        assert_eq!(loaded.state, state);
        // Unchanged bytes keep what was parsed; a state file gone reads as empty.
        ours.refresh(&mut loaded).unwrap();
        assert_eq!(loaded.state, state);
        std::fs::remove_file(dir.path().join("state.json")).unwrap();
        ours.refresh(&mut loaded).unwrap();
        assert_eq!(loaded.state, State::default());
        std::fs::write(dir.path().join("state.json"), b"").unwrap();
        assert!(ours.refresh(&mut loaded).is_err(), "an empty state file is corrupt");
    }

    #[test]
    fn a_torn_temporary_file_from_a_crash_does_not_replace_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut state = State::default();
        state.volumes.insert("v1".into(), volume("v1"));
        store.save(&state).unwrap();
        // A crash after writing half of the next state, before the rename.
        std::fs::write(dir.path().join("state.json.tmp"), b"{\"volumes\": {\"v2\"").unwrap();
        assert_eq!(store.load().unwrap(), state);
    }

    #[test]
    fn a_failed_save_leaves_no_temporary_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // The rename over the state file fails: a non-empty directory stands in its place.
        std::fs::create_dir_all(dir.path().join("state.json/in-the-way")).unwrap();
        let error = store.save(&State::default()).unwrap_err();
        assert!(error.to_string().starts_with("renaming "), "{error}");
        assert!(!dir.path().join("state.json.tmp").exists(), "the temporary file is removed");
    }

    #[test]
    fn a_corrupt_state_file_is_an_error_not_an_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.json"), b"not json").unwrap();
        let err = Store::open(dir.path()).unwrap().load().unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    }
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn the_state_lock_excludes_a_second_holder() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let held = store.lock().unwrap();
        // A second open file description cannot take the lock while the first holds it.
        let other = std::fs::OpenOptions::new().write(true).open(dir.path().join("state.lock")).unwrap();
        let attempt = nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock);
        assert!(attempt.is_err(), "the lock was taken twice");
        drop(held);
        let other = std::fs::OpenOptions::new().write(true).open(dir.path().join("state.lock")).unwrap();
        assert!(nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok());
    }
}
