//! Every watch cache of the manager, and what a controller is driven by: objects listed and
//! watched from the API server's cache (the list streamed in the watch, or in small pages),
//! without managedFields and trimmed to what the controller reads, and the stream of changes that
//! start passes.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::slim::{Listing, SlimStore, SlimWriter, Slimmable};
use crate::cache_ready::{self, Ready};

/// The namespaced CSI-Addons kinds the generic reconcilers (jobs, cron jobs) work on.
pub trait NamespacedKind:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> NamespacedKind for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// Set once an API server has refused a streamed initial list: every later watch lists in pages.
static STREAMING_REFUSED: AtomicBool = AtomicBool::new(false);

/// How a watch starts where the API server streams the initial list in the watch itself
/// (`sendInitialEvents`, on by default since Kubernetes 1.32): one request however many objects,
/// from the API server's cache, decoded one at a time.
fn streaming_config() -> watcher::Config {
    watcher::Config::default().streaming_lists()
}

/// How a watch starts where the API server does not stream: a list from its cache in pages of 100
/// (a page is decoded whole before its objects are trimmed; small pages keep that transient peak
/// small).
pub fn list_config() -> watcher::Config {
    watcher::Config::default().any_semantic().page_size(100)
}

/// Whether `error` is an API server refusing `sendInitialEvents`: a server without the WatchList
/// feature answers such a watch 422 Invalid (one older than 1.27 refuses its resourceVersionMatch
/// the same way). 403 and the rest are not about the way of listing.
fn refuses_streaming(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 422 || status.code == 400)
}

/// The watch of `api` every cache of the manager is filled by: the initial list streamed in the
/// watch where the API server offers it, else listed in pages; then the changes.
pub fn list_and_watch<K>(api: Api<K>) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    if STREAMING_REFUSED.load(Ordering::Relaxed) {
        return watcher(api, list_config()).boxed();
    }
    let streaming = watcher(api.clone(), streaming_config()).boxed();
    futures::stream::unfold((streaming, Some(api)), |(mut events, api)| async move {
        match (events.next().await?, api) {
            (Err(error), Some(api)) if refuses_streaming(&error) => {
                if !STREAMING_REFUSED.swap(true, Ordering::Relaxed) {
                    tracing::info!(%error, "the API server does not stream initial lists in a watch; listing in pages");
                }
                let mut paged = watcher(api, list_config()).boxed();
                let first = paged.next().await?;
                Some((first, (paged, None)))
            }
            (event, api) => Some((event, (events, api))),
        }
    })
    .boxed()
}

/// A watch of `api` cached without managedFields (most of an object's bytes, never read here):
/// the store and the stream of changed objects a controller is driven by.
pub fn trimmed_watch<K>(
    api: Api<K>,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, ready, events) = cached_watch(api, |_| {});
    let changes = changed_objects(events, store.clone());
    (store, ready, changes)
}

/// The objects a controller's passes start from, out of a cached watch's events (each already
/// applied to `store`): every object the watch applies, the objects of the first list as they
/// come, and after each later full list (once the watch had to start over, as after a `410 Gone`)
/// every object in the store.
///
/// A controller looks each object up in its store when a pass starts, and drops the pass when the
/// store lacks it, as if the object had been deleted; nothing starts another. The first list's
/// objects can go on one by one: over kube's store no pass starts until that list is complete (the
/// controller waits for its store), and a slim cache takes its first list as it comes. A later
/// list is swapped into the store only once it is complete: passed on one by one, as kube's
/// `applied_objects` does, every object created since the previous list would miss the store and
/// never be reconciled. Those lists are passed on from the store once it holds them.
pub fn changed_objects<K, S>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    store: S,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    S: Listing<K>,
{
    let mut listed_once = false;
    events.flat_map(move |event| {
        let mut relisted: Vec<Arc<K>> = Vec::new();
        let applied = match event {
            Ok(watcher::Event::Apply(object)) => Some(Ok(object)),
            Ok(watcher::Event::InitApply(object)) if !listed_once => Some(Ok(object)),
            Ok(watcher::Event::InitDone) => {
                if listed_once {
                    relisted = store.objects();
                }
                listed_once = true;
                None
            }
            Err(e) => Some(Err(e)),
            Ok(_) => None,
        };
        // Each relisted object is copied only as the controller takes it.
        futures::stream::iter(applied.into_iter().chain(relisted.into_iter().map(|object| Ok(K::clone(&object)))))
    })
}

/// Every watch cache of the manager: `api` listed and watched (`list_and_watch`), each object
/// without managedFields and trimmed by `trim` before the store keeps it; the store, when it has
/// its first full list, and the stream of watch events (already applied to the store).
pub fn cached_watch<K>(
    api: Api<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    cached_watch_where(api, trim, |_| true)
}

/// A cached watch (see `cached_watch`) whose store keeps only the objects `keep` takes: one that
/// changes so that it is no longer kept comes out of the store as if deleted.
pub fn cached_watch_where<K>(
    api: Api<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
    keep: fn(&K) -> bool,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let kept =
        list_and_watch(api).default_backoff().filter_map(move |event| std::future::ready(kept_event(event, keep)));
    let (ready, events) = cache_ready::track(trimmed(kept, trim).reflect(writer));
    (store, ready, events)
}

/// `events` with each object's managedFields (most of its bytes, never read here) dropped and
/// `trim` applied, before any cache keeps it.
fn trimmed<K: Resource>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    mut trim: impl FnMut(&mut K),
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> {
    events.modify(move |object| {
        object.meta_mut().managed_fields = None;
        trim(object);
    })
}

