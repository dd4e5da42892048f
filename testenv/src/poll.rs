//! Waiting for what a system under test reaches in its own time: a condition checked every
//! 200 ms, for at most a given time, so no test sleeps longer than it has to.
use std::convert::Infallible;
use std::time::Duration;

use tokio::time::Instant;

/// How long a test waits, by default, for what a component does by itself.
pub const MINUTE: Duration = Duration::from_secs(60);

/// The wait between two checks.
pub const INTERVAL: Duration = Duration::from_millis(200);

/// Checks `check` every [`INTERVAL`] until it yields a value; `None` once `limit` has passed.
pub async fn until<T>(limit: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let found: Result<Option<T>, Infallible> = try_until(limit, async || Ok(check().await)).await;
    match found {
        Ok(value) => value,
    }
}

/// [`until`] for a check that can fail: the first error ends the wait and is returned.
pub async fn try_until<T, E>(
    limit: Duration,
    mut check: impl AsyncFnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    // A limit too large to count is no limit.
    let deadline = Instant::now().checked_add(limit);
    loop {
        if let Some(value) = check().await? {
            return Ok(Some(value));
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Ok(None);
        }
        tokio::time::sleep(INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_value_comes_back_as_soon_as_the_check_yields_it() {
        let mut calls = 0;
        let found = until(Duration::from_secs(60), async || {
            calls += 1;
            (calls == 3).then_some("ready")
        })
        .await;
        assert_eq!(found, Some("ready"));
        assert_eq!(calls, 3);
    }

    #[tokio::test]
    async fn a_check_that_never_yields_ends_after_the_limit() {
        let mut calls = 0u32;
        let found: Option<()> = until(Duration::from_millis(500), async || {
            calls += 1;
            None
        })
        .await;
        assert_eq!(found, None);
        // Checked at once, again after each wait, and once more at or past the limit.
        assert!(calls >= 2, "checked {calls} times");
    }

    #[tokio::test]
    async fn an_error_ends_the_wait_at_once() {
        let mut calls = 0;
        let found: Result<Option<()>, &str> = try_until(Duration::from_secs(60), async || {
            calls += 1;
            if calls == 2 { Err("gone") } else { Ok(None) }
        })
        .await;
        assert_eq!(found, Err("gone"));
        assert_eq!(calls, 2);
    }
}
