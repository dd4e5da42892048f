//! The pool's connections, kept with an index of what its lookups ask for (a CSIAddonsNode, a
//! driver's namespaces, capabilities and nodes), so no lookup reads every connection. Each node
//! connected, job and PVC looks the pool up at least once: with a sidecar on each of 10,000
//! nodes, reading them all at each lookup made connecting them cost the square of their number.
//! The index costs about 200 bytes a connection.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// What the index reads of a pooled connection; the same answers for as long as it is pooled.
pub trait Pooled {
    /// Its key in the pool.
    fn key(&self) -> String;
    /// The CSIAddonsNode it was dialled for: namespace and name.
    fn node(&self) -> (&str, &str);
    fn driver(&self) -> &str;
    /// The ID of the node its sidecar runs on.
    fn node_id(&self) -> &str;
    fn capabilities(&self) -> &[String];
}

/// Connections by key, with one entry per CSIAddonsNode: a node's new connection replaces its
/// old one whatever their keys, and a connection put under a key another node's held replaces
/// that one.
pub struct Entries<C> {
    by_key: HashMap<Arc<str>, Arc<C>>,
    /// `<namespace>/<name>` of each CSIAddonsNode (neither part holds a `/`) → its key.
    by_node: HashMap<Box<str>, Arc<str>>,
    by_driver: HashMap<Box<str>, DriverIndex>,
}

/// One driver's connections, counted and found without reading them all.
#[derive(Default)]
struct DriverIndex {
    /// How many of them are in each namespace.
    namespaces: BTreeMap<Box<str>, usize>,
    /// How many of them offer each capability.
    capabilities: BTreeMap<Box<str>, usize>,
    /// The keys of those on each node, in order.
    on_node: HashMap<Box<str>, Vec<Arc<str>>>,
}

impl<C> Default for Entries<C> {
    fn default() -> Self {
        Entries { by_key: HashMap::new(), by_node: HashMap::new(), by_driver: HashMap::new() }
    }
}

fn node_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A connection's capabilities, each once (a sidecar may repeat one; counts must not drift).
fn distinct(capabilities: &[String]) -> BTreeSet<&str> {
    capabilities.iter().map(String::as_str).collect()
}

/// Counts one more of `name`.
fn count_up(counts: &mut BTreeMap<Box<str>, usize>, name: &str) {
    *counts.entry(name.into()).or_default() += 1;
}

/// Counts one fewer of `name`, forgetting it at none.
fn take_one(counts: &mut BTreeMap<Box<str>, usize>, name: &str) {
    if let Some(count) = counts.get_mut(name) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.remove(name);
        }
    }
}

impl<C: Pooled> Entries<C> {
    /// Pools `connection`, replacing its CSIAddonsNode's connection and whatever held its key.
    pub fn insert(&mut self, connection: Arc<C>) {
        let (namespace, name) = connection.node();
        let node = node_name(namespace, name);
        if let Some(previous) = self.by_node.get(node.as_str()).cloned() {
            self.remove(&previous);
        }
        let key: Arc<str> = connection.key().into();
        self.remove(&key);
        self.by_node.insert(node.into(), key.clone());
        let driver = self.by_driver.entry(connection.driver().into()).or_default();
        count_up(&mut driver.namespaces, namespace);
        for capability in distinct(connection.capabilities()) {
            count_up(&mut driver.capabilities, capability);
        }
        let keys = driver.on_node.entry(connection.node_id().into()).or_default();
        let at = keys.binary_search(&key).unwrap_or_else(|at| at);
        keys.insert(at, key.clone());
        self.by_key.insert(key, connection);
    }

    /// Takes the connection under `key` out, with its place in the index.
    pub fn remove(&mut self, key: &str) -> Option<Arc<C>> {
        let (key, connection) = self.by_key.remove_entry(key)?;
        let (namespace, name) = connection.node();
        let node = node_name(namespace, name);
        if self.by_node.get(node.as_str()) == Some(&key) {
            self.by_node.remove(node.as_str());
        }
        if let Some(driver) = self.by_driver.get_mut(connection.driver()) {
            take_one(&mut driver.namespaces, namespace);
            for capability in distinct(connection.capabilities()) {
                take_one(&mut driver.capabilities, capability);
            }
            if let Some(keys) = driver.on_node.get_mut(connection.node_id()) {
                keys.retain(|k| *k != key);
                if keys.is_empty() {
                    driver.on_node.remove(connection.node_id());
                }
            }
            if driver.namespaces.is_empty() {
                self.by_driver.remove(connection.driver());
            }
        }
        Some(connection)
    }

    /// Takes out the connection of CSIAddonsNode `namespace/name`, whatever its key.
    pub fn remove_node(&mut self, namespace: &str, name: &str) {
        if let Some(key) = self.by_node.get(node_name(namespace, name).as_str()).cloned() {
            self.remove(&key);
        }
    }

    pub fn holds_node(&self, namespace: &str, name: &str) -> bool {
        self.by_node.contains_key(node_name(namespace, name).as_str())
    }

