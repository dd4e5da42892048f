//! When a watch cache has its first full list, for any number of waiters.
//!
//! kube's `Store::wait_until_ready` keeps one waker (that of a one-shot channel): of several tasks
//! waiting at once only the one that polled last is woken, and the others wait for ever. The
//! manager once never got going that way: its readiness probe, a hundred passes and kube's own
//! controller all waited on one cron-job cache. kube's controller is left the only waiter on its
//! store; everything here waits on a [`Ready`], set from the watch stream once the store holds
//! the first full list.

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tokio::sync::watch;

/// Whether a cache has had its first full list; clone it for every waiter.
#[derive(Clone)]
pub struct Ready(watch::Receiver<bool>);

/// The watch stopped before its cache had a full list.
#[derive(Debug, thiserror::Error)]
#[error("the watch stopped before its first full list")]
pub struct Stopped;

impl Ready {
    /// Waits until the cache has had its first full list.
    pub async fn wait(&self) -> Result<(), Stopped> {
        self.0.clone().wait_for(|ready| *ready).await.map(|_| ()).map_err(|_| Stopped)
    }

    /// Whether the cache has had its first full list, now.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }
}

/// Marks the cache ready when `events` (a watch stream already reflected into its store) ends
/// its first list. The store applied the event before it gets here.
pub fn track<K, S>(events: S) -> (Ready, impl Stream<Item = S::Item> + Send + 'static)
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (ready, waiters) = watch::channel(false);
    let events = events.inspect(move |event| {
        if let Ok(watcher::Event::InitDone) = event {
            ready.send_replace(true);
        }
    });
    (Ready(waiters), events)
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use super::*;

    type Event = Result<watcher::Event<k8s_openapi::api::core::v1::ConfigMap>, watcher::Error>;

    #[tokio::test]
    async fn every_waiter_is_woken_by_the_end_of_the_first_list() {
        let (tx, rx) = futures::channel::mpsc::unbounded::<Event>();
        let (ready, events) = track(rx);
        // Waiters in tasks of their own: each is polled again only when its own waker fires.
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let ready = ready.clone();
                tokio::spawn(async move { ready.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        tx.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        tx.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        let mut events = pin!(events);
        assert!(matches!(events.next().await, Some(Ok(watcher::Event::Init))));
        assert!(!ready.is_ready(), "not ready before the list ends");
        assert!(matches!(events.next().await, Some(Ok(watcher::Event::InitDone))));
        assert!(ready.is_ready());
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await.unwrap().unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn a_watch_that_stops_before_its_list_says_so() {
        let (tx, rx) = futures::channel::mpsc::unbounded::<Event>();
        let (ready, events) = track(rx);
        drop(tx);
        assert_eq!(events.count().await, 0);
        assert!(ready.wait().await.is_err());
    }
}
