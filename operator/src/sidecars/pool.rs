//! The pool of sidecar connections, one per CSIAddonsNode, keyed as upstream
//! (`<namespace>/<normalized pod name>`), with the lookups the reconcilers need. Unlike upstream,
//! a lookup never dials (channels reconnect by themselves), so one broken sidecar cannot fail a
//! lookup for the others; the leader is found through the driver's Lease in every namespace that
//! has its sidecars, in a fixed order, so it is the same one every time [differs: sidecar-lookup];
//! `ip:port` endpoints work (upstream's manager dials only `pod://` ones) [differs: ip-endpoints];
//! an empty pod name is a key like any other (upstream's manager panics on it). A Lease's holder
//! is remembered while it surely holds it (`lease_holders`), so a leader lookup reads the Lease
//! once per lease term, not per operation.
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::compact::{PodIp, PodIpStatus};
use crate::primitives::read_cached;
use crate::sidecars::idle_channel::IdleChannel;
use crate::sidecars::lease_holders::{LeaseHolders, trusted_for};
use crate::sidecars::pool_entries::{Entries, Pooled};

/// Where a CSIAddonsNode says its sidecar listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `pod://<pod>.<namespace>:<port>`: dial the Pod's IP.
    Pod { name: String, namespace: String, port: u16 },
    /// `<ip>:<port>` (IPv6 in brackets), from the sidecar's `--controller-ip`.
    Address { ip: IpAddr, port: u16 },
}

