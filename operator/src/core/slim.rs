//! Caches that keep each object slim: its metadata in a compact record (`SlimMeta`) beside the
//! kind's own part, in a map keyed by one shared `namespace/name` string. kube's store keeps
//! k8s-openapi's `ObjectMeta` inline (360 bytes, mostly empty options) and a key of four copied
//! strings per object, some 600 bytes an object before its strings: at ten thousand cron jobs,
//! megabytes.
//!
//! kube's controller still runs the passes, over a store of its own that holds only the objects
//! handed to it (at most twice `max-concurrent-reconciles`): the queue rebuilds an object from
//! its slim record when it hands it over, and drops it when its pass ends (`core::queue`).
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use super::slim_text::{SlimOwner, SlimText};

/// An object in a slim cache and in a controller's queue: `namespace/name`, or `name` for a
/// cluster-scoped kind (neither part can hold a slash).
pub type Key = Arc<str>;

pub fn key(namespace: Option<&str>, name: &str) -> Key {
    match namespace {
        Some(namespace) => format!("{namespace}/{name}").into(),
        None => name.into(),
    }
}

/// A cache a relist (`changed_objects`) or a pass for every object (`Triggers::all_on`) reads.
pub trait Listing<K: Resource>: Send + Sync + 'static {
    fn objects(&self) -> Vec<Arc<K>>;
    /// A reference to each cached object.
    fn refs(&self) -> Vec<ObjectRef<K>>;
    /// The UID of each cached object.
    fn uids(&self) -> HashSet<String>;
}

impl<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static> Listing<K> for Store<K> {
    fn objects(&self) -> Vec<Arc<K>> {
        self.state()
    }

    fn refs(&self) -> Vec<ObjectRef<K>> {
        self.state().iter().map(|object| ObjectRef::from_obj(object.as_ref())).collect()
    }

    fn uids(&self) -> HashSet<String> {
        self.state().iter().filter_map(|object| object.meta().uid.clone()).collect()
    }
}

impl<K: Slimmable> Listing<K> for SlimStore<K> {
    fn objects(&self) -> Vec<Arc<K>> {
        self.state().iter().map(|slim| Arc::new(slim.object())).collect()
    }

    fn refs(&self) -> Vec<ObjectRef<K>> {
        self.state().iter().map(|slim| slim.meta.object_ref()).collect()
    }

    fn uids(&self) -> HashSet<String> {
        self.read().values().map(|slim| slim.meta.uid.text()).filter(|uid| !uid.is_empty()).collect()
    }
}

/// A kind a slim cache can keep: its metadata apart from the rest, and back.
pub trait Slimmable:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
    /// Everything but the metadata.
    type Rest: Send + Sync + 'static;
    fn split(self) -> (ObjectMeta, Self::Rest);
    fn join(metadata: ObjectMeta, rest: &Self::Rest) -> Self;
}

type Pairs = Box<[(Box<str>, Box<str>)]>;

/// What a slim cache keeps of an object's metadata: all a controller reads (the rest, such as
/// managedFields, was trimmed before). Empty lists take no allocation.
pub struct SlimMeta {
    /// `namespace/name`, or `name`; the cache's key too.
    pub key: Key,
    pub uid: SlimText,
    pub resource_version: SlimText,
    pub generation: Option<i64>,
    pub created: Option<Time>,
    pub deleting: Option<Time>,
    pub labels: Pairs,
    pub annotations: Pairs,
    pub owners: Box<[SlimOwner]>,
    pub finalizers: Box<[Box<str>]>,
}

fn pairs(map: Option<std::collections::BTreeMap<String, String>>) -> Pairs {
    map.into_iter().flatten().map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str())).collect()
}

fn map(pairs: &Pairs) -> Option<std::collections::BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

