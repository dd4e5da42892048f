//! Each driver's share of the job workers. A pass holds its worker for as long as the driver's
//! sidecar takes to answer, so a sidecar that stops answering (a network partition, a hung
//! driver) would otherwise end up holding every worker, and the jobs of every other driver would
//! wait for it. So the passes of one driver may hold at most three quarters of the workers at once
//! (all but one when there are fewer than eight, and the one when there is only one); the rest stay
//! free for the other drivers (upstream's workers all end up waiting on such a sidecar).
//! [differs: driver-share]
//!
//! A pass over its driver's share does not wait for one (waiting would hold a worker too): it is
//! queued, and run again as soon as a call of its driver ends. The queue remembers the driver of
//! each queued job, so the pass it is woken for takes its share before it reads its volume again:
//! a job that waits costs no API request.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;

use crate::primitives::locked;

/// A queued job: where to wake it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKey {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Default)]
struct DriverShare {
    running: usize,
    /// The jobs in line, each with the ticket it was queued under. An entry whose ticket is no
    /// longer its job's (the job took a share, went, or was queued again) is skipped when reached:
    /// leaving the line costs nothing, however long it is.
    line: VecDeque<(u64, JobKey)>,
}

/// A job over its driver's share, until a pass of it takes one.
struct Queued {
    driver: String,
    /// In line under this ticket; None once woken (its pass is on its way).
    ticket: Option<u64>,
}

#[derive(Default)]
struct Ledger {
    drivers: HashMap<String, DriverShare>,
    /// By UID.
    queued: HashMap<String, Queued>,
    tickets: u64,
}

impl Ledger {
    fn ticket(&mut self) -> u64 {
        self.tickets += 1;
        self.tickets
    }

    /// Wakes the first job in `driver`'s line if a share of it is free; forgets an idle driver.
    fn wake_next(&mut self, driver: &str, cap: usize, wake: &mpsc::UnboundedSender<JobKey>) {
        let Some(share) = self.drivers.get_mut(driver) else { return };
        if share.running < cap {
            while let Some((ticket, job)) = share.line.pop_front() {
                let Some(queued) = self.queued.get_mut(&job.uid).filter(|q| q.ticket == Some(ticket)) else { continue };
                // It stays queued, out of the line, until its pass takes the share: that pass knows
                // the driver without reading the volume again.
                queued.ticket = None;
                // Only a stopped controller has dropped the receiver; nothing is left to wake then.
                let _ = wake.unbounded_send(job);
                break;
            }
        }
        if share.running == 0 && share.line.is_empty() {
            self.drivers.remove(driver);
        }
    }
}

pub struct Shares {
    cap: usize,
    ledger: Mutex<Ledger>,
    wake: mpsc::UnboundedSender<JobKey>,
}

/// A share taken: given back when dropped, waking the first job in line for the same driver.
pub struct Held {
    shares: Arc<Shares>,
    driver: String,
}

/// The most passes of one driver at once, out of `workers`: a quarter of them, and at least one,
/// stays for the other drivers (with one worker, there is none to keep).
pub fn cap_for(workers: usize) -> usize {
    workers.saturating_sub((workers / 4).max(1)).max(1)
}

impl Shares {
    /// Shares of `workers`; the receiver yields the jobs to run again.
    pub fn new(workers: usize) -> (Arc<Self>, mpsc::UnboundedReceiver<JobKey>) {
        let (wake, woken) = mpsc::unbounded();
        (Arc::new(Shares { cap: cap_for(workers), ledger: Mutex::default(), wake }), woken)
    }

    /// The driver a queued job waits for.
    pub fn queued_for(&self, uid: &str) -> Option<String> {
        locked(&self.ledger).queued.get(uid).map(|q| q.driver.clone())
    }

    /// A share of `driver` for `job`, or None with the job in line (once) until one is given back.
    /// A job woken but beaten to the share goes back to the front of the line.
    pub fn take(self: &Arc<Self>, driver: &str, job: &JobKey) -> Option<Held> {
        let mut ledger = locked(&self.ledger);
        let ticket = ledger.ticket();
        let Ledger { drivers, queued, .. } = &mut *ledger;
        let share = drivers.entry(driver.to_owned()).or_default();
        if share.running < self.cap {
            share.running += 1;
            queued.remove(&job.uid);
            return Some(Held { shares: Arc::clone(self), driver: driver.to_owned() });
        }
        match queued.get_mut(&job.uid) {
            Some(Queued { ticket: Some(_), .. }) => {}
            Some(woken) => {
                woken.ticket = Some(ticket);
                share.line.push_front((ticket, job.clone()));
            }
            None => {
                queued.insert(job.uid.clone(), Queued { driver: driver.to_owned(), ticket: Some(ticket) });
                share.line.push_back((ticket, job.clone()));
            }
        }
        None
    }

    /// Forgets a job that finished or went; if it had been woken, the next in line is.
    pub fn forget(&self, uid: &str) {
        let mut ledger = locked(&self.ledger);
        if let Some(gone) = ledger.queued.remove(uid)
            && gone.ticket.is_none()
        {
            ledger.wake_next(&gone.driver, self.cap, &self.wake);
        }
    }

