//! What a VolumeReplication asks, decided without I/O: the calls for a desired state, the
//! conditions each outcome sets (upstream's types, reasons and messages, see "Replication
//! conditions" in docs/volumereplication.md), and the info-poll interval.
use std::collections::BTreeMap;
use std::time::Duration;

use api::replication::{ObservedReplicationState, ReplicationState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::core::status::{condition, set_condition};

/// How often a primary's replication info is read: half the class's `schedulingInterval` (the
/// interval itself when it is under 2 minutes); an hour when it is missing or unreadable, as
/// upstream.
pub fn info_interval(parameters: Option<&BTreeMap<String, String>>) -> Duration {
    let interval =
        parameters.and_then(|p| p.get("schedulingInterval")).and_then(|t| go_flags::parse_go_duration(t.trim()).ok());
    match interval {
        Some(d) if d.is_zero() => Duration::from_secs(3600),
        Some(d) if d < Duration::from_secs(120) => d,
        Some(d) => d / 2,
        None => Duration::from_secs(3600),
    }
}

/// A duration as Go prints it (`1.5s`, `2m3s`, `1h0m0s`, `250ms`), as upstream's
/// `lastSyncDuration`.
pub fn go_duration_string(d: Duration) -> String {
    let total = d.as_secs_f64();
    if total < 1.0 {
        if d.is_zero() {
            return "0s".into();
        }
        let (value, unit) = if d.as_nanos() < 1_000 {
            (d.as_nanos() as f64, "ns")
        } else if d.as_nanos() < 1_000_000 {
            (d.as_nanos() as f64 / 1e3, "µs")
        } else {
            (d.as_nanos() as f64 / 1e6, "ms")
        };
        return format!("{}{unit}", trim(value));
    }
    let hours = d.as_secs() / 3600;
    let minutes = (d.as_secs() % 3600) / 60;
    let seconds = (d.as_secs() % 60) as f64 + f64::from(d.subsec_nanos()) / 1e9;
    match (hours, minutes) {
        (0, 0) => format!("{}s", trim(seconds)),
        (0, m) => format!("{m}m{}s", trim(seconds)),
        (h, m) => format!("{h}h{m}m{}s", trim(seconds)),
    }
}

fn trim(value: f64) -> String {
    let text = format!("{value:.9}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A call to the sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Enable,
    Promote,
    Demote,
    Resync { force: bool },
}

/// The calls that bring the volume from `current` to `desired`, as upstream: enable and promote a
/// volume that is not primary yet; demote a volume that is not secondary yet (the first pass of a
/// secondary), then keep demoting and resyncing; resync with force when asked to.
pub fn plan(desired: ReplicationState, current: Option<ObservedReplicationState>, auto_resync: bool) -> Vec<Call> {
    match desired {
        ReplicationState::Primary if current == Some(ObservedReplicationState::Primary) => Vec::new(),
        ReplicationState::Primary => vec![Call::Enable, Call::Promote],
        ReplicationState::Secondary if current != Some(ObservedReplicationState::Secondary) => vec![Call::Demote],
        ReplicationState::Secondary => vec![Call::Demote, Call::Resync { force: auto_resync }],
        ReplicationState::Resync => vec![Call::Resync { force: true }],
    }
}

/// The state and message a successful pass reports.
pub fn reported(desired: ReplicationState) -> (ObservedReplicationState, &'static str) {
    match desired {
        ReplicationState::Primary => (ObservedReplicationState::Primary, "volume is marked primary"),
        ReplicationState::Secondary => (ObservedReplicationState::Secondary, "volume is marked secondary"),
        ReplicationState::Resync => (ObservedReplicationState::Secondary, "volume is marked for resyncing"),
    }
}

/// Conditions after promoting. `Validated` is set too (upstream leaves it as an earlier failure
/// left it, with that pass's generation, which a DR orchestrator reads as stale for ever).
/// [differs: validated-on-promote]
pub fn promoted(conditions: &[Condition], subject: &str, generation: Option<i64>) -> Vec<Condition> {
    let set = [
        ("Completed", true, "Promoted", "is promoted to primary and replicating to secondary"),
        ("Degraded", false, "Healthy", "is healthy"),
        ("Resyncing", false, "NotResyncing", "is not resyncing"),
        ("Validated", true, "PrerequisiteMet", "is validated and met all prerequisites"),
    ];
    apply(conditions, subject, generation, &set)
}

/// Conditions after demoting (a secondary is degraded until a resync reports it ready).
pub fn demoted(conditions: &[Condition], subject: &str, generation: Option<i64>) -> Vec<Condition> {
    let set = [
        ("Completed", true, "Demoted", "is demoted to secondary"),
        ("Degraded", true, "VolumeDegraded", "is degraded"),
        ("Resyncing", false, "NotResyncing", "is not resyncing"),
    ];
    let mut out = apply(conditions, subject, generation, &set);
    out.retain(|c| c.type_ != "Replicating");
    out
}

/// Conditions after a resync call: still resyncing, or in step with the primary (`ready`).
pub fn resynced(conditions: &[Condition], subject: &str, generation: Option<i64>, ready: bool) -> Vec<Condition> {
    let set: &[(&str, bool, &str, &str)] = if ready {
        &[
            ("Completed", true, "Demoted", "is demoted to secondary"),
            ("Degraded", false, "Healthy", "is demoted to secondary"),
            ("Resyncing", false, "NotResyncing", "is not resyncing"),
        ]
    } else {
        &[
            ("Completed", true, "Demoted", "is demoted to secondary"),
            ("Degraded", true, "VolumeDegraded", "is degraded"),
            ("Resyncing", true, "ResyncTriggered", "is resyncing changes from primary to secondary"),
        ]
    };
    let mut out = apply(conditions, subject, generation, set);
    out.retain(|c| c.type_ != "Replicating");
    out
}

/// What a failure was trying to do: promote (enable included), demote, or resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Promote,
    Demote,
    Resync,
}

impl Attempt {
    /// The attempt of a call.
    pub fn of_call(call: Call) -> Self {
        match call {
            Call::Enable | Call::Promote => Attempt::Promote,
            Call::Demote => Attempt::Demote,
            Call::Resync { .. } => Attempt::Resync,
        }
    }

    /// The attempt the spec asks for (a failure before any call is one of it).
    pub fn of_spec(desired: ReplicationState) -> Self {
        match desired {
            ReplicationState::Primary => Attempt::Promote,
            ReplicationState::Secondary => Attempt::Demote,
            ReplicationState::Resync => Attempt::Resync,
        }
    }
}

/// Conditions after a failure, as upstream's: `Completed` False with `what` failed (for example
/// "failed to promote volume"), `Degraded` True with the detail, `Resyncing` False; a failed
/// promotion says the prerequisites were met (`Validated` True).
pub fn failed(
    conditions: &[Condition],
    subject: &str,
    generation: Option<i64>,
    attempt: Attempt,
    (what, detail): (&str, &str),
) -> Vec<Condition> {
    let (reason, verb, resyncing_reason) = match attempt {
        Attempt::Promote => ("FailedToPromote", "promote", "NotResyncing"),
        Attempt::Demote => ("FailedToDemote", "demote", "NotResyncing"),
        Attempt::Resync => ("FailedToResync", "resync", "FailedToResync"),
    };
    let mut out = set_condition(conditions, condition("Completed", false, reason, what, generation));
    let degraded = format!("{subject} failed to {verb}: {detail}");
    out = set_condition(&out, condition("Degraded", true, "Error", &degraded, generation));
    let resyncing = format!("{subject} is not resyncing");
    out = set_condition(&out, condition("Resyncing", false, resyncing_reason, &resyncing, generation));
    if attempt == Attempt::Promote {
        let validated = format!("{subject} is validated and met all prerequisites");
        out = set_condition(&out, condition("Validated", true, "PrerequisiteMet", &validated, generation));
    }
    out
}

/// Conditions when the driver refuses to enable replication (FAILED_PRECONDITION): the
/// prerequisites are not met (`Validated` False), and the promotion failed.
pub fn prerequisite_not_met(
    conditions: &[Condition],
    subject: &str,
    generation: Option<i64>,
    (what, detail): (&str, &str),
) -> Vec<Condition> {
    let promote = format!("{subject} failed to promote");
    let mut out = set_condition(conditions, condition("Completed", false, "FailedToPromote", &promote, generation));
    out = set_condition(&out, condition("Degraded", true, "Error", what, generation));
    let resyncing = format!("{subject} is not resyncing");
    out = set_condition(&out, condition("Resyncing", false, "NotResyncing", &resyncing, generation));
    let validated = format!("failed to meet prerequisite: {detail}");
    set_condition(&out, condition("Validated", false, "PrerequisiteNotMet", &validated, generation))
}

/// The `Replicating` condition from a replication info status (HEALTHY, DEGRADED, ERROR, else
/// unknown), with the driver's message after a colon, as upstream writes it.
pub fn replicating(subject: &str, info_status: &str, detail: &str, generation: Option<i64>) -> Condition {
    let (status, reason, what) = match info_status {
        "HEALTHY" => ("True", "Replicating", "is replicating"),
        "DEGRADED" | "ERROR" => ("False", "NotReplicating", "is not replicating"),
        _ => ("Unknown", "Replicating", "replication status is unknown"),
    };
    let mut next = condition("Replicating", true, reason, &format!("{subject} {what}: {detail}"), generation);
    next.status = status.into();
    next
}

fn apply(
    conditions: &[Condition],
    subject: &str,
    generation: Option<i64>,
    set: &[(&str, bool, &str, &str)],
) -> Vec<Condition> {
    set.iter().fold(conditions.to_vec(), |out, (type_, status, reason, what)| {
        set_condition(&out, condition(type_, *status, reason, &format!("{subject} {what}"), generation))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::replication::go_error;
    use ObservedReplicationState as Observed;
    use ReplicationState as Desired;

    #[test]
    fn the_plan_follows_upstreams_state_machine() {
        assert_eq!(plan(Desired::Primary, None, false), [Call::Enable, Call::Promote]);
        assert_eq!(plan(Desired::Primary, Some(Observed::Secondary), false), [Call::Enable, Call::Promote]);
        assert!(plan(Desired::Primary, Some(Observed::Primary), false).is_empty());
        assert_eq!(plan(Desired::Secondary, Some(Observed::Primary), true), [Call::Demote]);
        assert_eq!(
            plan(Desired::Secondary, Some(Observed::Secondary), true),
            [Call::Demote, Call::Resync { force: true }]
        );
        assert_eq!(
            plan(Desired::Secondary, Some(Observed::Secondary), false),
            [Call::Demote, Call::Resync { force: false }]
        );
        assert_eq!(plan(Desired::Resync, Some(Observed::Secondary), false), [Call::Resync { force: true }]);
    }

    #[test]
    fn go_durations_and_the_info_interval() {
        let with = |v: &str| info_interval(Some(&[("schedulingInterval".to_owned(), v.to_owned())].into()));
        assert_eq!(with("1m"), Duration::from_secs(60));
        assert_eq!(with("10m"), Duration::from_secs(300));
        assert_eq!(with("junk"), Duration::from_secs(3600));
        assert_eq!(with("0"), Duration::from_secs(3600), "zero is no interval");
        assert_eq!(with("1.5h"), Duration::from_secs(2700));
        assert_eq!(info_interval(None), Duration::from_secs(3600));
        assert_eq!(go_duration_string(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration_string(Duration::from_secs(123)), "2m3s");
        assert_eq!(go_duration_string(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration_string(Duration::from_millis(250)), "250ms");
        assert_eq!(go_duration_string(Duration::ZERO), "0s");
    }

    #[test]
    fn conditions_carry_upstreams_reasons_and_messages() {
        let of = |conditions: &[Condition], type_: &str| conditions.iter().find(|c| c.type_ == type_).cloned().unwrap();
        let promoted = promoted(&[], "volume", Some(1));
        let completed = of(&promoted, "Completed");
        assert_eq!((completed.reason.as_str(), completed.status.as_str()), ("Promoted", "True"));
        assert_eq!(completed.message, "volume is promoted to primary and replicating to secondary");
        let demoted = demoted(&promoted, "volume group", Some(2));
        let degraded = of(&demoted, "Degraded");
        assert_eq!(
            (degraded.reason.as_str(), degraded.message.as_str()),
            ("VolumeDegraded", "volume group is degraded")
        );
        assert!(demoted.iter().all(|c| c.type_ == "Validated" || c.observed_generation == Some(2)));
        let resyncing = resynced(&demoted, "volume", Some(2), false);
        assert_eq!(of(&resyncing, "Resyncing").reason, "ResyncTriggered");
        let ready = resynced(&resyncing, "volume", Some(2), true);
        let degraded = of(&ready, "Degraded");
        assert_eq!((degraded.status.as_str(), degraded.message.as_str()), ("False", "volume is demoted to secondary"));
        assert_eq!(replicating("volume", "HEALTHY", "", None).status, "True");
        assert_eq!(replicating("volume", "HEALTHY", "", None).message, "volume is replicating: ");
        assert_eq!(
            replicating("volume", "DEGRADED", "slow link", None).message,
            "volume is not replicating: slow link"
        );
        let unknown = replicating("volume", "UNKNOWN", "", None);
        assert_eq!((unknown.status.as_str(), unknown.reason.as_str()), ("Unknown", "Replicating"));
    }

    #[test]
    fn failures_set_upstreams_four_conditions() {
        let of = |conditions: &[Condition], type_: &str| conditions.iter().find(|c| c.type_ == type_).cloned();
        let status = tonic::Status::resource_exhausted("full");
        let detail = go_error(&status);
        assert_eq!(detail, "rpc error: code = ResourceExhausted desc = full");
        let promote = failed(&[], "volume", Some(3), Attempt::Promote, ("failed to promote volume", &detail));
        let completed = of(&promote, "Completed").unwrap();
        assert_eq!(
            (completed.reason.as_str(), completed.message.as_str()),
            ("FailedToPromote", "failed to promote volume")
        );
        let degraded = of(&promote, "Degraded").unwrap();
        assert_eq!(degraded.message, "volume failed to promote: rpc error: code = ResourceExhausted desc = full");
        assert_eq!(of(&promote, "Validated").unwrap().reason, "PrerequisiteMet");
        assert_eq!(of(&promote, "Resyncing").unwrap().reason, "NotResyncing");
        // A resync failure takes Completed down too, and says so in Resyncing.
        let resync = failed(&ready_secondary(), "volume", Some(4), Attempt::Resync, ("failed to resync volume", "x"));
        let completed = of(&resync, "Completed").unwrap();
        assert_eq!((completed.status.as_str(), completed.reason.as_str()), ("False", "FailedToResync"));
        assert_eq!(of(&resync, "Resyncing").unwrap().reason, "FailedToResync");
        assert!(resync.iter().all(|c| c.observed_generation == Some(4)));
        let demote = failed(&[], "volume", Some(1), Attempt::Demote, ("failed to demote volume", "x"));
        assert_eq!(of(&demote, "Completed").unwrap().reason, "FailedToDemote");
        assert!(of(&demote, "Validated").is_none());
        let refused = prerequisite_not_met(&[], "volume", Some(1), ("failed to enable volume replication", "why"));
        let validated = of(&refused, "Validated").unwrap();
        assert_eq!(
            (validated.status.as_str(), validated.message.as_str()),
            ("False", "failed to meet prerequisite: why")
        );
        assert_eq!(of(&refused, "Completed").unwrap().message, "volume failed to promote");
        assert_eq!(of(&refused, "Degraded").unwrap().message, "failed to enable volume replication");
    }

    fn ready_secondary() -> Vec<Condition> {
        let demoted = demoted(&[], "volume", Some(4));
        resynced(&demoted, "volume", Some(4), true)
    }
}
