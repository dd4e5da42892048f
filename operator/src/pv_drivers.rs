//! PV name → CSI driver, kept from a watch of PersistentVolumes: one list and a watch instead of a
//! GET per bound PVC (the PVC controller) and per job (the job controllers). Kept compact, as
//! there is an entry for every PV of the cluster: the driver as an index into the few distinct
//! driver names, and a provisioned PV's name (`pvc-<uid>`) as the 16 bytes of its uid, so an entry
//! costs some 35 bytes (a name and an `Option<String>` cost some 140).
//!
//! A PV's source never changes, so each entry is written once; a PV bound to a claim after that
//! brings the claim's pass (`follow`), which is how a PVC whose PV was not seen yet goes on, and
//! how a PVC annotated before it was bound is scheduled when it binds (upstream's misses it).
//! [differs: pvc-binds]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::claim::Claim;
use crate::compact::CsiPv;
use crate::primitives::locked;

/// The index that says "not a CSI volume".
const NOT_CSI: u32 = u32::MAX;

#[derive(Clone, Default)]
pub struct PvDrivers(Arc<Mutex<Known>>);

#[derive(Default)]
struct Known {
    current: Volumes,
    /// The list the watch is making after it had to start over; swapped in when complete.
    relisting: Option<Volumes>,
    drivers: Vec<Arc<str>>,
}

/// Driver indexes by PV: names of the form `pvc-<uid>` (every provisioned PV) by their uid,
/// others by name.
#[derive(Default)]
struct Volumes {
    by_uid: HashMap<u128, u32>,
    by_name: HashMap<Box<str>, u32>,
}

impl Volumes {
    fn get(&self, pv: &str) -> Option<u32> {
        match provisioned_uid(pv) {
            Some(uid) => self.by_uid.get(&uid).copied(),
            None => self.by_name.get(pv).copied(),
        }
    }

    fn insert(&mut self, pv: &str, index: u32) {
        match provisioned_uid(pv) {
            Some(uid) => self.by_uid.insert(uid, index),
            None => self.by_name.insert(Box::from(pv), index),
        };
    }

    fn remove(&mut self, pv: &str) {
        match provisioned_uid(pv) {
            Some(uid) => self.by_uid.remove(&uid),
            None => self.by_name.remove(pv),
        };
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_uid.len() + self.by_name.len()
    }
}

/// The uid in a name `pvc-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (lower-case hex, as the external
/// provisioner names PVs): one number per such name, and no other name maps to it.
fn provisioned_uid(pv: &str) -> Option<u128> {
    crate::compact::uuid(pv.strip_prefix("pvc-")?)
}

impl PvDrivers {
    /// `None` when the PV has not been seen; `Some(None)` when it is not a CSI volume.
    pub fn get(&self, pv: &str) -> Option<Option<Arc<str>>> {
        let known = locked(&self.0);
        let index = known.current.get(pv)?;
        Some(known.drivers.get(index as usize).cloned())
    }

    /// Remembers `pv`'s driver (`None`: not CSI); whether it was not known before.
    fn insert(&self, pv: &str, driver: Option<&str>) -> bool {
        let mut known = locked(&self.0);
        let Known { current, relisting, drivers } = &mut *known;
        let index = match driver {
            None => NOT_CSI,
            Some(name) => match drivers.iter().position(|d| **d == *name) {
                // Fewer drivers than an index counts: each takes memory, and a cluster has a few.
                Some(i) => u32::try_from(i).unwrap_or(NOT_CSI),
                None => {
                    drivers.push(Arc::from(name));
                    u32::try_from(drivers.len() - 1).unwrap_or(NOT_CSI)
                }
            },
        };
        let new = current.get(pv).is_none();
        // Into the list being made too, and into the one served now at once: a claim brought
        // back before the new list is done finds its driver.
        if let Some(list) = relisting {
            list.insert(pv, index);
        }
        current.insert(pv, index);
        new
    }

    fn remove(&self, pv: &str) {
        locked(&self.0).current.remove(pv);
    }

    fn relist_starts(&self) {
        locked(&self.0).relisting = Some(Volumes::default());
    }

    fn relist_done(&self) {
        let mut known = locked(&self.0);
        if let Some(list) = known.relisting.take() {
            known.current = list;
        }
    }
}

/// Keeps `drivers` in step with `events` (a watch of every PV) and yields the claims to look at
/// again: that of a PV bound after it was listed, or first seen after the list (its PVC's pass
/// may have found no driver). The first list yields none: no PVC pass starts before it is done.
pub fn follow(
    events: impl Stream<Item = Result<watcher::Event<CsiPv>, watcher::Error>> + Send + 'static,
    drivers: PvDrivers,
) -> impl Stream<Item = ObjectRef<Claim>> + Send + 'static {
    let mut listed_once = false;
    events.filter_map(move |event| {
        let claim = match event {
            Ok(watcher::Event::Apply(pv)) => {
                drivers.insert(&pv.name_any(), driver(&pv));
                claim_of(&pv)
            }
            Ok(watcher::Event::InitApply(pv)) => {
                let new = drivers.insert(&pv.name_any(), driver(&pv));
                if listed_once && new { claim_of(&pv) } else { None }
            }
            Ok(watcher::Event::Delete(pv)) => {
                drivers.remove(&pv.name_any());
                None
            }
            Ok(watcher::Event::Init) => {
                if listed_once {
                    drivers.relist_starts();
                }
                None
            }
            Ok(watcher::Event::InitDone) => {
                drivers.relist_done();
                listed_once = true;
                None
            }
            Err(error) => {
                tracing::warn!(%error, "the watch of PersistentVolumes failed; it starts again");
                None
            }
        };
        std::future::ready(claim)
    })
}