fn text(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

impl SlimMeta {
    fn of(meta: ObjectMeta) -> Self {
        let name = meta.name.unwrap_or_default();
        SlimMeta {
            key: key(meta.namespace.as_deref(), &name),
            uid: SlimText::of(meta.uid.unwrap_or_default()),
            resource_version: SlimText::of(meta.resource_version.unwrap_or_default()),
            generation: meta.generation,
            created: meta.creation_timestamp,
            deleting: meta.deletion_timestamp,
            labels: pairs(meta.labels),
            annotations: pairs(meta.annotations),
            owners: meta.owner_references.into_iter().flatten().map(SlimOwner::of).collect(),
            finalizers: meta.finalizers.into_iter().flatten().map(String::into_boxed_str).collect(),
        }
    }

    pub fn name(&self) -> &str {
        self.key.split_once('/').map_or(&self.key, |(_, name)| name)
    }

    pub fn namespace(&self) -> Option<&str> {
        self.key.split_once('/').map(|(namespace, _)| namespace)
    }

    /// The value of annotation `key`, if the cache kept it.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.iter().find(|(k, _)| &**k == key).map(|(_, v)| &**v)
    }

    pub fn object_ref<K: Resource<DynamicType = ()>>(&self) -> ObjectRef<K> {
        let name = ObjectRef::new(self.name());
        match self.namespace() {
            Some(namespace) => name.within(namespace),
            None => name,
        }
    }

    /// The metadata as kube's types hold it.
    pub fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name().to_owned()),
            namespace: self.namespace().map(str::to_owned),
            uid: text(&self.uid.text()),
            resource_version: text(&self.resource_version.text()),
            generation: self.generation,
            creation_timestamp: self.created.clone(),
            deletion_timestamp: self.deleting.clone(),
            labels: map(&self.labels),
            annotations: map(&self.annotations),
            owner_references: (!self.owners.is_empty()).then(|| self.owners.iter().map(SlimOwner::reference).collect()),
            finalizers: (!self.finalizers.is_empty()).then(|| self.finalizers.iter().map(|f| f.to_string()).collect()),
            ..ObjectMeta::default()
        }
    }
}

/// One cached object.
pub struct Slim<K: Slimmable> {
    pub meta: SlimMeta,
    pub rest: K::Rest,
}

impl<K: Slimmable> Slim<K> {
    pub fn of(object: K) -> Self {
        let (metadata, rest) = object.split();
        Slim { meta: SlimMeta::of(metadata), rest }
    }

    /// The object as kube's types hold it.
    pub fn object(&self) -> K {
        K::join(self.meta.metadata(), &self.rest)
    }
}

type Map<K> = HashMap<Key, Arc<Slim<K>>>;

/// A slim cache, shared by its readers (clone it); written only by its watch (`SlimWriter`).
pub struct SlimStore<K: Slimmable>(Arc<RwLock<Map<K>>>);

impl<K: Slimmable> Clone for SlimStore<K> {
    fn clone(&self) -> Self {
        SlimStore(Arc::clone(&self.0))
    }
}

impl<K: Slimmable> SlimStore<K> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Map<K>> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The object cached under `key` (`namespace/name`).
    pub fn get_key(&self, key: &str) -> Option<Arc<Slim<K>>> {
        self.read().get(key).cloned()
    }

    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<Slim<K>>> {
        self.get_key(&key(namespace, name))
    }

    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<Slim<K>>> {
        self.read().values().cloned().collect()
    }
}

/// Applies a watch's events to its slim cache. A relist builds a new map, swapped in whole when
/// the list is complete (as kube's store does): until then readers see the previous one. Into an
/// empty cache (the first list) objects go as they come: the controller over it takes each as the
/// watch passes it on, and the cache must hold it by then (readers that need the whole list wait
/// for it to be ready).
pub struct SlimWriter<K: Slimmable> {
    store: SlimStore<K>,
    listing: Option<Map<K>>,
}

