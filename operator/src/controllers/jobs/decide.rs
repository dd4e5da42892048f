//! The life of a one-shot job (ReclaimSpaceJob, EncryptionKeyRotationJob — one mechanism for
//! both): when to try again, when to give up, and, for reclaim space, which sidecars to call and
//! how much was reclaimed. Pure; the reconciler does the calls.
//!
//! Unlike upstream, retries wait for real (the standard backoff: 5 s doubling, at most 5 min) and
//! count attempts, not reconcile passes, so a job survives causes that last seconds (upstream's
//! spends all its retries within a second). [differs: job-retries]
use std::time::Duration;

use super::side::{ChosenSide, ReclaimSide, SideSource};
use crate::core::backoff::{Failures, Policy};

/// The capabilities that say a sidecar serves each side.
pub const RECLAIM_ONLINE: &str = "reclaim_space.ONLINE";
pub const RECLAIM_OFFLINE: &str = "reclaim_space.OFFLINE";

/// upstream's defaults, applied when the spec says 0.
pub const DEFAULT_BACK_OFF_LIMIT: i32 = 6;
pub const DEFAULT_RETRY_DEADLINE_SECONDS: i64 = 600;

/// A job's retry limits, defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub back_off_limit: u32,
    pub retry_deadline_seconds: i64,
}

impl Limits {
    /// As upstream: 0 (or a negative value, which admission rejects) means the default.
    pub fn from_spec(back_off_limit: i32, retry_deadline_seconds: i64) -> Self {
        Limits {
            back_off_limit: u32::try_from(back_off_limit)
                .ok()
                .filter(|n| *n > 0)
                .unwrap_or(DEFAULT_BACK_OFF_LIMIT.unsigned_abs()),
            retry_deadline_seconds: if retry_deadline_seconds > 0 {
                retry_deadline_seconds
            } else {
                DEFAULT_RETRY_DEADLINE_SECONDS
            },
        }
    }
}

/// The wait before attempt `attempt` (1 = the first retry): 5 s, 10 s, 20 s, … at most 5 min.
pub fn retry_delay(attempt: u32) -> Duration {
    Policy::STANDARD.delay(attempt)
}

/// Why a job ends Failed without another attempt, in upstream's words first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GiveUp {
    #[error(
        "Time limit reached: not done within retryDeadlineSeconds ({seconds} s) after {failures} failed attempt(s)"
    )]
    Deadline { seconds: i64, failures: u32 },
    /// The job's first pass came after its deadline: it waited for a worker all along.
    #[error(
        "Time limit reached: retryDeadlineSeconds ({0} s) passed before the manager could make a first attempt \
         (all its workers were busy, or no manager led); a longer retryDeadlineSeconds or more \
         max-concurrent-reconciles give jobs time to start"
    )]
    DeadlineBeforeFirstAttempt(i64),
    #[error("Maximum retry limit reached: backOffLimit is {0}")]
    BackOffLimit(u32),
}

/// What a job that has no result yet should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Make an attempt now.
    Attempt,
    /// Wait this long, then look again.
    Wait(Duration),
    /// Give up: the job ends Failed.
    GiveUp(GiveUp),
}

/// `created`, `now` and `last_failure` in seconds; `failures` = failed attempts so far.
/// The failures in a row before this pass, and when the last was: what this manager remembers,
/// else (after a restart) what the status says, due at once. A start time is written with the
/// first failed attempt, and `retries` counts the attempts after it.
pub fn failures_so_far(remembered: Option<Failures>, started: bool, retries: Option<i32>) -> (u32, Option<i64>) {
    match remembered {
        Some(failures) => (failures.count, Some(failures.last)),
        None if started => (retries.and_then(|n| u32::try_from(n).ok()).unwrap_or(0).saturating_add(1), None),
        None => (0, None),
    }
}

pub fn next_step(limits: Limits, created: i64, now: i64, failures: u32, last_failure: Option<i64>) -> Step {
    if now > created.saturating_add(limits.retry_deadline_seconds) {
        let seconds = limits.retry_deadline_seconds;
        return Step::GiveUp(match failures {
            0 => GiveUp::DeadlineBeforeFirstAttempt(seconds),
            _ => GiveUp::Deadline { seconds, failures },
        });
    }
    if failures > limits.back_off_limit {
        return Step::GiveUp(GiveUp::BackOffLimit(limits.back_off_limit));
    }
    match last_failure {
        Some(at) if failures > 0 => {
            let due = at.saturating_add(i64::try_from(retry_delay(failures).as_secs()).unwrap_or(i64::MAX));
            if now >= due { Step::Attempt } else { Step::Wait(Duration::from_secs((due - now).unsigned_abs())) }
        }
        _ => Step::Attempt,
    }
}

