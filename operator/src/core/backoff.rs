//! The one backoff of every controller that retries: failures in a row per object (by UID), and
//! a policy that turns their count into a wait, doubling from a first delay up to a longest one.
//! Jobs, fences, replications, groups and their contents use the standard policy (5 s, 10 s,
//! 20 s … at most 5 min); CSIAddonsNodes start from `csi-addons-node-retry-delay` (2, 4, 8 s with
//! upstream's setting). An object's entry goes when it succeeds or when the object goes.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use kube::Resource;
use kube::runtime::reflector::Store;

use super::Core;
use super::clock::now_seconds;
use super::run::Context;
use super::slim::Listing;
use crate::primitives::locked;

/// How long to wait after failures in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub first: Duration,
    pub longest: Duration,
}

impl Policy {
    /// 5 s after the first failure, doubling, at most 5 minutes.
    pub const STANDARD: Policy = Policy { first: Duration::from_secs(5), longest: Duration::from_secs(300) };

    /// The wait after the `failures`-th failure in a row (1 for the first): `first` (at least a
    /// second), doubled for each failure before it, at most `longest`.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first.max(Duration::from_secs(1)).saturating_mul(1u32 << doublings).min(self.longest)
    }
}

/// An object's failures in a row, and when the last one was (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    pub count: u32,
    pub last: i64,
}

/// Failures in a row, by object UID. In memory only: after a restart an object is tried at once
/// (its status may say how many failed before).
#[derive(Default)]
pub struct Backoff(Mutex<HashMap<String, Failures>>);

impl Backoff {
    /// Counts a failure of `uid` at `now`; returns the count in a row.
    pub fn failed(&self, uid: &str, now: i64) -> u32 {
        let mut entries = locked(&self.0);
        let entry = entries.entry(uid.to_owned()).or_insert(Failures { count: 0, last: now });
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        entry.count
    }

    /// Counts a failure and returns the wait before the next attempt under `policy`.
    pub fn next_delay(&self, uid: &str, policy: Policy, now: i64) -> Duration {
        policy.delay(self.failed(uid, now))
    }

    /// Records that `uid` has failed `count` times in a row, the last at `now` (a count the
    /// object's status keeps).
    pub fn set(&self, uid: &str, count: u32, now: i64) {
        locked(&self.0).insert(uid.to_owned(), Failures { count, last: now });
    }

    pub fn get(&self, uid: &str) -> Option<Failures> {
        locked(&self.0).get(uid).copied()
    }

    /// How long `uid` must still wait under `policy` at `now`; None when an attempt is due.
    pub fn wait(&self, uid: &str, policy: Policy, now: i64) -> Option<Duration> {
        let failures = self.get(uid)?;
        let due =
            failures.last.saturating_add(i64::try_from(policy.delay(failures.count).as_secs()).unwrap_or(i64::MAX));
        (due > now).then(|| Duration::from_secs((due - now).unsigned_abs()))
    }

    /// `uid` succeeded or went: its failures go.
    pub fn forget(&self, uid: &str) {
        locked(&self.0).remove(uid);
    }

    /// Keeps the entries of the UIDs in `live` only.
    pub fn retain(&self, live: &HashSet<String>) {
        locked(&self.0).retain(|uid, _| live.contains(uid));
    }

    /// How many objects are waiting out failures.
    pub fn len(&self) -> usize {
        locked(&self.0).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The context of a controller whose only state of its own is its backoff.
pub type Retrying = Context<Backoff>;

impl Context<Backoff> {
    /// A context whose backoff forgets the objects that left `store`.
    pub fn retrying<K>(core: Arc<Core>, store: &Store<K>) -> Arc<Self>
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let ctx = Arc::new(Context::new(core, Backoff::default()));
        prune_periodically(Arc::downgrade(&ctx), store.clone(), |ctx: &Retrying, live| ctx.state.retain(live));
        ctx
    }

    /// Counts a failure of `object` and returns the wait before it is tried again (the standard
    /// policy).
    pub fn retry<K: Resource>(&self, object: &K) -> Duration {
        let uid = object.meta().uid.as_deref().unwrap_or_default();
        self.state.next_delay(uid, Policy::STANDARD, now_seconds())
    }

    /// `object` succeeded: its failures go.
    pub fn forget<K: Resource>(&self, object: &K) {
        self.state.forget(object.meta().uid.as_deref().unwrap_or_default());
    }
}

/// How often what a controller remembers of objects that went is dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(300);

/// Every few minutes while `ctx` lives, calls `prune` with the UIDs of the objects in `store`:
/// what a controller remembers of an object deleted before it succeeded goes.
pub fn prune_periodically<C, K>(ctx: Weak<C>, store: impl Listing<K>, prune: fn(&C, &HashSet<String>))
where
    C: Send + Sync + 'static,
    K: Resource,
{
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(PRUNE_EVERY).await;
            let Some(ctx) = ctx.upgrade() else { return };
            prune(&ctx, &store.uids());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_policy_doubles_from_five_seconds_to_five_minutes() {
        let waits: Vec<u64> = (1..=8).map(|n| Policy::STANDARD.delay(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(Policy::STANDARD.delay(u32::MAX), Duration::from_secs(300));
        // A first delay of 0 still waits a second.
        let zero = Policy { first: Duration::ZERO, longest: Duration::from_secs(3600) };
        assert_eq!(zero.delay(1), Duration::from_secs(1));
    }

    #[test]
    fn failures_count_wait_and_go() {
        let backoff = Backoff::default();
        assert_eq!(backoff.wait("u", Policy::STANDARD, 100), None, "nothing failed: due now");
        assert_eq!(backoff.next_delay("u", Policy::STANDARD, 100), Duration::from_secs(5));
        assert_eq!(backoff.wait("u", Policy::STANDARD, 102), Some(Duration::from_secs(3)));
        assert_eq!(backoff.wait("u", Policy::STANDARD, 105), None);
        assert_eq!(backoff.next_delay("u", Policy::STANDARD, 106), Duration::from_secs(10));
        assert_eq!(backoff.get("u"), Some(Failures { count: 2, last: 106 }));
        backoff.set("v", 3, 50);
        backoff.retain(&["v".to_owned()].into());
        assert_eq!((backoff.get("u"), backoff.len()), (None, 1));
        backoff.forget("v");
        assert!(backoff.is_empty());
    }
}
