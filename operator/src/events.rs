//! Kubernetes Events (events.k8s.io/v1) for what users should see. An event sent again within a
//! few minutes (same object, type, reason and note) becomes a series: the first event's count is
//! raised instead of a new one created. kube's own Recorder keeps a copy of every event it sent
//! for that long, a few KiB each (4 MiB after 1,000 jobs); this one keeps only what a repeat needs
//! — the event's name, its count and when it was last sent — under a 64-bit key.
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// How long a sent event can still grow into a series (client-go's and kube's figure).
const SERIES_SECONDS: i64 = 6 * 60;
/// At most this many series are remembered; beyond it, repeats are sent as new events.
const MAX_SERIES: usize = 4096;

/// What is remembered of a sent event.
struct Sent {
    name: String,
    count: i32,
    last_seconds: i64,
}

/// The events sent lately, by key.
#[derive(Default)]
struct SentEvents(Mutex<HashMap<u64, Sent>>);

impl SentEvents {
    /// The name and next count of a live series under `key`, counted in.
    fn count_in(&self, key: u64, now: i64) -> Option<(String, i32)> {
        let mut sent = crate::primitives::locked(&self.0);
        let series = sent.get_mut(&key).filter(|s| now - s.last_seconds < SERIES_SECONDS)?;
        series.count = series.count.saturating_add(1);
        series.last_seconds = now;
        Some((series.name.clone(), series.count))
    }

    /// Starts a series under `key`, unless MAX_SERIES live ones are remembered already.
    fn remember(&self, key: u64, name: String, now: i64) {
        let mut sent = crate::primitives::locked(&self.0);
        if sent.len() >= MAX_SERIES {
            sent.retain(|_, s| now - s.last_seconds < SERIES_SECONDS);
        }
        if sent.len() < MAX_SERIES {
            sent.insert(key, Sent { name, count: 1, last_seconds: now });
        }
    }
}

/// Sends events as one reporting controller (and instance).
pub struct EventRecorder {
    client: kube::Client,
    controller: String,
    instance: String,
    sent: SentEvents,
}

/// One event to send.
pub struct Note<'a> {
    pub warning: bool,
    pub reason: &'a str,
    pub action: &'a str,
    pub text: String,
}

impl EventRecorder {
    /// `instance` defaults to the controller's name (events.k8s.io requires one).
    pub fn new(client: kube::Client, controller: &str, instance: Option<String>) -> Self {
        EventRecorder {
            client,
            controller: controller.to_owned(),
            instance: instance.filter(|i| !i.is_empty()).unwrap_or_else(|| controller.to_owned()),
            sent: SentEvents::default(),
        }
    }

    /// Sends `note` about `regarding` (in its namespace; cluster-scoped objects' events go to
    /// `default`, as kube and client-go do), or counts it into the series of the same event
    /// sent a moment ago.
    pub async fn publish(&self, regarding: &ObjectReference, note: Note<'_>) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
        let events = Api::<Event>::namespaced(self.client.clone(), &namespace);
        let key = series_key(regarding, &note);
        let now = Timestamp::now();
        let repeat = self.sent.count_in(key, now.as_second());
        if let Some((name, count)) = repeat {
            let patch = serde_json::json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
            match events.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(()),
                // Gone (expired, deleted): a new event starts a new series.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.event(regarding, &note, namespace, now);
        let name = event.metadata.name.clone().unwrap_or_default();
        events.create(&PostParams::default(), &event).await?;
        self.sent.remember(key, name, now.as_second());
        Ok(())
    }

    fn event(&self, regarding: &ObjectReference, note: &Note<'_>, namespace: String, now: Timestamp) -> Event {
        let subject = regarding.name.as_deref().filter(|n| !n.is_empty()).unwrap_or(&self.controller);
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{subject}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if note.warning { "Warning" } else { "Normal" }.to_owned()),
            reason: Some(note.reason.to_owned()),
            action: Some(note.action.to_owned()),
            note: Some(note.text.clone()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }
}

/// Events that are "the same" share a key: the object (by UID, kind and name), type, reason,
/// action and note.
fn series_key(regarding: &ObjectReference, note: &Note<'_>) -> u64 {
    let mut hasher = DefaultHasher::new();
    (&regarding.uid, &regarding.kind, &regarding.namespace, &regarding.name).hash(&mut hasher);
    (note.warning, note.reason, note.action, &note.text).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(text: &str) -> Note<'_> {
        Note { warning: true, reason: "Failed", action: "Failed", text: text.to_owned() }
    }

    #[test]
    fn only_the_same_event_on_the_same_object_shares_a_key() {
        let job = ObjectReference { uid: Some("u1".into()), name: Some("j".into()), ..Default::default() };
        let other = ObjectReference { uid: Some("u2".into()), name: Some("j".into()), ..Default::default() };
        assert_eq!(series_key(&job, &note("a")), series_key(&job, &note("a")));
        assert_ne!(series_key(&job, &note("a")), series_key(&job, &note("b")));
        assert_ne!(series_key(&job, &note("a")), series_key(&other, &note("a")));
    }

    #[test]
    fn a_repeat_counts_into_the_series_until_it_is_too_old() {
        let sent = SentEvents::default();
        assert_eq!(sent.count_in(7, 1000), None);
        sent.remember(7, "j.1".into(), 1000);
        assert_eq!(sent.count_in(7, 1010), Some(("j.1".into(), 2)));
        assert_eq!(sent.count_in(7, 1010 + SERIES_SECONDS - 1), Some(("j.1".into(), 3)));
        assert_eq!(sent.count_in(7, 1010 + 2 * SERIES_SECONDS), None);
    }

    #[test]
    fn memory_is_bounded_and_old_series_make_room() {
        let sent = SentEvents::default();
        for key in 0..MAX_SERIES as u64 {
            sent.remember(key, format!("e.{key}"), 1000);
        }
        sent.remember(u64::MAX, "late".into(), 1001);
        assert_eq!(sent.count_in(u64::MAX, 1002), None, "full: not remembered");
        sent.remember(u64::MAX, "later".into(), 1000 + SERIES_SECONDS);
        assert_eq!(sent.count_in(u64::MAX, 1001 + SERIES_SECONDS), Some(("later".into(), 2)));
        assert_eq!(crate::primitives::locked(&sent.0).len(), 1, "the expired ones went");
    }
}
