//! PV name → CSI driver, as the annotation controller learns them (one GET per PV; a PV's
//! source never changes). Kept compact, as there is an entry for every scheduled PVC's PV: the
//! name once, and the driver as an index into the few distinct driver names (a map of name to
//! `Option<String>` cost some 140 bytes an entry, this about 60).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::core::lock::locked;

/// Entries kept at most; a full cache is emptied (it only costs a GET per PV again).
const LIMIT: usize = 100_000;
/// The index that says "not a CSI volume".
const NOT_CSI: u16 = u16::MAX;

#[derive(Clone, Default)]
pub struct PvDrivers(Arc<Mutex<Known>>);

#[derive(Default)]
struct Known {
    by_pv: HashMap<Box<str>, u16>,
    drivers: Vec<Arc<str>>,
}

impl PvDrivers {
    /// `None` when the PV is not known; `Some(None)` when it is not a CSI volume.
    pub fn get(&self, pv: &str) -> Option<Option<Arc<str>>> {
        let known = locked(&self.0);
        let index = *known.by_pv.get(pv)?;
        Some(known.drivers.get(usize::from(index)).cloned())
    }

    /// Remembers `pv`'s driver (`None`: not CSI) and returns it as kept.
    pub fn insert(&self, pv: &str, driver: Option<&str>) -> Option<Arc<str>> {
        let mut known = locked(&self.0);
        let Known { by_pv, drivers } = &mut *known;
        if by_pv.len() >= LIMIT {
            by_pv.clear();
        }
        let index = match driver {
            None => NOT_CSI,
            Some(name) => match drivers.iter().position(|d| **d == *name) {
                Some(i) => u16::try_from(i).unwrap_or(NOT_CSI),
                // Tens of thousands of distinct drivers do not happen; past that, nothing new is
                // kept (the caller still gets the name).
                None if drivers.len() < usize::from(NOT_CSI) => {
                    drivers.push(Arc::from(name));
                    u16::try_from(drivers.len() - 1).unwrap_or(NOT_CSI)
                }
                None => return Some(Arc::from(name)),
            },
        };
        by_pv.insert(Box::from(pv), index);
        drivers.get(usize::from(index)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_are_kept_once_and_non_csi_volumes_are_remembered() {
        let cache = PvDrivers::default();
        assert_eq!(cache.get("pv-1"), None);
        assert_eq!(cache.insert("pv-1", Some("rbd.csi.ceph.com")).as_deref(), Some("rbd.csi.ceph.com"));
        assert_eq!(cache.insert("pv-2", Some("rbd.csi.ceph.com")).as_deref(), Some("rbd.csi.ceph.com"));
        assert_eq!(cache.insert("pv-3", Some("cephfs.csi.ceph.com")).as_deref(), Some("cephfs.csi.ceph.com"));
        assert_eq!(cache.insert("pv-nfs", None), None);
        assert_eq!(cache.get("pv-1").unwrap().as_deref(), Some("rbd.csi.ceph.com"));
        assert_eq!(cache.get("pv-3").unwrap().as_deref(), Some("cephfs.csi.ceph.com"));
        assert_eq!(cache.get("pv-nfs"), Some(None), "known not to be CSI");
        assert_eq!(locked(&cache.0).drivers.len(), 2, "each driver name kept once");
    }

    #[test]
    fn a_full_cache_starts_again() {
        let cache = PvDrivers::default();
        for i in 0..LIMIT {
            cache.insert(&format!("pv-{i}"), Some("d"));
        }
        cache.insert("one-more", Some("d"));
        assert_eq!(cache.get("pv-0"), None);
        assert_eq!(cache.get("one-more").unwrap().as_deref(), Some("d"));
    }
}
