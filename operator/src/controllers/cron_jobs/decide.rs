//! What a cron job (ReclaimSpaceCronJob, EncryptionKeyRotationCronJob — one mechanism for
//! both) should do now, decided from its spec, its children and the clock: which children to
//! prune, which run to start, what its status says, and when to look again. Pure: the
//! reconciler fetches, this decides, the reconciler acts.
use api::csiaddons::ConcurrencyPolicy;

use crate::schedule::Schedule;

/// Upstream stops catching up past this many missed runs; we start the latest instead and say so.
/// [differs: cron-missed-runs]
const MANY_MISSED: usize = 100;
/// Bound on the walk over missed runs (a schedule every second, missed for a day, is 86,400).
const WALK_LIMIT: usize = 200_000;

/// How a child job ended, if it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Active,
    Succeeded,
    Failed,
}

/// A job this cron job created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    pub name: String,
    /// The `csiaddons.openshift.io/scheduled-at` annotation, in seconds.
    pub scheduled_at: Option<i64>,
    pub outcome: Outcome,
    pub start_time: Option<i64>,
    pub completion_time: Option<i64>,
}

/// Everything the decision needs; times in seconds since the epoch.
#[derive(Debug, Clone)]
pub struct CronInput<'a> {
    pub name: &'a str,
    pub schedule: &'a Schedule,
    pub created: i64,
    pub last_schedule: Option<i64>,
    pub starting_deadline: Option<i64>,
    pub concurrency: ConcurrencyPolicy,
    pub suspend: bool,
    pub successful_limit: usize,
    pub failed_limit: usize,
    /// This cron job's stagger: runs start this many seconds after their scheduled time.
    pub stagger: i64,
    pub now: i64,
    pub children: &'a [Child],
}

/// What to do about the run that is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CronAction {
    /// Nothing is due.
    Wait,
    /// Start the run scheduled at `scheduled_at` as job `name`.
    Create { name: String, scheduled_at: i64 },
    /// `Replace`: delete the active job, then start the run.
    Replace { delete: String, name: String, scheduled_at: i64 },
    /// A run is due but does not start; `reason` says why (for an event).
    Skip { reason: String },
}

/// The status fields the cron job reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CronStatus {
    pub last_schedule: Option<i64>,
    pub last_successful: Option<i64>,
    pub active: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronDecision {
    /// Children beyond the history limits, oldest first.
    pub prune: Vec<String>,
    pub action: CronAction,
    pub status: CronStatus,
    /// Seconds until the next run is due (none while suspended or when the schedule never fires).
    pub requeue_after: Option<i64>,
    /// Something the user should hear about that did not stop the decision (a warning event).
    pub warning: Option<String>,
}

/// The child job for the run scheduled at `scheduled_at`, not at its staggered start (upstream's
/// main branch names it after the start): deterministic, so a run can never be started twice.
/// [differs: cron-child-names]
/// Shortened with a hash when the cron job's name is long (upstream's child of a 253-character
/// cron job has a name the API server refuses). [differs: cron-long-names]
pub fn child_name(cron_job: &str, scheduled_at: i64) -> String {
    crate::names::fit(&format!("{cron_job}-{scheduled_at}"))
}

/// The stagger of a cron job: FNV-32a of its UID modulo the window (seconds), as upstream;
/// a window of 0 turns it off.
pub fn stagger_offset(uid: &str, window: i64) -> i64 {
    if window <= 0 {
        return 0;
    }
    let hash = uid.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    i64::from(hash) % window
}

/// The oldest children beyond `limit` among those with `outcome`, by start time (none first).
fn beyond_limit(children: &[Child], outcome: Outcome, limit: usize) -> Vec<String> {
    let mut finished: Vec<&Child> = children.iter().filter(|c| c.outcome == outcome).collect();
    finished.sort_by_key(|c| (c.start_time, c.name.clone()));
    let excess = finished.len().saturating_sub(limit);
    finished.into_iter().take(excess).map(|c| c.name.clone()).collect()
}

