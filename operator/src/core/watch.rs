//! Every watch cache of the manager, and what a controller is driven by: objects listed and
//! watched from the API server's cache in small pages, without managedFields and trimmed to what
//! the controller reads, and the stream of changes that start passes.
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

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

/// How every watch lists: from the API server's cache, in pages of 100 (a page is decoded whole
/// before its objects are trimmed; small pages keep that transient peak small).
pub fn list_config() -> watcher::Config {
    watcher::Config::default().any_semantic().page_size(100)
}

/// A watch of `api` cached without managedFields (most of an object's bytes, never read here):
/// the store and the stream of changed objects a controller is driven by.
pub fn trimmed_watch<K>(
    api: Api<K>,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    trimmed_watch_with(api, |_| {})
}

/// A trimmed watch (see `trimmed_watch`) that also applies `trim` to each object before it is
/// cached: what a controller never reads need not be kept.
pub fn trimmed_watch_with<K>(
    api: Api<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, ready, events) = cached_watch(api, trim);
    (store, ready, events.applied_objects())
}

/// Every watch cache of the manager: `api` listed and watched (`list_config`), each object
/// without managedFields and trimmed by `trim` before the store keeps it; the store, when it has
/// its first full list, and the stream of watch events (already applied to the store).
pub fn cached_watch<K>(
    api: Api<K>,
    mut trim: impl FnMut(&mut K) + Send + 'static,
) -> (Store<K>, Ready, impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let (ready, events) = cache_ready::track(
        watcher(api, list_config())
            .default_backoff()
            .modify(move |object| {
                object.meta_mut().managed_fields = None;
                trim(object);
            })
            .reflect(writer),
    );
    (store, ready, events)
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