    pub fn get(&self, key: &str) -> Option<&Arc<C>> {
        self.by_key.get(key)
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<C>> {
        self.by_key.values()
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The first by key of `driver`'s connections on node `node_id` that offers `capability`.
    pub fn on_node(&self, driver: &str, node_id: &str, capability: &str) -> Option<&Arc<C>> {
        let keys = self.by_driver.get(driver)?.on_node.get(node_id)?;
        keys.iter().filter_map(|key| self.by_key.get(key)).find(|c| c.capabilities().iter().any(|o| o == capability))
    }

    /// Whether any of `driver`'s connections offers `capability`.
    pub fn offers(&self, driver: &str, capability: &str) -> bool {
        self.by_driver.get(driver).is_some_and(|d| d.capabilities.contains_key(capability))
    }

    /// The namespaces that hold `driver`'s connections, in order.
    pub fn namespaces_of(&self, driver: &str) -> impl Iterator<Item = &str> {
        self.by_driver.get(driver).into_iter().flat_map(|d| d.namespaces.keys().map(|n| &**n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        namespace: &'static str,
        name: &'static str,
        pod: &'static str,
        driver: &'static str,
        node_id: &'static str,
        capabilities: Vec<String>,
    }

    impl Pooled for Fake {
        fn key(&self) -> String {
            format!("{}/{}", self.namespace, self.pod)
        }
        fn node(&self) -> (&str, &str) {
            (self.namespace, self.name)
        }
        fn driver(&self) -> &str {
            self.driver
        }
        fn node_id(&self) -> &str {
            self.node_id
        }
        fn capabilities(&self) -> &[String] {
            &self.capabilities
        }
    }

    fn fake(namespace: &'static str, name: &'static str, pod: &'static str, node_id: &'static str) -> Arc<Fake> {
        offering(namespace, name, pod, node_id, &["online", "online"])
    }

    fn offering(
        namespace: &'static str,
        name: &'static str,
        pod: &'static str,
        node_id: &'static str,
        capabilities: &[&str],
    ) -> Arc<Fake> {
        let capabilities = capabilities.iter().map(|c| (*c).to_owned()).collect();
        Arc::new(Fake { namespace, name, pod, driver: "d", node_id, capabilities })
    }

    /// What a scan of every connection would answer, to hold the index to.
    fn scanned(entries: &Entries<Fake>, driver: &str, capability: &str) -> (bool, BTreeSet<String>) {
        let of_driver = || entries.values().filter(|c| c.driver == driver);
        let offers = of_driver().any(|c| c.capabilities.iter().any(|o| o == capability));
        (offers, of_driver().map(|c| c.namespace.to_owned()).collect())
    }

    fn indexed(entries: &Entries<Fake>, driver: &str, capability: &str) -> (bool, BTreeSet<String>) {
        (entries.offers(driver, capability), entries.namespaces_of(driver).map(str::to_owned).collect())
    }

    #[test]
    fn a_node_has_one_entry_and_a_key_one_node() {
        let mut entries = Entries::default();
        entries.insert(fake("ns", "node-a", "pod-1", "n1"));
        // The node's sidecar Pod was replaced: the old key goes.
        entries.insert(fake("ns", "node-a", "pod-2", "n1"));
        assert!(entries.get("ns/pod-1").is_none());
        assert_eq!(entries.get("ns/pod-2").map(|c| c.name), Some("node-a"));
        // Another node names the same Pod: it takes the key, and the first node holds nothing.
        entries.insert(fake("ns", "node-b", "pod-2", "n1"));
        assert!(!entries.holds_node("ns", "node-a"));
        assert!(entries.holds_node("ns", "node-b"));
        assert_eq!(entries.len(), 1);
        assert_eq!(entries.on_node("d", "n1", "online").map(|c| c.name), Some("node-b"));
        entries.remove_node("ns", "node-a");
        assert_eq!(entries.len(), 1, "a node without an entry takes nothing out");
        entries.remove_node("ns", "node-b");
        assert_eq!(entries.len(), 0);
        assert_eq!(indexed(&entries, "d", "online"), (false, BTreeSet::new()));
        assert!(entries.by_driver.is_empty() && entries.by_node.is_empty(), "the index keeps nothing of gone entries");
    }

    #[test]
    fn lookups_answer_as_a_scan_of_every_connection_would() {
        let mut entries = Entries::default();
        let offline = offering("other", "node-c", "pod-3", "n2", &["offline"]);
        for connection in [fake("ns", "node-a", "pod-1", "n1"), fake("ns", "node-b", "pod-2", "n1"), offline] {
            entries.insert(connection);
            for capability in ["online", "offline", "none"] {
                assert_eq!(indexed(&entries, "d", capability), scanned(&entries, "d", capability));
            }
        }
        // The first by key on a node, of those that offer what is asked.
        assert_eq!(entries.on_node("d", "n1", "online").map(|c| c.pod), Some("pod-1"));
        assert!(entries.on_node("d", "n1", "offline").is_none());
        assert_eq!(entries.on_node("d", "n2", "offline").map(|c| c.pod), Some("pod-3"));
        assert!(entries.on_node("e", "n1", "online").is_none());
        // Taken out one by one, in another order than put in; the repeated capability counted once.
        for key in ["ns/pod-2", "other/pod-3", "ns/pod-1"] {
            assert!(entries.remove(key).is_some());
            assert!(entries.remove(key).is_none());
            for capability in ["online", "offline"] {
                assert_eq!(indexed(&entries, "d", capability), scanned(&entries, "d", capability), "after {key}");
            }
        }
        assert!(entries.by_driver.is_empty());
    }
}
