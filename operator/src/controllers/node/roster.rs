//! The CSIAddonsNodes in the cache, and whether this manager has settled each one's connection
//! yet. Other controllers ask it before concluding from the pool that a driver offers nothing: at
//! a start or failover the pool fills pass by pass, and an empty pool then means "not yet"
//! (upstream's PVC controller takes it for "offers nothing" and deletes the managed cron jobs).
//! [differs: schedule-wait-connected]
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use api::csiaddons::CSIAddonsNode;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use tokio::sync::mpsc;

use crate::cache_ready::Ready;
use crate::primitives::locked;
use crate::sidecars::pool::Pool;

#[derive(Clone)]
pub struct Roster {
    pub(super) store: Store<CSIAddonsNode>,
    pub(super) ready: Ready,
    /// CSIAddonsNodes whose spec cannot be used (state Failed), by UID.
    pub(super) failed: Arc<Mutex<HashSet<String>>>,
    /// Drivers one of whose sidecars was pooled by a pass (their PVCs are looked at again).
    pub(super) connected: mpsc::UnboundedSender<String>,
}

impl Roster {
    /// Whether every CSIAddonsNode of `driver` in the cache is pooled or has a spec that cannot
    /// be used; false until the cache has its first list and while any is still being dialled.
    pub fn settled(&self, pool: &Pool, driver: &str) -> bool {
        if !self.ready.is_ready() {
            return false;
        }
        let failed = locked(&self.failed);
        self.store
            .state()
            .iter()
            .filter(|n| n.spec.driver.name == driver && n.metadata.deletion_timestamp.is_none())
            .all(|n| {
                let namespace = n.namespace().unwrap_or_default();
                pool.holds_node(&namespace, &n.name_any()) || failed.contains(n.uid().as_deref().unwrap_or_default())
            })
    }

    /// Marks the CSIAddonsNode `uid` failed (its spec cannot be used) or not.
    pub(super) fn set_failed(&self, uid: &str, failed: bool) {
        let mut set = locked(&self.failed);
        if failed {
            set.insert(uid.to_owned());
        } else {
            set.remove(uid);
        }
    }

    /// The cache of CSIAddonsNodes, and when it has its first full list.
    pub fn cache(&self) -> (Store<CSIAddonsNode>, Ready) {
        (self.store.clone(), self.ready.clone())
    }

    pub(super) fn failed_count(&self) -> usize {
        locked(&self.failed).len()
    }
}
