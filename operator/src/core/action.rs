//! What a pass asks for next. kube's `Action` says the same but keeps its delay to itself, and
//! kube's scheduler would hold every delayed pass (a map and a delay queue of four-string
//! references, never shrunk): the queue in front of kube (`core::queue`) holds them instead, so
//! it reads the delay here.
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Another pass after `after`, unless a change starts one sooner.
    pub const fn requeue(after: Duration) -> Self {
        Action { requeue_after: Some(after) }
    }

    /// No pass until the object (or a watch that maps to it) changes.
    pub const fn await_change() -> Self {
        Action { requeue_after: None }
    }

    pub const fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}