/// What is wrong with a CSIAddonsNode endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("a pod:// endpoint needs a port")]
    PodWithoutPort,
    #[error("a pod:// endpoint is pod://<pod>.<namespace>:<port>")]
    PodWithoutNamespace,
    #[error("pod name {name:?} is not a DNS-1123 subdomain: {why}")]
    PodName { name: String, why: &'static str },
    #[error("namespace {namespace:?} is not a DNS-1123 label: {why}")]
    Namespace { namespace: String, why: &'static str },
    #[error("only pod:// endpoints and <ip>:<port> are understood")]
    Scheme,
    #[error("an endpoint needs a port")]
    NoPort,
    #[error("{0:?} is not an IP address")]
    NotAnAddress(String),
    #[error("{0:?} is not a port number")]
    NotAPort(String),
}

/// Parses a CSIAddonsNode endpoint.
pub fn parse_endpoint(endpoint: &str) -> Result<Target, EndpointError> {
    let port_of = |text: &str| text.parse::<u16>().map_err(|_| EndpointError::NotAPort(text.to_owned()));
    if let Some(rest) = endpoint.strip_prefix("pod://") {
        let (host, port) = rest.rsplit_once(':').ok_or(EndpointError::PodWithoutPort)?;
        // A Pod name is a DNS subdomain and may hold dots (ceph-csi-operator names Pods after the
        // driver: `rook-ceph.rbd.csi.ceph.com-nodeplugin-7xk2p`); a namespace is a label and holds
        // none, so the namespace is what follows the last dot.
        let (name, namespace) = host.rsplit_once('.').ok_or(EndpointError::PodWithoutNamespace)?;
        // Checked here, not left to a Pod lookup that can only say "not found" for ever.
        if let Some(why) = api::names::dns1123_problem(name, false) {
            return Err(EndpointError::PodName { name: name.to_owned(), why });
        }
        if let Some(why) = api::names::dns1123_problem(namespace, true) {
            return Err(EndpointError::Namespace { namespace: namespace.to_owned(), why });
        }
        return Ok(Target::Pod { name: name.to_owned(), namespace: namespace.to_owned(), port: port_of(port)? });
    }
    if endpoint.contains("://") {
        return Err(EndpointError::Scheme);
    }
    let (host, port) = endpoint.rsplit_once(':').ok_or(EndpointError::NoPort)?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let ip = host.parse::<IpAddr>().map_err(|_| EndpointError::NotAnAddress(host.to_owned()))?;
    Ok(Target::Address { ip, port: port_of(port)? })
}

/// Why a sidecar's address could not be found.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("reading Pod {namespace}/{name}: {source}")]
    ReadPod {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Pod {namespace}/{name} does not exist")]
    NoPod { namespace: String, name: String },
    #[error("Pod {namespace}/{name} has no IP yet (phase {phase})")]
    NoIp { namespace: String, name: String, phase: String },
    #[error("Pod {namespace}/{name} has IP {ip:?}")]
    BadIp { namespace: String, name: String, ip: String },
}

/// `ip:port`, IPv6 in brackets.
pub fn socket_address(ip: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// The address to dial for `target`: a Pod's `status.podIP`, or the address itself.
pub async fn resolve(client: &kube::Client, target: &Target) -> Result<String, ResolveError> {
    match target {
        Target::Address { ip, port } => Ok(socket_address(*ip, *port)),
        Target::Pod { name, namespace, port } => {
            let (namespace, name) = (namespace.clone(), name.clone());
            let pod = match Api::<PodIp>::namespaced(client.clone(), &namespace).get_opt(&name).await {
                Ok(Some(pod)) => pod,
                Ok(None) => return Err(ResolveError::NoPod { namespace, name }),
                Err(source) => return Err(ResolveError::ReadPod { namespace, name, source }),
            };
            let status = pod.status.unwrap_or(PodIpStatus { pod_ip: None, phase: None });
            let Some(ip) = status.pod_ip.filter(|ip| !ip.is_empty()) else {
                let phase = status.phase.unwrap_or_else(|| "unknown".to_owned());
                return Err(ResolveError::NoIp { namespace, name, phase });
            };
            match ip.parse::<IpAddr>() {
                Ok(ip) => Ok(socket_address(ip, *port)),
                Err(_) => Err(ResolveError::BadIp { namespace, name, ip }),
            }
        }
    }
}

/// A sidecar the manager can call.
pub struct Connection {
    /// The CSIAddonsNode's namespace and name.
    pub namespace: String,
    pub name: String,
    pub driver: String,
    pub node_id: String,
    /// The sidecar's Pod (for the pool key and the leader lookup).
    pub pod: String,
    pub endpoint: String,
    /// `<field>.<VALUE>` strings.
    pub capabilities: Vec<String>,
    /// Open while used; closed after `--sidecar-idle-timeout` without a call.
    pub channel: IdleChannel,
    /// The per-driver trust's stamp when the channel was dialled (`DriverTrust::stamp`): a
    /// channel redials with the TLS settings it was made with, so one made under other trust
    /// is dialled anew.
    pub trust_stamp: u64,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("key", &self.key())
            .field("driver", &self.driver)
            .field("node_id", &self.node_id)
            .field("endpoint", &self.endpoint)
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

impl Connection {
    pub fn key(&self) -> String {
        pool_key(&self.namespace, &self.pod)
    }

    pub fn offers(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

impl Pooled for Connection {
    fn key(&self) -> String {
        Connection::key(self)
    }
    fn node(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
    fn driver(&self) -> &str {
        &self.driver
    }
    fn node_id(&self) -> &str {
        &self.node_id
    }
    fn capabilities(&self) -> &[String] {
        &self.capabilities
    }
}

/// `<namespace>/<normalized pod name>`.
pub fn pool_key(namespace: &str, pod: &str) -> String {
    format!("{namespace}/{}", api::lease::normalize_lease_name(pod))
}

/// Why no connection was found; says what was looked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("no sidecar of driver {driver} on node {node} offers {capability}")]
    NoNodeSidecar { driver: String, node: String, capability: String },
    #[error("no sidecar of driver {driver} is registered")]
    NoSidecars { driver: String },
    #[error("no leader found for driver {driver}: {why}")]
    NoLeader { driver: String, why: String },
}

/// The connections, shared by all reconcilers; every lookup but `close_idle` is answered from
/// an index (`pool_entries`), not by reading every connection.
#[derive(Default)]
pub struct Pool {
    connections: RwLock<Entries<Connection>>,
    holders: LeaseHolders,
}

impl Pool {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Entries<Connection>> {
        self.connections.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Entries<Connection>> {
        self.connections.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds or replaces the connection under its key; an entry of the same CSIAddonsNode under
    /// another key (its sidecar Pod was replaced) goes, so lookups never find the dead one.
    pub fn put(&self, connection: Connection) -> Arc<Connection> {
        let connection = Arc::new(connection);
        self.write().insert(connection.clone());
        connection
    }

    /// Removes the connection of CSIAddonsNode `namespace/name`, whatever its key.
    pub fn remove_node(&self, namespace: &str, name: &str) {
        self.write().remove_node(namespace, name);
    }

    /// Whether CSIAddonsNode `namespace/name` has a pooled connection.
    pub fn holds_node(&self, namespace: &str, name: &str) -> bool {
        self.read().holds_node(namespace, name)
    }

    pub fn get(&self, key: &str) -> Option<Arc<Connection>> {
        self.read().get(key).cloned()
    }

    /// Closes the connections nothing has called for `idle` (each dials again at its next call).
    pub fn close_idle(&self, idle: std::time::Duration) {
        for connection in self.read().values() {
            connection.channel.close_if_idle(idle);
        }
    }

    /// How many connections there are (for metrics).
    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// The sidecar of `driver` on `node` that offers `capability` (the first by key, so the
    /// choice is stable).
    pub fn on_node(&self, driver: &str, node: &str, capability: &str) -> Result<Arc<Connection>, LookupError> {
        self.read().on_node(driver, node, capability).cloned().ok_or_else(|| LookupError::NoNodeSidecar {
            driver: driver.to_owned(),
            node: node.to_owned(),
            capability: capability.to_owned(),
        })
    }

    /// Whether any sidecar of `driver` offers `capability`.
    pub fn offers(&self, driver: &str, capability: &str) -> bool {
        self.read().offers(driver, capability)
    }

    /// Namespaces that hold sidecars of `driver`, sorted.
    pub fn namespaces_of(&self, driver: &str) -> BTreeSet<String> {
        self.read().namespaces_of(driver).map(str::to_owned).collect()
    }

    /// The connection of `lease`'s remembered holder, while it is trusted.
    fn known_holder(&self, lease: &str) -> Option<Arc<Connection>> {
        let answers = |key: &str| self.get(key).map(|c| c.channel.unavailable_answers());
        self.holders.holder(lease, answers).and_then(|key| self.get(&key))
    }

    /// The sidecar holding `driver`'s Lease, looked up in each namespace that has its sidecars;
    /// a holder read before is taken without a request while it is trusted (`LeaseHolders`).
    pub async fn leader(&self, client: &kube::Client, driver: &str) -> Result<Arc<Connection>, LookupError> {
        let namespaces = self.namespaces_of(driver);
        if namespaces.is_empty() {
            return Err(LookupError::NoSidecars { driver: driver.to_owned() });
        }
        let lease_name = api::lease::driver_lease_name(driver);
        let mut why = Vec::new();
        for namespace in namespaces {
            let lease_key = format!("{namespace}/{lease_name}");
            if let Some(connection) = self.known_holder(&lease_key) {
                return Ok(connection);
            }
            let turn = self.holders.read_turn(&lease_key);
            let _reading = turn.lock().await;
            if let Some(connection) = self.known_holder(&lease_key) {
                return Ok(connection);
            }
            let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
            let lease = read_cached(&leases, &lease_name).await;
            let (holder, trusted) = match lease {
                Ok(Some(lease)) => {
                    let spec = lease.spec.unwrap_or_default();
                    let trusted = trusted_for(&spec, k8s_openapi::jiff::Timestamp::now());
                    (spec.holder_identity.filter(|h| !h.is_empty()), trusted)
                }
                Ok(None) => {
                    why.push(format!("no Lease {namespace}/{lease_name}"));
                    continue;
                }
                Err(e) => {
                    why.push(format!("reading Lease {namespace}/{lease_name}: {e}"));
                    continue;
                }
            };
            let Some(holder) = holder else {
                why.push(format!("Lease {namespace}/{lease_name} has no holder"));
                continue;
            };
            match self.get(&format!("{namespace}/{holder}")) {
                Some(connection) => {
                    let answers = connection.channel.unavailable_answers();
                    self.holders.remember(lease_key, connection.key(), answers, trusted);
                    return Ok(connection);
                }
                None => why.push(format!("the holder {namespace}/{holder} has no registered sidecar")),
            }
        }
        Err(LookupError::NoLeader { driver: driver.to_owned(), why: why.join("; ") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_endpoints_name_a_subdomain_and_a_label() {
        for bad in [
            "pod://ポッド.名前空間:9070",
            "pod://Pod.ns:9070",
            "pod://p-.ns:9070",
            "pod://p.-ns:9070",
            "pod://.ns:9070",
        ] {
            let why = parse_endpoint(bad).unwrap_err().to_string();
            assert!(why.contains("DNS-1123"), "{bad}: {why}");
        }
        // A namespace is a label (at most 63), a Pod name a subdomain (at most 253).
        assert!(parse_endpoint(&format!("pod://p.{}:1", "a".repeat(64))).is_err());
        assert!(parse_endpoint(&format!("pod://{}.ns:1", "a".repeat(253))).is_ok());
        assert!(parse_endpoint(&format!("pod://{}.ns:1", "a".repeat(254))).is_err());
    }

    #[test]
    fn pod_names_with_dots_split_at_the_last_dot() {
        // ceph-csi-operator's node plugin Pod, named after its driver.
        assert_eq!(
            parse_endpoint("pod://rook-ceph.rbd.csi.ceph.com-nodeplugin-7xk2p.rook-ceph:9070"),
            Ok(Target::Pod {
                name: "rook-ceph.rbd.csi.ceph.com-nodeplugin-7xk2p".into(),
                namespace: "rook-ceph".into(),
                port: 9070
            })
        );
        let why = parse_endpoint("pod://a..b.ns:1").unwrap_err().to_string();
        assert!(why.contains("pod name"), "{why}");
    }

    #[test]
    fn endpoints_of_both_forms_parse() {
        assert_eq!(
            parse_endpoint("pod://csi-rbdplugin-x7.rook-ceph:9070"),
            Ok(Target::Pod { name: "csi-rbdplugin-x7".into(), namespace: "rook-ceph".into(), port: 9070 })
        );
        assert_eq!(
            parse_endpoint("10.0.0.5:9070"),
            Ok(Target::Address { ip: "10.0.0.5".parse().unwrap(), port: 9070 })
        );
        let v6 = parse_endpoint("[fd00::5]:9070").unwrap();
        assert_eq!(v6, Target::Address { ip: "fd00::5".parse().unwrap(), port: 9070 });
        let Target::Address { ip, port } = v6 else { unreachable!() };
        assert_eq!(socket_address(ip, port), "[fd00::5]:9070");
        for (bad, why) in [
            ("pod://just-a-pod:9070", "pod://<pod>.<namespace>"),
            ("pod://p.ns:port", "not a port"),
            ("pod://p.ns", "needs a port"),
            ("http://10.0.0.5:9070", "only pod://"),
            ("node-1:9070", "not an IP address"),
            ("10.0.0.5", "needs a port"),
        ] {
            let err = parse_endpoint(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn keys_are_upstreams_and_empty_names_do_not_panic() {
        assert_eq!(pool_key("rook-ceph", "csi_rbd.plugin-"), "rook-ceph/csi-rbd-plugin-X");
        assert_eq!(pool_key("ns", ""), "ns/");
    }
}