    /// Forgets queued jobs that no longer exist, and the line's stale entries.
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        let mut ledger = locked(&self.ledger);
        let mut woken_gone = Vec::new();
        ledger.queued.retain(|uid, q| {
            let keep = live.contains(uid);
            if !keep && q.ticket.is_none() {
                woken_gone.push(q.driver.clone());
            }
            keep
        });
        let Ledger { drivers, queued, .. } = &mut *ledger;
        for share in drivers.values_mut() {
            share.line.retain(|(ticket, job)| queued.get(&job.uid).is_some_and(|q| q.ticket == Some(*ticket)));
        }
        for driver in woken_gone {
            ledger.wake_next(&driver, self.cap, &self.wake);
        }
        ledger.drivers.retain(|_, share| share.running > 0 || !share.line.is_empty());
    }

    /// How many jobs are in line for a share.
    pub fn waiting(&self) -> usize {
        locked(&self.ledger).queued.values().filter(|q| q.ticket.is_some()).count()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut ledger = locked(&self.shares.ledger);
        if let Some(share) = ledger.drivers.get_mut(&self.driver) {
            share.running = share.running.saturating_sub(1);
        }
        ledger.wake_next(&self.driver, self.shares.cap, &self.shares.wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: usize) -> JobKey {
        JobKey { uid: format!("uid-{n}"), namespace: "ns".into(), name: format!("job-{n}") }
    }

    fn line_of(shares: &Shares, driver: &str) -> usize {
        let ledger = locked(&shares.ledger);
        ledger.drivers.get(driver).map_or(0, |share| share.line.len())
    }

    #[test]
    fn a_quarter_of_the_workers_and_at_least_one_stays_for_other_drivers() {
        assert_eq!(cap_for(100), 75);
        assert_eq!(cap_for(8), 6);
        assert_eq!(cap_for(4), 3);
        assert_eq!(cap_for(3), 2);
        assert_eq!(cap_for(2), 1);
        assert_eq!(cap_for(1), 1, "one worker is never refused");
        assert_eq!(cap_for(0), 1);
    }

    #[test]
    fn a_driver_over_its_share_queues_its_jobs_and_wakes_them_in_order_as_calls_end() {
        let (shares, mut woken) = Shares::new(4);
        let mut held: Vec<Held> = (0..3).map(|n| shares.take("a", &job(n)).expect("within the share")).collect();
        assert!(shares.take("a", &job(3)).is_none(), "the fourth pass of one driver is over its share");
        assert!(shares.take("a", &job(4)).is_none());
        assert!(shares.take("a", &job(3)).is_none(), "a job queued again is queued once");
        assert_eq!((shares.waiting(), line_of(&shares, "a")), (2, 2));
        assert_eq!(shares.queued_for("uid-3").as_deref(), Some("a"));
        // Another driver's pass gets the worker left.
        let other = shares.take("b", &job(9)).expect("another driver is not held up by a's");
        drop(other);
        assert!(woken.try_recv().is_err(), "b had no one queued");

        drop(held.remove(0));
        assert_eq!(woken.try_recv().ok(), Some(job(3)), "the first queued job is woken");
        assert_eq!(shares.queued_for("uid-3").as_deref(), Some("a"), "its pass knows the driver");
        let third = shares.take("a", &job(3)).expect("the woken job takes the share given back");
        assert_eq!(shares.queued_for("uid-3"), None);
        assert!(woken.try_recv().is_err(), "one call ended, one job woken");
        assert!(shares.take("a", &job(6)).is_none(), "in line behind job 4");
        drop(third);
        assert_eq!(woken.try_recv().ok(), Some(job(4)));
        // Woken, but beaten to the share by a pass run otherwise: back at the front of the line.
        let fifth = shares.take("a", &job(5)).unwrap_or_else(|| panic!("a share was free"));
        assert!(shares.take("a", &job(4)).is_none());
        drop(fifth);
        assert_eq!(woken.try_recv().ok(), Some(job(4)), "the job beaten to its share is woken first");
        drop(held);
        assert_eq!(woken.try_recv().ok(), Some(job(6)));
        assert!(woken.try_recv().is_err(), "no one else is in line");
    }

    #[test]
    fn a_woken_job_that_finishes_elsewhere_passes_its_turn_on() {
        let (shares, mut woken) = Shares::new(1);
        let held = shares.take("a", &job(0)).unwrap_or_else(|| panic!("the first share"));
        assert!(shares.take("a", &job(1)).is_none());
        assert!(shares.take("a", &job(2)).is_none());
        drop(held);
        assert_eq!(woken.try_recv().ok(), Some(job(1)));
        shares.forget("uid-1");
        assert_eq!(woken.try_recv().ok(), Some(job(2)), "the free share is not left idle");
    }

    #[test]
    fn jobs_gone_leave_the_queue_and_an_idle_driver_leaves_the_ledger() {
        let (shares, mut woken) = Shares::new(1);
        let held = shares.take("a", &job(0)).unwrap_or_else(|| panic!("the first share"));
        assert!(shares.take("a", &job(1)).is_none());
        assert!(shares.take("a", &job(2)).is_none());
        assert!(shares.take("a", &job(3)).is_none());
        shares.retain(&["uid-0".to_owned(), "uid-2".to_owned(), "uid-3".to_owned()].into_iter().collect());
        shares.forget("uid-3");
        assert_eq!(shares.waiting(), 1);
        assert_eq!(line_of(&shares, "a"), 2, "job 3's entry is skipped when reached, not searched for");
        drop(held);
        assert_eq!(woken.try_recv().ok(), Some(job(2)), "the deleted job is not woken");
        let held = shares.take("a", &job(2)).unwrap_or_else(|| panic!("the share was given back"));
        drop(held);
        let ledger = locked(&shares.ledger);
        assert!(ledger.drivers.is_empty() && ledger.queued.is_empty(), "nothing is kept of an idle driver");
    }
}
