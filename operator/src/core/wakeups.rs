//! When each object is looked at next (a cron job's next run, a CSIAddonsNode's hourly check),
//! kept compactly. kube-runtime's scheduler holds a requeue as two copies of a reconcile request
//! (name, namespace, UID and resource version, in a delay queue and in a map): some 800 bytes for
//! every object waiting, 8 MB for ten thousand. Here an entry is its due time and the object's
//! namespace and name (about 150 bytes); a due entry is handed to the controller as a reconcile
//! request.
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A namespaced object's (namespace, name).
type Key = Arc<(Box<str>, Box<str>)>;

#[derive(Default)]
struct Queue {
    /// Entries in due order.
    by_time: BTreeSet<(Instant, Key)>,
    /// Each key's due time: one entry per key.
    due: HashMap<Key, Instant>,
}

impl Queue {
    fn remove(&mut self, key: &(Box<str>, Box<str>)) {
        if let Some((key, at)) = self.due.remove_entry(key) {
            self.by_time.remove(&(at, key));
        }
    }

    /// The entries due by `now`, removed; or how long until the next one is.
    fn take_due(&mut self, now: Instant) -> Result<Vec<Key>, Option<Duration>> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.by_time.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.by_time.pop_first() {
                self.due.remove(&key);
                due.push(key);
            }
        }
        if due.is_empty() {
            Err(self.by_time.first().map(|(at, _)| at.saturating_duration_since(now)))
        } else {
            Ok(due)
        }
    }
}

/// The wake-up times of one controller's objects; clones share them.
#[derive(Clone, Default)]
pub struct Wakeups {
    queue: Arc<Mutex<Queue>>,
    changed: Arc<Notify>,
}

impl Wakeups {
    /// `namespace/name` is looked at again after `delay` (replacing an earlier wake-up).
    pub fn after(&self, namespace: &str, name: &str, delay: Duration) {
        let at = Instant::now() + delay;
        let key: Key = Arc::new((namespace.into(), name.into()));
        let mut queue = crate::primitives::locked(&self.queue);
        queue.remove(&key);
        let earliest = queue.by_time.first().is_none_or(|(first, _)| at < *first);
        queue.by_time.insert((at, key.clone()));
        queue.due.insert(key, at);
        drop(queue);
        if earliest {
            self.changed.notify_one();
        }
    }

    /// `namespace/name` needs no wake-up (nothing due, or gone).
    pub fn forget(&self, namespace: &str, name: &str) {
        crate::primitives::locked(&self.queue).remove(&(namespace.into(), name.into()));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        crate::primitives::locked(&self.queue).due.len()
    }

    /// The objects as they fall due, for `Controller::reconcile_on`; ends never.
    pub fn due<K: Resource<DynamicType = ()>>(&self) -> impl Stream<Item = ObjectRef<K>> + Send + 'static {
        let wakeups = self.clone();
        let ready = futures::stream::unfold(wakeups, |wakeups| async move {
            loop {
                let next = crate::primitives::locked(&wakeups.queue).take_due(Instant::now());
                match next {
                    Ok(due) => return Some((futures::stream::iter(due), wakeups)),
                    // A later `after` with an earlier time notifies; a long sleep is re-checked.
                    Err(wait) => {
                        let wait = wait.unwrap_or(Duration::from_secs(3600));
                        let _ = tokio::time::timeout(wait, wakeups.changed.notified()).await;
                    }
                }
            }
        });
        futures::StreamExt::map(futures::StreamExt::flatten(ready), |key: Key| ObjectRef::new(&key.1).within(&key.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn an_entry_per_object_in_due_order() {
        let mut queue = Queue::default();
        let now = Instant::now();
        let key = |name: &str| -> Key { Arc::new(("ns".into(), name.into())) };
        for (name, secs) in [("late", 30), ("soon", 10), ("moved", 5)] {
            queue.by_time.insert((now + Duration::from_secs(secs), key(name)));
            queue.due.insert(key(name), now + Duration::from_secs(secs));
        }
        queue.remove(&key("moved"));
        assert_eq!(queue.take_due(now), Err(Some(Duration::from_secs(10))));
        let due = queue.take_due(now + Duration::from_secs(20)).unwrap();
        assert_eq!(due.iter().map(|k| &*k.1).collect::<Vec<_>>(), ["soon"]);
        assert_eq!((queue.due.len(), queue.by_time.len()), (1, 1));
        let mut empty = Queue::default();
        assert_eq!(empty.take_due(now), Err(None));
    }

    #[tokio::test]
    async fn objects_come_out_in_due_order_and_a_new_time_replaces_the_old() {
        let wakeups = Wakeups::default();
        let mut due = Box::pin(wakeups.due::<ConfigMap>());
        let ms = Duration::from_millis;
        wakeups.after("ns", "a", Duration::from_secs(3600));
        wakeups.after("ns", "b", ms(40));
        // An earlier time for `a` wakes the waiting stream and replaces the later one.
        wakeups.after("ns", "a", ms(20));
        wakeups.after("ns", "gone", ms(1));
        wakeups.forget("ns", "gone");
        assert_eq!(wakeups.len(), 2);
        for name in ["a", "b"] {
            let next = tokio::time::timeout(Duration::from_secs(30), due.next()).await.unwrap();
            assert_eq!(next, Some(ObjectRef::new(name).within("ns")));
        }
        assert_eq!(wakeups.len(), 0);
    }
}
