//! Which watched changes start a pass: a controller that reads only some of an object (its spec,
//! a few annotations) names them in a fingerprint, and a change that leaves the fingerprint alone
//! (our own status write, above all) starts none. kube's `predicate_filter` does the same but keys
//! each object by three strings (some 200 bytes an object); this keys it by its uid as a number,
//! 24 bytes an object.
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use futures::{Stream, TryStreamExt};
use kube::Resource;
use kube::runtime::watcher;

use crate::compact::uuid;
use crate::primitives::locked;

/// The fingerprint last passed on, by object uid.
#[derive(Clone, Default)]
pub struct Fingerprints(Arc<Mutex<HashMap<u128, u64>>>);

impl Fingerprints {
    /// Whether `fingerprint` differs from the one last passed on for `uid`, recording it. An
    /// object without a uid in the API server's form always passes.
    pub fn changed(&self, uid: Option<&str>, fingerprint: u64) -> bool {
        let Some(uid) = uid.and_then(uuid) else { return true };
        locked(&self.0).insert(uid, fingerprint) != Some(fingerprint)
    }

    /// Forgets the objects whose uid is not in `live` (deleted ones).
    pub fn retain(&self, live: &HashSet<String>) {
        let live: HashSet<u128> = live.iter().filter_map(|uid| uuid(uid)).collect();
        locked(&self.0).retain(|uid, _| live.contains(uid));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        locked(&self.0).len()
    }

    /// The objects of `changes` whose fingerprint changed since they last passed.
    pub fn filter<K: Resource + Send + 'static>(
        &self,
        changes: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
        fingerprint: fn(&K) -> u64,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        let seen = self.clone();
        changes.try_filter(move |object| {
            let passes = seen.changed(object.meta().uid.as_deref(), fingerprint(object));
            futures::future::ready(passes)
        })
    }
}

/// A fingerprint of what most controllers act on: the generation (every spec change), whether
/// the object is being deleted, and its annotations.
pub fn spec_and_annotations<K: Resource>(object: &K) -> u64 {
    let meta = object.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use api::csiaddons::CSIAddonsNode;
    use futures::StreamExt;
    use kube::api::ObjectMeta;

    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    fn node(uid: Option<&str>, generation: i64, annotation: Option<&str>, state: &str) -> CSIAddonsNode {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "CSIAddonsNode",
            "metadata": ObjectMeta {
                name: Some("n".into()),
                namespace: Some("ns".into()),
                uid: uid.map(Into::into),
                generation: Some(generation),
                annotations: annotation.map(|a| [("a".to_owned(), a.to_owned())].into()),
                ..Default::default()
            },
            "spec": {"driver": {"name": "d", "endpoint": "pod://p.ns:9070", "nodeID": "x"}},
            "status": {"state": state},
        }))
        .expect("a valid CSIAddonsNode")
    }

    async fn passed(objects: Vec<CSIAddonsNode>) -> Vec<(Option<String>, String)> {
        let stream = futures::stream::iter(objects.into_iter().map(Ok));
        Fingerprints::default()
            .filter(stream, spec_and_annotations)
            .map(|o| {
                let o = o.expect("no error in the stream");
                (o.metadata.uid.clone(), o.status.and_then(|s| s.state).unwrap_or_default())
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_status_write_passes_nothing_a_spec_or_annotation_change_does() {
        let got = passed(vec![
            node(Some(UID), 1, None, "first"),
            node(Some(UID), 1, None, "our status write"),
            node(Some(UID), 2, None, "spec changed"),
            node(Some(UID), 2, Some("x"), "annotation changed"),
            node(Some(UID), 2, Some("x"), "status again"),
            // Another object (another uid) is fingerprinted on its own; no uid always passes.
            node(Some("00000000-0000-0000-0000-000000000001"), 2, Some("x"), "other"),
            node(None, 2, Some("x"), "no uid"),
            node(None, 2, Some("x"), "no uid again"),
        ])
        .await;
        let states: Vec<&str> = got.iter().map(|(_, state)| state.as_str()).collect();
        assert_eq!(states, ["first", "spec changed", "annotation changed", "other", "no uid", "no uid again"]);
    }

    #[test]
    fn deleted_objects_are_forgotten() {
        let seen = Fingerprints::default();
        assert!(seen.changed(Some(UID), 1));
        assert!(seen.changed(Some("00000000-0000-0000-0000-000000000001"), 1));
        assert!(!seen.changed(Some(UID), 1));
        seen.retain(&[UID.to_owned()].into());
        assert_eq!(seen.len(), 1);
        assert!(!seen.changed(Some(UID), 1), "the live one is kept");
    }
}