fn driver(pv: &CsiPv) -> Option<&str> {
    pv.spec.as_ref()?.csi.as_ref().map(|c| c.driver.as_str())
}

fn claim_of(pv: &CsiPv) -> Option<ObjectRef<Claim>> {
    let claim = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(ObjectRef::new(claim.name.as_deref()?).within(claim.namespace.as_deref()?))
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use super::*;

    fn pv(name: &str, driver: Option<&str>, claim: Option<&str>) -> CsiPv {
        let mut spec = serde_json::json!({});
        if let Some(driver) = driver {
            spec["csi"] = serde_json::json!({"driver": driver, "volumeHandle": format!("h-{name}")});
        }
        if let Some(claim) = claim {
            spec["claimRef"] = serde_json::json!({"namespace": "ns", "name": claim});
        }
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    }

    const PROVISIONED: &str = "pvc-0b9d2c9e-6f7a-4e1b-9c3d-5a2f8e7d6c4b";

    #[test]
    fn drivers_are_kept_once_and_non_csi_volumes_are_remembered() {
        let cache = PvDrivers::default();
        assert_eq!(cache.get("pv-1"), None);
        assert!(cache.insert("pv-1", Some("rbd.csi.ceph.com")));
        assert!(cache.insert(PROVISIONED, Some("rbd.csi.ceph.com")));
        assert!(cache.insert("pv-3", Some("cephfs.csi.ceph.com")));
        assert!(cache.insert("pv-nfs", None));
        assert!(!cache.insert("pv-1", Some("rbd.csi.ceph.com")), "known already");
        assert_eq!(cache.get("pv-1").unwrap().as_deref(), Some("rbd.csi.ceph.com"));
        assert_eq!(cache.get(PROVISIONED).unwrap().as_deref(), Some("rbd.csi.ceph.com"));
        assert_eq!(cache.get("pv-3").unwrap().as_deref(), Some("cephfs.csi.ceph.com"));
        assert_eq!(cache.get("pv-nfs"), Some(None), "known not to be CSI");
        assert_eq!(locked(&cache.0).drivers.len(), 2, "each driver name kept once");
        assert_eq!(locked(&cache.0).current.by_uid.len(), 1, "the provisioned PV kept by its uid");
        cache.remove(PROVISIONED);
        assert_eq!(cache.get(PROVISIONED), None);
    }

    #[test]
    fn only_canonical_provisioned_names_are_kept_by_uid() {
        assert_eq!(provisioned_uid("pvc-00000000-0000-0000-0000-00000000000a"), Some(10));
        assert!(provisioned_uid(PROVISIONED).is_some());
        for other in [
            "pvc-0B9D2C9E-6F7A-4E1B-9C3D-5A2F8E7D6C4B",
            "pvc-0b9d2c9e-6f7a-4e1b-9c3d-5a2f8e7d6c4",
            "pvc-0b9d2c9e-6f7a-4e1b-9c3d-5a2f8e7d6c4bb",
            "pvc-0b9d2c9e+6f7a-4e1b-9c3d-5a2f8e7d6c4b",
            "pv-0b9d2c9e-6f7a-4e1b-9c3d-5a2f8e7d6c4b",
            "pvc-0b9d2c9e-6f7a-4e1b-9c3d-5a2f8e7d6c4g",
        ] {
            assert_eq!(provisioned_uid(other), None, "{other}");
        }
        // Another name with the same digits is kept by name, apart.
        let cache = PvDrivers::default();
        cache.insert(PROVISIONED, Some("a"));
        cache.insert(&PROVISIONED.to_uppercase(), Some("b"));
        assert_eq!(cache.get(PROVISIONED).unwrap().as_deref(), Some("a"));
        assert_eq!(cache.get(&PROVISIONED.to_uppercase()).unwrap().as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn the_watch_fills_the_cache_and_brings_back_claims_of_later_binds() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let cache = PvDrivers::default();
        let mut claims = pin!(follow(rx, cache.clone()));
        let send = |event| tx.unbounded_send(Ok(event)).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(pv("listed", Some("d"), Some("a"))));
        send(watcher::Event::InitDone);
        // Bound after the list: its claim's pass may have found no driver.
        send(watcher::Event::Apply(pv("bound-later", Some("d"), Some("b"))));
        assert_eq!(claims.next().await, Some(ObjectRef::new("b").within("ns")), "the first list brings no claim");
        assert_eq!(cache.get("listed").unwrap().as_deref(), Some("d"));
        assert_eq!(cache.get("bound-later").unwrap().as_deref(), Some("d"));
        // Unbound: nothing to look at.
        send(watcher::Event::Apply(pv("unbound", None, None)));
        send(watcher::Event::Delete(pv("listed", Some("d"), Some("a"))));
        // The watch starts over: a PV that went meanwhile is dropped, one that came brings its claim.
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(pv("bound-later", Some("d"), Some("b"))));
        send(watcher::Event::InitApply(pv("came", Some("e"), Some("c"))));
        assert_eq!(claims.next().await, Some(ObjectRef::new("c").within("ns")));
        assert_eq!(cache.get("came").unwrap().as_deref(), Some("e"), "found by the claim brought back");
        assert_eq!(cache.get("unbound"), Some(None), "the old list serves until the new one is done");
        send(watcher::Event::InitDone);
        drop(tx);
        assert_eq!(claims.next().await, None);
        assert_eq!(cache.get("listed"), None);
        assert_eq!(cache.get("unbound"), None, "gone while the watch was down");
        assert_eq!(cache.get("came").unwrap().as_deref(), Some("e"));
        assert_eq!(locked(&cache.0).current.len(), 2);
    }
}