/// A cached watch (see `cached_watch`) whose cache keeps each object slim (`core::slim`).
pub fn slim_watch<K: Slimmable>(
    api: Api<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> (SlimStore<K>, Ready, impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static) {
    let (store, mut writer) = SlimWriter::new();
    let events = trimmed(list_and_watch(api).default_backoff(), trim);
    let (ready, events) = cache_ready::track(events.inspect(move |event| {
        if let Ok(event) = event {
            writer.apply(event);
        }
    }));
    (store, ready, events)
}

/// `event` as a store that keeps only what `keep` takes sees it: a listed object it does not take
/// is left out, and a changed one it no longer takes is deleted.
fn kept_event<K>(
    event: Result<watcher::Event<K>, watcher::Error>,
    keep: fn(&K) -> bool,
) -> Option<Result<watcher::Event<K>, watcher::Error>> {
    match event {
        Ok(watcher::Event::InitApply(object)) if !keep(&object) => None,
        Ok(watcher::Event::Apply(object)) if !keep(&object) => Some(Ok(watcher::Event::Delete(object))),
        other => Some(other),
    }
}

/// A trimmed watch (see `trimmed_watch`) whose stream of changed objects keeps only those whose
/// `predicate` value changed: passes for spec changes, not for our own status writes.
pub fn spec_watch<K>(
    api: Api<K>,
    predicate: fn(&K) -> Option<u64>,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, ready, stream) = trimmed_watch(api);
    (store, ready, stream.predicate_filter(predicate, Default::default()))
}

/// A predicate for `predicate_filter`: passes come from spec changes (generation) and the start
/// of a deletion, not from our own status writes.
pub fn generation_or_deletion<K: Resource>(object: &K) -> Option<u64> {
    let meta = object.meta();
    let generation = meta.generation.map_or(0, i64::unsigned_abs);
    Some(generation.saturating_mul(2) + u64::from(meta.deletion_timestamp.is_some()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_store_that_keeps_some_objects_leaves_out_or_deletes_the_others() {
        let keep: fn(&ConfigMap) -> bool = |c| c.metadata.name.as_deref() == Some("kept");
        let kept = |e| kept_event(Ok(e), keep).map(Result::unwrap);
        assert!(kept(Event::InitApply(config_map("other"))).is_none());
        assert!(matches!(kept(Event::InitApply(config_map("kept"))), Some(Event::InitApply(_))));
        assert!(matches!(kept(Event::Apply(config_map("other"))), Some(Event::Delete(_))));
        assert!(matches!(kept(Event::Apply(config_map("kept"))), Some(Event::Apply(_))));
        assert!(matches!(kept(Event::Delete(config_map("other"))), Some(Event::Delete(_))));
        assert!(matches!(kept(Event::InitDone), Some(Event::InitDone)));
    }

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::watcher::Event;

    use super::*;

    fn config_map(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() },
            ..Default::default()
        }
    }

    fn refused(code: u16, reason: &str) -> watcher::Error {
        let status = kube::core::Status::failure("sendInitialEvents is forbidden for watch", reason).with_code(code);
        watcher::Error::WatchStartFailed(kube::Error::Api(status.boxed()))
    }

    #[test]
    fn only_a_refused_watch_request_falls_back_to_paged_lists() {
        assert!(refuses_streaming(&refused(422, "Invalid")));
        assert!(refuses_streaming(&refused(400, "BadRequest")));
        // No right to watch, a server under load, a list that failed: not about how lists come.
        assert!(!refuses_streaming(&refused(403, "Forbidden")));
        assert!(!refuses_streaming(&refused(429, "TooManyRequests")));
        let status = kube::core::Status::failure("invalid", "Invalid").with_code(422);
        assert!(!refuses_streaming(&watcher::Error::InitialListFailed(kube::Error::Api(status.boxed()))));
    }

    #[tokio::test]
    async fn a_later_list_is_passed_on_once_the_store_holds_it() {
        let (store, writer) = reflector::store::<ConfigMap>();
        // The first list (a), a watched change (b), then the watch starts over: the new list
        // holds c and d, which the store has never seen.
        let events = vec![
            Event::Init,
            Event::InitApply(config_map("a")),
            Event::InitDone,
            Event::Apply(config_map("b")),
            Event::Init,
            Event::InitApply(config_map("a")),
            Event::InitApply(config_map("b")),
            Event::InitApply(config_map("c")),
            Event::InitApply(config_map("d")),
            Event::InitDone,
        ];
        let events = futures::stream::iter(events.into_iter().map(Ok)).reflect(writer);
        let passed: Vec<(String, bool)> = changed_objects(events, store.clone())
            .map(|object| {
                let object = object.expect("no error in the stream");
                let held = store.get(&ObjectRef::from_obj(&object)).is_some();
                (object.metadata.name.unwrap_or_default(), held)
            })
            .collect()
            .await;
        let mut names: Vec<&str> = passed.iter().map(|(name, _)| name.as_str()).collect();
        names[2..].sort_unstable();
        assert_eq!(names, ["a", "b", "a", "b", "c", "d"]);
        // The first list's objects go on as they come (no pass starts before that list is in
        // the store); everything after it only once the store holds it.
        assert!(passed[1..].iter().all(|(_, held)| *held), "passed on before the store held it: {passed:?}");
    }
}
