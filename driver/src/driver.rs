//! The state every service of the driver shares, and the one way to change it.
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Mutex;
use tonic::Status;

use crate::state::{Loaded, State, Store, StoreError};
use crate::volumes::Layout;

/// Which CSI services this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Controller,
    Node,
    Both,
}

impl Mode {
    pub fn controller(self) -> bool {
        matches!(self, Mode::Controller | Mode::Both)
    }
    pub fn node(self) -> bool {
        matches!(self, Mode::Node | Mode::Both)
    }
}

/// How filesystem volumes are kept (`--filesystem-backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FilesystemBackend {
    Auto,
    Loop,
    Directory,
}

impl FilesystemBackend {
    /// Whether filesystem volumes are directories; `auto` decides from the machine and says why.
    pub fn directories(self) -> bool {
        match self {
            FilesystemBackend::Loop => false,
            FilesystemBackend::Directory => true,
            FilesystemBackend::Auto => match crate::mounts::loop_unavailable_reason() {
                Some(reason) => {
                    tracing::warn!(%reason, "filesystem volumes are plain directories on this machine");
                    true
                }
                None => false,
            },
        }
    }
}

/// The topology key: volumes live on the machine of the plugin that created them.
pub const TOPOLOGY_KEY: &str = "topology.reference.csi-addons-rs.io/node";

/// Settings fixed at start.
#[derive(Clone, Debug)]
pub struct Config {
    /// The plugin name (reverse-domain form).
    pub name: String,
    pub node_id: String,
    /// This node's address, for fencing: registered as a fence client, and checked on publish.
    pub node_ip: Option<std::net::IpAddr>,
    pub state_dir: PathBuf,
    /// Total bytes volumes may take together.
    pub capacity_bytes: i64,
    pub mode: Mode,
    /// Filesystem volumes are plain directories (machines without loop devices, mkfs or root).
    pub directories: bool,
}

/// The driver: configuration, state and where volume data lives.
pub struct Driver {
    pub config: Config,
    pub layout: Layout,
    store: Store,
    state: Mutex<Loaded>,
    /// Volumes with an operation in progress: a second one gets ABORTED, as the CSI spec asks.
    busy: std::sync::Mutex<HashSet<String>>,
}

/// Marks a volume busy until dropped.
pub struct BusyGuard {
    driver: Arc<Driver>,
    id: String,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.driver.busy.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
    }
}

impl Driver {
    /// This plugin's topology segment.
    pub fn topology(&self) -> Vec<api::proto::csi::v1::Topology> {
        let segments = [(TOPOLOGY_KEY.to_owned(), self.config.node_id.clone())].into_iter().collect();
        vec![api::proto::csi::v1::Topology { segments }]
    }

    /// Opens the state directory and loads what an earlier run saved.
    pub fn open(config: Config) -> Result<Arc<Self>, StoreError> {
        let store = Store::open(&config.state_dir)?;
        let mut state = Loaded::default();
        store.refresh(&mut state)?;
        Ok(Arc::new(Driver {
            layout: Layout::new(&config.state_dir, config.directories),
            config,
            store,
            state: Mutex::new(state),
            busy: Default::default(),
        }))
    }

    /// A copy of the current state, for reads.
    pub async fn snapshot(&self) -> State {
        self.state.lock().await.state.clone()
    }

    /// Marks volume `id` busy for the life of the guard, or ABORTED if it already is.
    pub fn begin(self: &Arc<Self>, id: &str) -> Result<BusyGuard, Status> {
        let mut busy = self.busy.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !busy.insert(id.to_owned()) {
            return Err(Status::aborted(format!("an operation on volume {id} is already in progress")));
        }
        Ok(BusyGuard { driver: self.clone(), id: id.to_owned() })
    }

    /// The volume `id` from the state on disk (the controller, maybe another process, creates
    /// volumes): INVALID_ARGUMENT when empty, NOT_FOUND when unknown or malformed.
    pub async fn volume(&self, id: &str) -> Result<crate::state::Volume, Status> {
        crate::volumes::validate_id("volume_id", id)?;
        let mut loaded = self.state.lock().await;
        self.store.refresh(&mut loaded).map_err(|e| Status::internal(e.to_string()))?;
        loaded.state.volumes.get(id).cloned().ok_or_else(|| Status::not_found(format!("volume {id} not found")))
    }

    /// Re-reads the state from disk (another process, the controller, may have changed it) and
    /// returns it.
    pub async fn reload(&self) -> Result<State, StoreError> {
        let mut loaded = self.state.lock().await;
        self.store.refresh(&mut loaded)?;
        Ok(loaded.state.clone())
    }

    /// A failed save's status. A full filesystem is RESOURCE_EXHAUSTED and says what the user can
    /// do: the saved state is the one before the call, so a retry once there is space finds it whole.
    fn save_failed(&self, e: &StoreError) -> Status {
        if crate::space::is_out_of_space(e) {
            Status::resource_exhausted(format!(
                "saving driver state: {e}; the driver's state directory {} is full, so nothing was changed: free \
                 space there, then retry",
                self.config.state_dir.display()
            ))
        } else {
            Status::internal(format!("saving driver state: {e}"))
        }
    }

    /// Applies `change` to a copy of the current state on disk and saves it; the change takes effect
    /// only once it is on disk, so a failed save (or an error from `change`) leaves nothing
    /// half-done.
    pub async fn update<R>(&self, change: impl FnOnce(&mut State) -> Result<R, Status>) -> Result<R, Status> {
        let internal = |e: StoreError| Status::internal(format!("driver state: {e}"));
        let mut loaded = self.state.lock().await;
        // Read-modify-write under the cross-process lock, so a change another process made since
        // our last read is built upon, never overwritten. Held for milliseconds.
        let _lock = self.store.lock().map_err(internal)?;
        self.store.refresh(&mut loaded).map_err(internal)?;
        let mut next = loaded.state.clone();
        let result = change(&mut next)?;
        if next != loaded.state {
            let bytes = self.store.save(&next).map_err(|e| self.save_failed(&e))?;
            *loaded = Loaded::saved(next, bytes);
        }
        Ok(result)
    }
}
