//! The fault suites' one table (`make test-faults` against local processes, `make test-faults-cluster`
//! in the one-node cluster): per fault, what a batch of ReclaimSpaceJobs came to, and the checks
//! every row must pass.

/// What one fault left behind.
pub struct FaultRow {
    pub fault: &'static str,
    pub jobs: usize,
    /// Jobs without a result when the fault struck.
    pub in_flight: usize,
    pub succeeded: usize,
    /// Name and message of each Failed job.
    pub failed: Vec<(String, String)>,
    /// Jobs left without a result.
    pub stuck: usize,
    /// Succeeded jobs whose volume the driver never saw.
    pub lost: usize,
    /// Driver calls beyond one per job.
    pub duplicates: usize,
    /// Seconds from the fault until every job had a result (a figure, never asserted).
    pub recovery: f64,
    /// A column of the suite's own, if any: (heading, value).
    pub extra: Option<(&'static str, String)>,
}

/// Prints the table, then each distinct message of Failed jobs with the jobs that ended with it.
pub fn print(rows: &[FaultRow]) {
    let extra = rows.iter().find_map(|r| r.extra.as_ref().map(|(heading, _)| *heading)).unwrap_or_default();
    println!(
        "\n{:<34} {:>5} {:>9} {:>9} {:>6} {:>5} {:>4} {:>10} {:>10}  {extra}",
        "fault", "jobs", "in flight", "succeeded", "failed", "stuck", "lost", "duplicates", "recovery s"
    );
    for r in rows {
        println!(
            "{:<34} {:>5} {:>9} {:>9} {:>6} {:>5} {:>4} {:>10} {:>10.1}  {}",
            r.fault,
            r.jobs,
            r.in_flight,
            r.succeeded,
            r.failed.len(),
            r.stuck,
            r.lost,
            r.duplicates,
            r.recovery,
            r.extra.as_ref().map(|(_, value)| value.as_str()).unwrap_or_default()
        );
    }
    for r in rows {
        for (message, jobs) in by_message(&r.failed) {
            let more = if jobs.len() > 3 { format!(" and {} more", jobs.len() - 3) } else { String::new() };
            println!("  {}: {}{more} Failed: {message}", r.fault, jobs[..jobs.len().min(3)].join(", "));
        }
    }
}

/// The Failed jobs' names under each distinct message, in the order the messages first appear.
fn by_message(failed: &[(String, String)]) -> Vec<(&str, Vec<&str>)> {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for (job, message) in failed {
        match groups.iter_mut().find(|(m, _)| m == message) {
            Some((_, jobs)) => jobs.push(job),
            None => groups.push((message, vec![job])),
        }
    }
    groups
}

/// Every row: no job stuck, none lost, each ended, and each Failed one says why.
pub fn assert_nothing_stuck_or_lost(rows: &[FaultRow]) {
    for r in rows {
        assert_eq!(r.stuck, 0, "{}: jobs left without a result", r.fault);
        assert_eq!(r.lost, 0, "{}: jobs Succeeded without a driver call", r.fault);
        assert_eq!(r.succeeded + r.failed.len(), r.jobs, "{}", r.fault);
        for (job, message) in &r.failed {
            assert!(!message.trim().is_empty(), "{}: {job} Failed without a message", r.fault);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::by_message;

    #[test]
    fn failed_jobs_are_grouped_under_their_message_in_first_seen_order() {
        let failed: Vec<(String, String)> = [("a", "timeout"), ("b", "gone"), ("c", "timeout")]
            .iter()
            .map(|(j, m)| (j.to_string(), m.to_string()))
            .collect();
        assert_eq!(by_message(&failed), vec![("timeout", vec!["a", "c"]), ("gone", vec!["b"])]);
    }
}
