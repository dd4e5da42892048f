//! The holders of drivers' Leases, remembered while no other sidecar can have taken the Lease, so
//! a job's leader lookup costs no request while its leader stays (upstream reads the Lease at
//! every operation).
//!
//! A candidate takes a Lease only once it has gone `leaseDurationSeconds` without renewal, so the
//! holder read at `renewTime` keeps it at least until `renewTime + leaseDurationSeconds`, unless
//! it gives it up first. A sidecar gives up its Lease early only when it stops, or steps down for
//! want of the API server; its calls then answer UNAVAILABLE (it is gone, or says it no longer
//! holds the Lease), and the lookup reads the Lease again after any such answer.
//!
//! The time is counted on this manager's clock from the Lease's `renewTime`: a clock behind the
//! API server's lengthens the trust by the difference, so it is capped at one lease duration from
//! the read.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::jiff::Timestamp;

/// How long after `now` the holder in `spec` surely still holds the Lease; None when the Lease
/// has no renewal time or duration, or has already expired.
pub fn trusted_for(spec: &LeaseSpec, now: Timestamp) -> Option<Duration> {
    let duration_ms = i64::from(spec.lease_duration_seconds?).checked_mul(1000)?;
    let renewed = spec.renew_time.as_ref()?.0;
    // A renewal "in the future" (clocks apart) counts as now.
    let age_ms = now.as_millisecond().saturating_sub(renewed.as_millisecond()).max(0);
    let left_ms = duration_ms.saturating_sub(age_ms);
    u64::try_from(left_ms).ok().filter(|&ms| ms > 0).map(Duration::from_millis)
}

/// A holder as read: its pool key, until when it is trusted, and how many UNAVAILABLE answers its
/// connection had given then.
struct Known {
    connection: String,
    until: Instant,
    unavailable_answers: u64,
}

/// Lease (`<namespace>/<name>`) → its holder's pool key.
#[derive(Default)]
pub struct LeaseHolders {
    known: Mutex<HashMap<String, Known>>,
    /// One read of a Lease at a time: a hundred jobs that arrive together and find no holder
    /// wait for one read rather than make a hundred. One per Lease, as many as drivers.
    reads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl LeaseHolders {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Held while `lease` is read; whoever gets it next looks at what the read found first.
    pub fn read_turn(&self, lease: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut reads = self.reads.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        reads.entry(lease.to_owned()).or_default().clone()
    }

    /// The pool key of `lease`'s holder, if it is still trusted and its connection has answered
    /// UNAVAILABLE no more times than when it was read (`unavailable_answers` tells the count now).
    pub fn holder(&self, lease: &str, unavailable_answers: impl FnOnce(&str) -> Option<u64>) -> Option<String> {
        let mut known = self.lock();
        let entry = known.get(lease)?;
        let unchanged = unavailable_answers(&entry.connection) == Some(entry.unavailable_answers);
        if entry.until > Instant::now() && unchanged {
            return Some(entry.connection.clone());
        }
        known.remove(lease);
        None
    }

    /// Remembers `connection` as `lease`'s holder for `trusted` (nothing when None).
    pub fn remember(&self, lease: String, connection: String, unavailable_answers: u64, trusted: Option<Duration>) {
        let mut known = self.lock();
        match trusted.and_then(|t| Instant::now().checked_add(t)) {
            Some(until) => {
                known.insert(lease, Known { connection, until, unavailable_answers });
            }
            None => {
                known.remove(&lease);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn spec(renewed_seconds_ago: i64, duration: Option<i32>) -> LeaseSpec {
        let renewed = Timestamp::from_second(at().as_second() - renewed_seconds_ago).unwrap_or_default();
        LeaseSpec { renew_time: Some(MicroTime(renewed)), lease_duration_seconds: duration, ..Default::default() }
    }

    fn at() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap_or_default()
    }

    #[test]
    fn a_holder_is_trusted_until_its_lease_could_expire() {
        assert_eq!(trusted_for(&spec(5, Some(15)), at()), Some(Duration::from_secs(10)));
        assert_eq!(trusted_for(&spec(0, Some(15)), at()), Some(Duration::from_secs(15)));
        // Renewed "later" than now by this clock: never more than one duration.
        assert_eq!(trusted_for(&spec(-30, Some(15)), at()), Some(Duration::from_secs(15)));
        assert_eq!(trusted_for(&spec(15, Some(15)), at()), None);
        assert_eq!(trusted_for(&spec(600, Some(15)), at()), None);
        assert_eq!(trusted_for(&spec(0, None), at()), None);
        assert_eq!(trusted_for(&spec(0, Some(-1)), at()), None);
        assert_eq!(trusted_for(&LeaseSpec { lease_duration_seconds: Some(15), ..Default::default() }, at()), None);
        assert_eq!(trusted_for(&spec(0, Some(i32::MAX)), at()), Some(Duration::from_secs(i32::MAX as u64)));
    }

    #[test]
    fn a_holder_is_forgotten_when_its_connection_answers_unavailable_or_it_expires() {
        let holders = LeaseHolders::default();
        holders.remember("ns/lease".into(), "ns/pod-a".into(), 3, Some(Duration::from_secs(60)));
        assert_eq!(holders.holder("ns/lease", |_| Some(3)).as_deref(), Some("ns/pod-a"));
        // One more UNAVAILABLE answer since: read the Lease again.
        assert_eq!(holders.holder("ns/lease", |_| Some(4)), None);
        assert_eq!(holders.holder("ns/lease", |_| Some(3)), None, "forgotten for good");
        // Its connection gone from the pool.
        holders.remember("ns/lease".into(), "ns/pod-a".into(), 0, Some(Duration::from_secs(60)));
        assert_eq!(holders.holder("ns/lease", |_| None), None);
        // Expired, or not trusted at all.
        holders.remember("ns/lease".into(), "ns/pod-a".into(), 0, Some(Duration::ZERO));
        assert_eq!(holders.holder("ns/lease", |_| Some(0)), None);
        holders.remember("ns/lease".into(), "ns/pod-a".into(), 0, Some(Duration::from_secs(60)));
        holders.remember("ns/lease".into(), "ns/pod-a".into(), 0, None);
        assert_eq!(holders.holder("ns/lease", |_| Some(0)), None);
    }
}