/// A reclaim-space call to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimCall {
    /// NodeReclaimSpace through the sidecar of this node (where the volume is attached).
    Node(String),
    /// ControllerReclaimSpace through the driver's leader sidecar.
    Controller,
}

/// What the pool holds for a reclaim: which sides can be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimSides {
    /// A sidecar on the node where the volume is attached offers online reclaim.
    pub node_online: bool,
    /// Some sidecar of the driver, on any node, offers online reclaim.
    pub driver_online: bool,
    /// Some sidecar of the driver offers offline reclaim.
    pub driver_offline: bool,
    /// The driver's leader sidecar offers offline reclaim.
    pub leader_offline: bool,
    /// What the driver offers is known: this manager has settled every CSIAddonsNode of the
    /// driver (`Roster::settled`), and holds at least one. Until then a side it lacks may be a
    /// sidecar not connected yet. Only a chosen side reads it (false otherwise).
    pub known: bool,
}

/// Why no reclaim-space call can be made now (worth retrying: sidecars come and go).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoReclaimCall {
    #[error(
        "node client not found: no sidecar of {driver} on node {node}, where the volume is attached, offers \
         reclaim_space.ONLINE (the driver's sidecars on other nodes do)"
    )]
    NodeSidecarMissing { driver: String, node: String },
    #[error(
        "no sidecar on node {node} offers reclaim_space.ONLINE, and no leader sidecar of {driver} offers reclaim_space.OFFLINE"
    )]
    NeitherSide { driver: String, node: String },
    #[error(
        "the volume is not attached, so online reclaim is not possible, and no leader sidecar of {driver} offers \
         reclaim_space.OFFLINE"
    )]
    NotAttached { driver: String },
    #[error(
        "controller client not found: a sidecar of {driver} offers reclaim_space.OFFLINE, but the sidecar holding \
         the driver's Lease is not known ({why})"
    )]
    LeaderMissing { driver: String, why: String },
    #[error(
        "the reclaim side is node ({from}), and PV {pv} is not attached to any node: node-side reclaim runs \
         where the volume is attached"
    )]
    SideNeedsAttachment { from: SideSource, pv: String },
    #[error(
        "the reclaim side is {side} ({from}), and no sidecar of driver {driver} offers {capability}: \
         the driver does not serve that side"
    )]
    SideNotServed { side: ReclaimSide, from: SideSource, driver: String, capability: &'static str },
    #[error(
        "the reclaim side is {side} ({from}), and no sidecar of driver {driver} offering {capability} is \
         connected yet"
    )]
    SideNotYet { side: ReclaimSide, from: SideSource, driver: String, capability: &'static str },
}

impl NoReclaimCall {
    /// Whether waiting cannot help: only what a user chose and the driver can never serve.
    pub fn permanent(&self) -> bool {
        matches!(self, NoReclaimCall::SideNeedsAttachment { .. } | NoReclaimCall::SideNotServed { .. })
    }
}

/// Which calls reclaim space for a volume, as upstream routes them: node-side on the node where
/// it is attached, if that node's sidecar offers online reclaim; controller-side if the leader
/// offers offline reclaim. An attached volume of a driver whose node sidecars offer online reclaim
/// waits for the sidecar of its node, as upstream ("node client not found"): reclaiming on the
/// controller side alone would leave the mounted filesystem's free blocks untrimmed and still
/// report success. Likewise a driver whose controller sidecars offer offline reclaim waits for
/// the one holding its Lease (elected, or seen by this manager, moments after a restart) rather
/// than report success for the node side alone. A driver without online reclaim anywhere reclaims
/// on the controller side, and one without offline reclaim on the node side (upstream requires the
/// controller side). `Err` says what is missing; `leader_why` is why no leader was found, if not.
/// [differs: reclaim-one-side]
///
/// A side the user chose (`side`) is the only call: `node` needs the volume attached, and a side the
/// driver is known not to offer fails rather than reclaim on the other.
pub fn reclaim_plan(
    (driver, pv): (&str, &str),
    attached_to: Option<&str>,
    sides: ReclaimSides,
    leader_why: &str,
    side: ChosenSide,
) -> Result<Vec<ReclaimCall>, NoReclaimCall> {
    match side.side {
        ReclaimSide::Both => both_sides(driver, attached_to, sides, leader_why),
        ReclaimSide::Node => node_side(driver, pv, attached_to, sides, side.from),
        ReclaimSide::Controller => controller_side(driver, sides, leader_why, side.from),
    }
}