impl<K: Slimmable> SlimWriter<K> {
    pub fn new() -> (SlimStore<K>, Self) {
        let store = SlimStore(Arc::new(RwLock::new(HashMap::new())));
        (store.clone(), SlimWriter { store, listing: None })
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Map<K>> {
        self.store.0.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn apply(&mut self, event: &watcher::Event<K>) {
        let slim = |object: &K| {
            let slim = Slim::of(object.clone());
            (Arc::clone(&slim.meta.key), Arc::new(slim))
        };
        match event {
            watcher::Event::Apply(object) => {
                let (key, slim) = slim(object);
                self.write().insert(key, slim);
            }
            watcher::Event::Delete(object) => {
                let meta = object.meta();
                let key = key(meta.namespace.as_deref(), meta.name.as_deref().unwrap_or_default());
                self.write().remove(&key);
            }
            watcher::Event::Init => {
                let empty = self.store.read().is_empty();
                self.listing = (!empty).then(HashMap::new);
            }
            watcher::Event::InitApply(object) => {
                let (key, slim) = slim(object);
                match self.listing.as_mut() {
                    Some(listing) => listing.insert(key, slim),
                    None => self.write().insert(key, slim),
                };
            }
            watcher::Event::InitDone => {
                if let Some(mut listed) = self.listing.take() {
                    listed.shrink_to_fit();
                    *self.write() = listed;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    use super::*;

    impl Slimmable for ConfigMap {
        type Rest = Option<std::collections::BTreeMap<String, String>>;
        fn split(self) -> (ObjectMeta, Self::Rest) {
            (self.metadata, self.data)
        }
        fn join(metadata: ObjectMeta, rest: &Self::Rest) -> Self {
            ConfigMap { metadata, data: rest.clone(), ..ConfigMap::default() }
        }
    }

    fn config_map(value: serde_json::Value) -> ConfigMap {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_object_comes_back_as_it_was_cached() {
        let full = config_map(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u-1", "resourceVersion": "7", "generation": 2,
                "creationTimestamp": "2026-11-29T10:00:00Z", "deletionTimestamp": "2026-11-29T11:00:00Z",
                "labels": {"a": "1"}, "annotations": {"b": "2"}, "finalizers": ["f"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "p", "uid": "u-2",
                    "controller": true}]},
            "data": {"k": "v"},
        }));
        let slim = Slim::of(full.clone());
        assert_eq!((slim.meta.namespace(), slim.meta.name()), (Some("ns"), "c"));
        assert_eq!(serde_json::to_value(slim.object()).unwrap(), serde_json::to_value(&full).unwrap());
        let bare = config_map(json!({"metadata": {"name": "cluster-wide"}}));
        let slim = Slim::of(bare.clone());
        assert_eq!((slim.meta.namespace(), slim.meta.name()), (None, "cluster-wide"));
        assert_eq!(serde_json::to_value(slim.object()).unwrap(), serde_json::to_value(&bare).unwrap());
    }

    #[test]
    fn the_first_list_goes_in_as_it_comes_and_a_relist_only_once_complete() {
        let (store, mut writer) = SlimWriter::<ConfigMap>::new();
        let named = |name: &str| config_map(json!({"metadata": {"name": name, "namespace": "ns"}}));
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(named("a")));
        assert!(store.get_key("ns/a").is_some(), "a controller takes it before the list ends");
        writer.apply(&watcher::Event::InitDone);
        writer.apply(&watcher::Event::Apply(named("b")));
        assert!(store.get(Some("ns"), "a").is_some() && store.get_key("ns/b").is_some());
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(named("c")));
        assert_eq!(store.state().len(), 2, "the previous list until the new one is complete");
        writer.apply(&watcher::Event::InitDone);
        let mut names: Vec<String> = store.state().iter().map(|s| s.meta.name().to_owned()).collect();
        names.sort();
        assert_eq!(names, ["c"], "what the new list lacks is gone");
        writer.apply(&watcher::Event::Delete(named("c")));
        assert!(store.state().is_empty());
    }
}