pub fn decide(input: &CronInput<'_>) -> CronDecision {
    let children = input.children;
    // The newest active child, if several (they should not be).
    let active = children
        .iter()
        .filter(|c| c.outcome == Outcome::Active)
        .max_by_key(|c| (c.scheduled_at, c.name.clone()))
        .map(|c| c.name.clone());
    let last_successful =
        children.iter().filter(|c| c.outcome == Outcome::Succeeded).filter_map(|c| c.completion_time).max();
    let newest_child = children.iter().filter_map(|c| c.scheduled_at).max();
    let mut status =
        CronStatus { last_schedule: input.last_schedule.max(newest_child), last_successful, active: active.clone() };
    let mut prune = beyond_limit(children, Outcome::Succeeded, input.successful_limit);
    prune.extend(beyond_limit(children, Outcome::Failed, input.failed_limit));
    let decision = |action, status, requeue_after, warning| CronDecision {
        prune: prune.clone(),
        action,
        status,
        requeue_after,
        warning,
    };

    if input.suspend {
        return decision(CronAction::Wait, status, None, None);
    }
    let offset = input.stagger;
    // Runs whose start (scheduled time + stagger) fell in (earliest, now]; runs older than the
    // starting deadline are not started at all (they are outside the window).
    let mut earliest = status.last_schedule.map_or(input.created, |t| t + offset);
    if let Some(deadline) = input.starting_deadline {
        earliest = earliest.max(input.now - deadline);
    }
    let (mut missed, mut count, mut cursor, mut next_run) = (None, 0usize, earliest - offset, None);
    while let Some(t) = input.schedule.next_after(cursor) {
        if t > input.now - offset {
            next_run = Some(t);
            break;
        }
        missed = Some(t);
        count += 1;
        cursor = t;
        if count >= WALK_LIMIT {
            let why =
                format!("the schedule fired more than {WALK_LIMIT} times since the last run; waiting for the next");
            let requeue = input.schedule.next_after(input.now - offset).map(|t| (t + offset - input.now).max(1));
            return decision(CronAction::Skip { reason: why }, status, requeue, None);
        }
    }
    // The next run of the same chain (for `@every`, runs follow from the last one).
    let requeue_after = next_run.map(|t| (t + offset - input.now).max(1));
    let Some(scheduled_at) = missed else {
        return decision(CronAction::Wait, status, requeue_after, None);
    };
    let warning = (count > MANY_MISSED)
        .then(|| format!("{count} runs were missed (more than {MANY_MISSED}); starting only the latest"));
    let name = child_name(input.name, scheduled_at);
    if children.iter().any(|c| c.name == name) {
        // Already started (our own earlier pass): nothing more to do for this run.
        return decision(CronAction::Wait, status, requeue_after, warning);
    }
    let action = match (active, input.concurrency) {
        (Some(running), ConcurrencyPolicy::Forbid) => {
            CronAction::Skip { reason: format!("job {running} is still running and the concurrency policy is Forbid") }
        }
        (Some(running), ConcurrencyPolicy::Replace) => {
            status.active = Some(name.clone());
            status.last_schedule = Some(scheduled_at);
            CronAction::Replace { delete: running, name, scheduled_at }
        }
        (None, _) => {
            status.active = Some(name.clone());
            status.last_schedule = Some(scheduled_at);
            CronAction::Create { name, scheduled_at }
        }
    };
    decision(action, status, requeue_after, warning)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60;
    /// 2026-11-23T10:00:00Z.
    const T0: i64 = 1_795_428_000;

    fn child(name: &str, outcome: Outcome, start: i64) -> Child {
        Child {
            name: name.into(),
            scheduled_at: Some(start),
            outcome,
            start_time: Some(start),
            completion_time: (outcome != Outcome::Active).then_some(start + 10),
        }
    }

    fn input<'a>(schedule: &'a Schedule, children: &'a [Child], now: i64) -> CronInput<'a> {
        CronInput {
            name: "weekly-trim",
            schedule,
            created: T0,
            last_schedule: None,
            starting_deadline: None,
            concurrency: ConcurrencyPolicy::Forbid,
            suspend: false,
            successful_limit: 3,
            failed_limit: 1,
            stagger: 0,
            now,
            children,
        }
    }

    #[test]
    fn a_due_run_starts_once_with_a_deterministic_name() {
        let every5 = Schedule::parse("*/5 * * * *").unwrap();
        let d = decide(&input(&every5, &[], T0 + 7 * MINUTE));
        assert_eq!(
            d.action,
            CronAction::Create { name: format!("weekly-trim-{}", T0 + 5 * MINUTE), scheduled_at: T0 + 5 * MINUTE }
        );
        assert_eq!(d.requeue_after, Some(3 * MINUTE));
        assert_eq!(d.status.last_schedule, Some(T0 + 5 * MINUTE));
        // The next pass sees the child: nothing new to start.
        let started = [child(&format!("weekly-trim-{}", T0 + 5 * MINUTE), Outcome::Active, T0 + 5 * MINUTE)];
        let d = decide(&input(&every5, &started, T0 + 8 * MINUTE));
        assert_eq!(d.action, CronAction::Wait);
        assert_eq!(d.status.active.as_deref(), Some(started[0].name.as_str()));
    }

    #[test]
    fn forbid_skips_and_replace_swaps_a_running_job() {
        let every5 = Schedule::parse("*/5 * * * *").unwrap();
        let running = [child("weekly-trim-old", Outcome::Active, T0 - 5 * MINUTE)];
        let mut i = input(&every5, &running, T0 + 6 * MINUTE);
        i.last_schedule = Some(T0 - 5 * MINUTE);
        assert!(matches!(decide(&i).action, CronAction::Skip { reason } if reason.contains("Forbid")));
        i.concurrency = ConcurrencyPolicy::Replace;
        assert_eq!(
            decide(&i).action,
            CronAction::Replace {
                delete: "weekly-trim-old".into(),
                name: format!("weekly-trim-{}", T0 + 5 * MINUTE),
                scheduled_at: T0 + 5 * MINUTE
            }
        );
    }

    #[test]
    fn history_limits_prune_the_oldest_and_suspend_starts_nothing() {
        let hourly = Schedule::parse("@hourly").unwrap();
        let children: Vec<Child> = (0..5)
            .map(|i| child(&format!("s{i}"), Outcome::Succeeded, T0 + i * MINUTE))
            .chain((0..3).map(|i| child(&format!("f{i}"), Outcome::Failed, T0 + i * MINUTE)))
            .collect();
        let mut i = input(&hourly, &children, T0 + 10 * MINUTE);
        i.last_schedule = Some(T0);
        let d = decide(&i);
        assert_eq!(d.prune, ["s0", "s1", "f0", "f1"]);
        assert_eq!(d.status.last_successful, Some(T0 + 4 * MINUTE + 10));
        i.suspend = true;
        let d = decide(&i);
        assert_eq!((d.action, d.requeue_after), (CronAction::Wait, None));
        assert_eq!(d.prune.len(), 4, "limits apply while suspended too");
    }

    #[test]
    fn deadlines_stagger_and_many_missed_runs() {
        let every_minute = Schedule::parse("* * * * *").unwrap();
        // Run due at T0+1min, looked at 50 s later with a 30 s deadline: not started.
        let mut i = input(&every_minute, &[], T0 + MINUTE + 50);
        i.starting_deadline = Some(30);
        assert_eq!(decide(&i).action, CronAction::Wait);
        // With a 40 s stagger the same run starts at T0+1min+40s: within the deadline.
        i.stagger = 40;
        assert!(matches!(decide(&i).action, CronAction::Create { scheduled_at, .. } if scheduled_at == T0 + MINUTE));
        // Three hours without a pass: only the latest run starts, with a warning.
        let i = input(&every_minute, &[], T0 + 180 * MINUTE + 5);
        let d = decide(&i);
        assert_eq!(
            d.action,
            CronAction::Create { name: format!("weekly-trim-{}", T0 + 180 * MINUTE), scheduled_at: T0 + 180 * MINUTE }
        );
        assert!(d.warning.is_some_and(|w| w.contains("180 runs")));
    }

    #[test]
    fn every_seconds_schedules_fire_for_tests() {
        let every5s = Schedule::parse("@every 5s").unwrap();
        let d = decide(&input(&every5s, &[], T0 + 12));
        assert_eq!(d.action, CronAction::Create { name: format!("weekly-trim-{}", T0 + 10), scheduled_at: T0 + 10 });
        assert_eq!(d.requeue_after, Some(3));
    }

    #[test]
    fn stagger_is_stable_and_inside_the_window() {
        let a = stagger_offset("0b6d1f7e-uid", 7200);
        assert_eq!(a, stagger_offset("0b6d1f7e-uid", 7200));
        assert!((0..7200).contains(&a));
        assert_eq!(stagger_offset("anything", 0), 0);
        // FNV-32a("a") = 0xe40c292c.
        assert_eq!(stagger_offset("a", i64::from(u32::MAX)), 0xe40c_292c);
    }
}