fn node_side(
    driver: &str,
    pv: &str,
    attached_to: Option<&str>,
    sides: ReclaimSides,
    from: SideSource,
) -> Result<Vec<ReclaimCall>, NoReclaimCall> {
    let (side, capability, driver_name) = (ReclaimSide::Node, RECLAIM_ONLINE, driver.to_owned());
    if sides.known && !sides.driver_online {
        return Err(NoReclaimCall::SideNotServed { side, from, driver: driver_name, capability });
    }
    let Some(node) = attached_to else {
        return Err(NoReclaimCall::SideNeedsAttachment { from, pv: pv.to_owned() });
    };
    match (sides.node_online, sides.driver_online) {
        (true, _) => Ok(vec![ReclaimCall::Node(node.to_owned())]),
        (false, true) => Err(NoReclaimCall::NodeSidecarMissing { driver: driver_name, node: node.to_owned() }),
        (false, false) => Err(NoReclaimCall::SideNotYet { side, from, driver: driver_name, capability }),
    }
}

fn controller_side(
    driver: &str,
    sides: ReclaimSides,
    leader_why: &str,
    from: SideSource,
) -> Result<Vec<ReclaimCall>, NoReclaimCall> {
    let (side, capability, driver) = (ReclaimSide::Controller, RECLAIM_OFFLINE, driver.to_owned());
    match (sides.leader_offline, sides.driver_offline) {
        (true, _) => Ok(vec![ReclaimCall::Controller]),
        (false, true) => Err(NoReclaimCall::LeaderMissing { driver, why: leader_why.to_owned() }),
        (false, false) if sides.known => Err(NoReclaimCall::SideNotServed { side, from, driver, capability }),
        (false, false) => Err(NoReclaimCall::SideNotYet { side, from, driver, capability }),
    }
}

/// Upstream's routing: each side the driver offers.
fn both_sides(
    driver: &str,
    attached_to: Option<&str>,
    sides: ReclaimSides,
    leader_why: &str,
) -> Result<Vec<ReclaimCall>, NoReclaimCall> {
    let ReclaimSides { node_online, driver_online, driver_offline, leader_offline, known: _ } = sides;
    if driver_offline && !leader_offline {
        return Err(NoReclaimCall::LeaderMissing { driver: driver.to_owned(), why: leader_why.to_owned() });
    }
    if let Some(node) = attached_to
        && !node_online
        && driver_online
    {
        return Err(NoReclaimCall::NodeSidecarMissing { driver: driver.to_owned(), node: node.to_owned() });
    }
    let mut calls = Vec::new();
    if let Some(node) = attached_to
        && node_online
    {
        calls.push(ReclaimCall::Node(node.to_owned()));
    }
    if leader_offline {
        calls.push(ReclaimCall::Controller);
    }
    if calls.is_empty() {
        let driver = driver.to_owned();
        return Err(match attached_to {
            Some(node) => NoReclaimCall::NeitherSide { driver, node: node.to_owned() },
            None => NoReclaimCall::NotAttached { driver },
        });
    }
    Ok(calls)
}

