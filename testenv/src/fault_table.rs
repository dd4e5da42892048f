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

/// Prints the table, then each Failed job's message.
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
        for (job, message) in &r.failed {
            println!("  {}: {job} Failed: {message}", r.fault);
        }
    }
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