/// Bytes reclaimed: the sum over the calls that reported both usages of pre − post (never
/// negative; upstream floors post − pre at 0, so space freed reads 0). `None` when no call
/// reported usage. [differs: reclaimed-space]
pub fn reclaimed_bytes(usages: &[(Option<i64>, Option<i64>)]) -> Option<i64> {
    let reported: Vec<i64> =
        usages.iter().filter_map(|(pre, post)| Some(pre.as_ref()?.saturating_sub(*post.as_ref()?).max(0))).collect();
    (!reported.is_empty()).then(|| reported.iter().fold(0i64, |sum, n| sum.saturating_add(*n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_passed_before_any_attempt_says_so_and_what_gives_jobs_time() {
        let limits = Limits::from_spec(6, 30);
        let Step::GiveUp(never) = next_step(limits, 0, 31, 0, None) else { panic!("past the deadline") };
        assert_eq!(never, GiveUp::DeadlineBeforeFirstAttempt(30));
        let message = never.to_string();
        assert!(
            message.starts_with("Time limit reached")
                && message.contains("before the manager could make a first attempt")
        );
        assert!(message.contains("max-concurrent-reconciles"), "{message}");
        let Step::GiveUp(tried) = next_step(limits, 0, 31, 2, Some(20)) else { panic!("past the deadline") };
        assert_eq!(
            tried.to_string(),
            "Time limit reached: not done within retryDeadlineSeconds (30 s) after 2 failed attempt(s)"
        );
    }

    #[test]
    fn after_a_restart_the_failures_so_far_come_from_the_status() {
        // Remembered: the count and when the last failure was.
        assert_eq!(failures_so_far(Some(Failures { count: 3, last: 50 }), true, Some(9)), (3, Some(50)));
        // Forgotten (a restart) with a start time: the first failure plus `retries`, due now.
        assert_eq!(failures_so_far(None, true, Some(3)), (4, None));
        assert_eq!(failures_so_far(None, true, None), (1, None));
        // Never failed.
        assert_eq!(failures_so_far(None, false, Some(3)), (0, None));
        // A backOffLimit of 4 still holds across the restart: the next failure is the fifth.
        let limits = Limits::from_spec(4, 0);
        let (so_far, _) = failures_so_far(None, true, Some(3));
        assert!(matches!(next_step(limits, 0, 10, so_far + 1, Some(10)), Step::GiveUp(_)));
    }

    #[test]
    fn zero_means_upstreams_defaults() {
        assert_eq!(Limits::from_spec(0, 0), Limits { back_off_limit: 6, retry_deadline_seconds: 600 });
        assert_eq!(Limits::from_spec(2, 30), Limits { back_off_limit: 2, retry_deadline_seconds: 30 });
        assert_eq!(Limits::from_spec(-1, -5), Limits { back_off_limit: 6, retry_deadline_seconds: 600 });
    }

    #[test]
    fn retries_wait_for_real_and_give_up_clearly() {
        let limits = Limits::from_spec(3, 600);
        assert_eq!(next_step(limits, 0, 0, 0, None), Step::Attempt);
        // First failure at t=1: the retry is due 5 s later, then 10 s, then 20 s.
        assert_eq!(next_step(limits, 0, 2, 1, Some(1)), Step::Wait(Duration::from_secs(4)));
        assert_eq!(next_step(limits, 0, 6, 1, Some(1)), Step::Attempt);
        assert_eq!(next_step(limits, 0, 20, 2, Some(15)), Step::Wait(Duration::from_secs(5)));
        assert_eq!(next_step(limits, 0, 60, 3, Some(40)), Step::Attempt);
        // The first try plus backOffLimit retries, then no more.
        assert!(
            matches!(next_step(limits, 0, 200, 4, Some(100)), Step::GiveUp(m) if m.to_string().contains("backOffLimit is 3"))
        );
        assert!(matches!(next_step(limits, 0, 601, 1, Some(500)), Step::GiveUp(m) if m.to_string().contains("600 s")));
        assert_eq!(retry_delay(1), Duration::from_secs(5));
        assert_eq!(retry_delay(7), Duration::from_secs(300));
        assert_eq!(retry_delay(u32::MAX), Duration::from_secs(300));
        // Six retries of the default limits span over five minutes, well inside the deadline.
        let total: Duration = (1..=6).map(retry_delay).sum();
        assert!(total >= Duration::from_secs(300) && total < Duration::from_secs(600), "{total:?}");
    }

    const DEFAULT: ChosenSide = ChosenSide { side: ReclaimSide::Both, from: SideSource::Default };

    fn plan(driver: &str, attached_to: Option<&str>, sides: ReclaimSides) -> Result<Vec<ReclaimCall>, NoReclaimCall> {
        reclaim_plan((driver, "pv-1"), attached_to, sides, "", DEFAULT)
    }

    #[test]
    fn reclaim_routing_uses_what_the_driver_offers() {
        use ReclaimCall::*;
        let sides = |node_online, driver_online, leader_offline| ReclaimSides {
            node_online,
            driver_online,
            driver_offline: leader_offline,
            leader_offline,
            known: true,
        };
        assert_eq!(plan("d", Some("n1"), sides(true, true, true)), Ok(vec![Node("n1".into()), Controller]));
        assert_eq!(plan("d", None, sides(false, true, true)), Ok(vec![Controller]));
        assert_eq!(plan("d", Some("n1"), sides(true, true, false)), Ok(vec![Node("n1".into())]), "online only works");
        // No online reclaim anywhere: the controller side alone.
        assert_eq!(plan("d", Some("n1"), sides(false, false, true)), Ok(vec![Controller]));
        let err = plan("rbd.csi.ceph.com", None, sides(false, true, false)).unwrap_err().to_string();
        assert!(err.contains("not attached") && err.contains("rbd.csi.ceph.com"), "{err}");
        let err = plan("d", Some("n1"), sides(false, false, false)).unwrap_err().to_string();
        assert!(err.contains("node n1"), "{err}");
        // The node's sidecar is missing while others offer online reclaim: wait for it.
        let err = plan("d", Some("n1"), sides(false, true, true)).unwrap_err().to_string();
        assert!(err.contains("node client not found") && err.contains("node n1"), "{err}");
        // A controller sidecar offers offline reclaim but none is known to lead: wait for it,
        // even though the node side alone could be done.
        let no_leader = ReclaimSides {
            node_online: true,
            driver_online: true,
            driver_offline: true,
            leader_offline: false,
            known: true,
        };
        let err = reclaim_plan(("d", "pv-1"), Some("n1"), no_leader, "no Lease ns/d-csi-addons", DEFAULT).unwrap_err();
        assert!(!err.permanent());
        let err = err.to_string();
        assert!(err.contains("controller client not found") && err.contains("no Lease ns/d-csi-addons"), "{err}");
    }

    #[test]
    fn a_chosen_side_is_the_only_call_and_one_the_driver_lacks_fails_the_job() {
        use ReclaimCall::*;
        let everything = ReclaimSides {
            node_online: true,
            driver_online: true,
            driver_offline: true,
            leader_offline: true,
            known: true,
        };
        let chosen = |side| ChosenSide { side, from: SideSource::Pvc };
        let plan = |attached_to, sides, side| reclaim_plan(("d", "pv-1"), attached_to, sides, "why", chosen(side));
        assert_eq!(plan(Some("n1"), everything, ReclaimSide::Node), Ok(vec![Node("n1".into())]));
        assert_eq!(plan(Some("n1"), everything, ReclaimSide::Controller), Ok(vec![Controller]));
        assert_eq!(plan(None, everything, ReclaimSide::Controller), Ok(vec![Controller]));
        assert_eq!(plan(Some("n1"), everything, ReclaimSide::Both), Ok(vec![Node("n1".into()), Controller]));

        // node on a volume that is not attached: failed at once, saying so.
        let unattached = plan(None, everything, ReclaimSide::Node).unwrap_err();
        assert!(unattached.permanent());
        assert_eq!(
            unattached.to_string(),
            "the reclaim side is node (the PVC's annotation csi-addons-rs.io/reclaim-side), and PV pv-1 is not \
             attached to any node: node-side reclaim runs where the volume is attached"
        );

        // A side no sidecar of the driver offers, every sidecar known: failed, naming side and driver.
        let controller_only = ReclaimSides { node_online: false, driver_online: false, ..everything };
        let lacking = plan(Some("n1"), controller_only, ReclaimSide::Node).unwrap_err();
        assert!(lacking.permanent());
        let message = lacking.to_string();
        assert!(
            message.contains("side is node") && message.contains("driver d offers reclaim_space.ONLINE"),
            "{message}"
        );
        let node_only = ReclaimSides { driver_offline: false, leader_offline: false, ..everything };
        let lacking = plan(Some("n1"), node_only, ReclaimSide::Controller).unwrap_err();
        assert!(lacking.permanent() && lacking.to_string().contains("reclaim_space.OFFLINE"), "{lacking}");

        // Not every sidecar connected yet (a start, a failover): a missing side is waited for.
        let unsettled = ReclaimSides { known: false, ..controller_only };
        let waiting = plan(Some("n1"), unsettled, ReclaimSide::Node).unwrap_err();
        assert!(!waiting.permanent() && waiting.to_string().contains("connected yet"), "{waiting}");
        let unsettled = ReclaimSides { known: false, ..node_only };
        assert!(!plan(None, unsettled, ReclaimSide::Controller).unwrap_err().permanent());
        // The node's own sidecar is missing while others offer online reclaim: waited for too.
        let elsewhere = ReclaimSides { node_online: false, ..everything };
        let waiting = plan(Some("n1"), elsewhere, ReclaimSide::Node).unwrap_err();
        assert!(!waiting.permanent() && waiting.to_string().contains("node client not found"), "{waiting}");
        // The leader is not known yet: waited for, whichever side asked for it.
        let no_leader = ReclaimSides { leader_offline: false, ..everything };
        let waiting = plan(Some("n1"), no_leader, ReclaimSide::Controller).unwrap_err();
        assert!(!waiting.permanent() && waiting.to_string().contains("controller client not found"), "{waiting}");
    }

    #[test]
    fn reclaimed_space_is_pre_minus_post() {
        assert_eq!(reclaimed_bytes(&[(Some(100), Some(40)), (Some(50), Some(45))]), Some(65));
        assert_eq!(reclaimed_bytes(&[(Some(10), Some(30))]), Some(0), "growth is not negative reclaim");
        assert_eq!(reclaimed_bytes(&[(None, Some(30)), (Some(5), None)]), None);
        assert_eq!(reclaimed_bytes(&[]), None);
    }
}
