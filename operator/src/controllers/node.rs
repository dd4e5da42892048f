//! CSIAddonsNode: connect to the sidecar it names, pool the connection, report the driver's
//! capabilities. fetch → validate (endpoint) → decide (reuse or dial; retry or give up) → act
//! (GetCapabilities) → status. Unlike upstream: the retry delay is in seconds (defect 1), the
//! retry count is a status field (defect 27), a healthy pooled connection is reused rather than
//! replaced every pass (defect 19), `ip:port` endpoints work (defect 7).
use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::{CSIADDONSNODE_FINALIZER, CSIAddonsNode, NetworkFenceClientStatus, SIDECAR_POD_ANNOTATION};
use api::proto::identity::GetCapabilitiesRequest;
use api::proto::identity::identity_client::IdentityClient;
use futures::Future;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use crate::cache_ready::Ready;
use crate::context::{Context, ReconcileError, locked, now_seconds};
use crate::pool::{Connection, Target, parse_endpoint, pool_key, resolve};
use crate::sidecar_client::SidecarChannel;
use crate::sidecar_client::with_timeout;

const NAME: &str = "csiaddonsnode";
/// A connected sidecar is re-checked this often (upstream: 1 hour).
const RECHECK: Duration = Duration::from_secs(3600);
/// Failed attempts before the CSIAddonsNode is deleted (the sidecar registers it again).
pub const MAX_RETRIES: u32 = 3;
const CAPABILITIES_TIMEOUT: Duration = Duration::from_secs(60);

pub const CONNECTED: &str = "Connected";
pub const RETRYING: &str = "Retrying";
pub const FAILED: &str = "Failed";

/// What to do after a failed connection attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterFailure {
    /// Retry attempt `attempt` of MAX_RETRIES after `delay`.
    Retry { attempt: u32, delay: Duration },
    /// Give up: delete the CSIAddonsNode (a live sidecar re-creates it).
    Delete,
}

/// `failures_so_far` failed before this one; the base delay doubles per failure (2 s, 4 s, 8 s
/// with upstream's default of 2 s).
pub fn after_failure(failures_so_far: u32, base: Duration) -> AfterFailure {
    if failures_so_far >= MAX_RETRIES {
        return AfterFailure::Delete;
    }
    // Capped at an hour, so no setting can overflow it.
    let delay = base.max(Duration::from_secs(1)).saturating_mul(2u32.saturating_pow(failures_so_far)).min(RECHECK);
    AfterFailure::Retry { attempt: failures_so_far + 1, delay }
}

/// The Pod a CSIAddonsNode's sidecar runs in: named by a `pod://` endpoint, or by our sidecar's
/// annotation for `ip:port` ones; the CSIAddonsNode's own name when neither says.
pub fn sidecar_pod(node: &CSIAddonsNode, target: &Target) -> String {
    match target {
        Target::Pod { name, .. } => name.clone(),
        Target::Address { .. } => {
            node.annotations().get(SIDECAR_POD_ANNOTATION).cloned().unwrap_or_else(|| node.name_any())
        }
    }
}

/// Checks the spec; the error is the status message.
pub fn validate(node: &CSIAddonsNode) -> Result<Target, String> {
    let driver = &node.spec.driver;
    if driver.name.is_empty() {
        return Err("spec.driver.name is empty".into());
    }
    if driver.endpoint.is_empty() {
        return Err("spec.driver.endpoint is empty".into());
    }
    parse_endpoint(&driver.endpoint).map_err(|why| format!("spec.driver.endpoint {:?}: {why}", driver.endpoint))
}

/// The CSIAddonsNodes in the cache, and whether this manager has settled each one's connection
/// yet. Other controllers ask it before concluding from the pool that a driver offers nothing: at
/// a start or failover the pool fills pass by pass, and an empty pool then means "not yet".
#[derive(Clone)]
pub struct Roster {
    store: Store<CSIAddonsNode>,
    ready: Ready,
    /// Drivers one of whose sidecars was pooled by a pass (their PVCs are looked at again).
    connected: mpsc::UnboundedSender<String>,
}

impl Roster {
    /// Whether every CSIAddonsNode of `driver` in the cache is pooled or has a spec that cannot
    /// be used; false until the cache has its first list and while any is still being dialled.
    pub fn settled(&self, ctx: &Context, driver: &str) -> bool {
        if !self.ready.is_ready() {
            return false;
        }
        let failed = locked(&ctx.failed_nodes);
        self.store
            .state()
            .iter()
            .filter(|n| n.spec.driver.name == driver && n.metadata.deletion_timestamp.is_none())
            .all(|n| {
                let namespace = n.namespace().unwrap_or_default();
                ctx.pool.holds_node(&namespace, &n.name_any())
                    || failed.contains(n.uid().as_deref().unwrap_or_default())
            })
    }
}

/// The CSIAddonsNode watch: the roster the other controllers read, the node controller's stream
/// of changes, and the news of drivers whose sidecars were pooled.
pub fn watch(
    ctx: &Context,
) -> (
    Roster,
    impl futures::Stream<Item = Result<CSIAddonsNode, watcher::Error>> + Send + 'static,
    mpsc::UnboundedReceiver<String>,
) {
    let (store, ready, changes) = super::trimmed_watch(ctx.watched::<CSIAddonsNode>());
    let (connected, news) = mpsc::unbounded_channel();
    (Roster { store, ready, connected }, changes, news)
}

pub async fn run(
    ctx: Arc<Context>,
    roster: Roster,
    changes: impl futures::Stream<Item = Result<CSIAddonsNode, watcher::Error>> + Send + 'static,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    ctx.caches.follow(NAME, roster.ready.clone());
    let controller = Controller::for_stream(changes, roster.store.clone());
    super::run_controller(controller, ctx, NAME, stop, move |node, ctx| reconcile(node, ctx, roster.clone())).await;
}

async fn reconcile(node: Arc<CSIAddonsNode>, ctx: Arc<Context>, roster: Roster) -> Result<Action, ReconcileError> {
    let namespace = node.namespace().unwrap_or_default();
    let name = node.name_any();
    let uid = node.uid().unwrap_or_default();
    let target = match validate(&node) {
        Ok(target) => target,
        Err(message) => {
            if node.metadata.deletion_timestamp.is_some() {
                super::set_finalizer(&ctx, node.as_ref(), CSIADDONSNODE_FINALIZER, false).await?;
                return Ok(Action::await_change());
            }
            let status = NodeStatus { state: FAILED, message: &message, retries: None, capabilities: None };
            write_state(&ctx, &node, status, None).await?;
            locked(&ctx.failed_nodes).insert(uid);
            publish_connections(&ctx);
            ctx.event(node.as_ref(), true, "InvalidSpec", message).await;
            return Ok(Action::await_change());
        }
    };
    let key = pool_key(&namespace, &sidecar_pod(&node, &target));
    if node.metadata.deletion_timestamp.is_some() {
        ctx.pool.remove_node(&namespace, &name);
        locked(&ctx.node_retry_at).remove(&uid);
        locked(&ctx.failed_nodes).remove(&uid);
        super::set_finalizer(&ctx, node.as_ref(), CSIADDONSNODE_FINALIZER, false).await?;
        publish_connections(&ctx);
        return Ok(Action::await_change());
    }
    // A retry that is not due yet (this pass came from our own status write).
    let now = now_seconds();
    if let Some(due) = locked(&ctx.node_retry_at).get(&uid).copied().filter(|due| *due > now) {
        return Ok(Action::requeue(Duration::from_secs((due - now).unsigned_abs())));
    }
    super::set_finalizer(&ctx, node.as_ref(), CSIADDONSNODE_FINALIZER, true).await?;

    match connect(&ctx, &node, &target, &key).await {
        Ok(connection) => {
            let was = node.status.as_ref().and_then(|s| s.state.clone());
            let capabilities = connection.capabilities.clone();
            locked(&ctx.node_retry_at).remove(&uid);
            locked(&ctx.failed_nodes).remove(&uid);
            let newly = !ctx.pool.holds_node(&namespace, &name);
            // Pooled before the fence clients are asked for: a failure there leaks nothing (defect 21).
            let connection = ctx.pool.put(connection);
            publish_connections(&ctx);
            if newly {
                // The PVC controller stops with the other reconcilers: a send can only fail then.
                let _ = roster.connected.send(connection.driver.clone());
            }
            let clients = super::fence_clients::list(&ctx, &node, &connection).await;
            let message = "Successfully established connection with sidecar";
            let status = NodeStatus { state: CONNECTED, message, retries: None, capabilities: Some(capabilities) };
            write_state(&ctx, &node, status, clients.as_ref().ok().cloned()).await?;
            if was.as_deref() != Some(CONNECTED) {
                ctx.event(node.as_ref(), false, "Connected", format!("{message} at {}", node.spec.driver.endpoint))
                    .await;
            }
            if let Err(why) = clients {
                ctx.event(node.as_ref(), true, "FenceClientsFailed", why.clone()).await;
                return Err(ReconcileError::Transient(why));
            }
            Ok(Action::requeue(RECHECK))
        }
        Err(why) => {
            let failures = node.status.as_ref().and_then(|s| s.retries).and_then(|n| u32::try_from(n).ok());
            match after_failure(failures.unwrap_or(0), ctx.settings().csi_addons_node_retry_delay) {
                AfterFailure::Retry { attempt, delay } => {
                    let message = format!("Connection failed: {why}. Retrying attempt {attempt}/{MAX_RETRIES}.");
                    tracing::info!(node = %format!("{namespace}/{name}"), %message);
                    let due = now_seconds().saturating_add(i64::try_from(delay.as_secs()).unwrap_or(i64::MAX));
                    locked(&ctx.node_retry_at).insert(uid, due);
                    publish_connections(&ctx);
                    let status =
                        NodeStatus { state: RETRYING, message: &message, retries: Some(attempt), capabilities: None };
                    write_state(&ctx, &node, status, None).await?;
                    Ok(Action::requeue(delay))
                }
                AfterFailure::Delete => {
                    let message = format!(
                        "Connection failed {} times ({why}); deleting the CSIAddonsNode so the sidecar registers again",
                        MAX_RETRIES + 1
                    );
                    ctx.event(node.as_ref(), true, "ConnectionFailed", message).await;
                    ctx.pool.remove_node(&namespace, &name);
                    locked(&ctx.node_retry_at).remove(&uid);
                    let api = Api::<CSIAddonsNode>::namespaced(ctx.client.clone(), &namespace);
                    match api.delete(&name, &Default::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(e.into()),
                    }
                    publish_connections(&ctx);
                    Ok(Action::await_change())
                }
            }
        }
    }
}

/// Reuses the pooled connection when it still answers at the same address; dials otherwise.
/// Capabilities are read again either way.
async fn connect(ctx: &Context, node: &CSIAddonsNode, target: &Target, key: &str) -> Result<Connection, String> {
    let address = resolve(&ctx.client, target).await?;
    let pooled = ctx.pool.get(key).filter(|c| c.endpoint == address);
    let channel = match &pooled {
        Some(connection) => connection.channel.clone(),
        None => ctx.security.connect(&address).await.map_err(|e| with_causes(&e))?,
    };
    let capabilities = match capabilities(ctx, channel.clone()).await {
        Ok(capabilities) => capabilities,
        Err(_) if pooled.is_some() => {
            // The pooled channel may be stale (the sidecar restarted at the same address): dial once.
            let fresh = ctx.security.connect(&address).await.map_err(|e| with_causes(&e))?;
            return Ok(connection(node, target, address, capabilities(ctx, fresh.clone()).await?, fresh));
        }
        Err(e) => return Err(e),
    };
    Ok(connection(node, target, address, capabilities, channel))
}

/// An error with its causes ("transport error" alone says nothing).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    text
}

fn connection(
    node: &CSIAddonsNode,
    target: &Target,
    address: String,
    capabilities: Vec<String>,
    channel: SidecarChannel,
) -> Connection {
    Connection {
        namespace: node.namespace().unwrap_or_default(),
        name: node.name_any(),
        driver: node.spec.driver.name.clone(),
        node_id: node.spec.driver.node_id.clone(),
        pod: sidecar_pod(node, target),
        endpoint: address,
        capabilities,
        channel,
    }
}

async fn capabilities(ctx: &Context, channel: SidecarChannel) -> Result<Vec<String>, String> {
    let request = with_timeout(GetCapabilitiesRequest {}, CAPABILITIES_TIMEOUT);
    let mut client = IdentityClient::new(channel);
    let answer = ctx.metrics.timed_rpc("Identity/GetCapabilities", client.get_capabilities(request)).await;
    let answer = answer.map_err(|s| format!("GetCapabilities: {:?}: {}", s.code(), s.message()))?;
    Ok(api::capabilities::to_strings(&answer.into_inner().capabilities))
}

/// The state fields of a status write.
struct NodeStatus<'a> {
    state: &'a str,
    message: &'a str,
    retries: Option<u32>,
    /// None: keep the previous ones.
    capabilities: Option<Vec<String>>,
}

/// Writes the status; `fence_clients` None keeps the previous list.
async fn write_state(
    ctx: &Context,
    node: &CSIAddonsNode,
    next: NodeStatus<'_>,
    fence_clients: Option<Vec<NetworkFenceClientStatus>>,
) -> Result<(), kube::Error> {
    let previous = node.status.clone().unwrap_or_default();
    let capabilities = next.capabilities.unwrap_or(previous.capabilities);
    let mut status = json!({"state": next.state, "message": next.message, "capabilities": capabilities});
    if let Some(retries) = next.retries {
        status["retries"] = json!(retries);
    }
    let clients = fence_clients.unwrap_or(previous.network_fence_client_status);
    // An empty list is written too, so a class taken out of the annotation leaves the status.
    status["networkFenceClientStatus"] = serde_json::to_value(&clients).unwrap_or(serde_json::Value::Null);
    ctx.apply_status(node, status).await
}

/// `csi_addons_sidecar_connections{state}`: connected (pooled), retrying (a retry is due),
/// failed (a spec that cannot be used).
fn publish_connections(ctx: &Context) {
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let gauge = &ctx.metrics.sidecar_connections;
    gauge.with_label_values(&["connected"]).set(count(ctx.pool.len()));
    gauge.with_label_values(&["retrying"]).set(count(locked(&ctx.node_retry_at).len()));
    gauge.with_label_values(&["failed"]).set(count(locked(&ctx.failed_nodes).len()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::csiaddons::{CSIAddonsNodeDriver, CSIAddonsNodeSpec};

    fn node(endpoint: &str) -> CSIAddonsNode {
        CSIAddonsNode::new(
            "n1-ns-daemonset-plugin",
            CSIAddonsNodeSpec {
                driver: CSIAddonsNodeDriver { name: "d".into(), endpoint: endpoint.into(), node_id: "n1".into() },
            },
        )
    }

    #[test]
    fn retries_wait_seconds_and_end_in_deletion() {
        let base = Duration::from_secs(2);
        assert_eq!(after_failure(0, base), AfterFailure::Retry { attempt: 1, delay: Duration::from_secs(2) });
        assert_eq!(after_failure(2, base), AfterFailure::Retry { attempt: 3, delay: Duration::from_secs(8) });
        assert_eq!(after_failure(3, base), AfterFailure::Delete);
        // A base of 0 still waits (upstream [main]'s nanosecond reading made it immediate).
        assert_eq!(after_failure(0, Duration::ZERO), AfterFailure::Retry { attempt: 1, delay: Duration::from_secs(1) });
        // Any setting is safe: the delay is capped at an hour.
        assert_eq!(after_failure(2, Duration::from_secs(u64::MAX)), AfterFailure::Retry { attempt: 3, delay: RECHECK });
    }

    #[test]
    fn the_pool_key_names_the_sidecar_pod_for_both_endpoint_forms() {
        let pod = node("pod://csi-plugin-x.ns:9070");
        assert_eq!(sidecar_pod(&pod, &validate(&pod).unwrap()), "csi-plugin-x");
        let mut address = node("127.0.0.1:9070");
        let target = validate(&address).unwrap();
        assert_eq!(sidecar_pod(&address, &target), "n1-ns-daemonset-plugin", "no annotation: the object's name");
        address.metadata.annotations = Some([(SIDECAR_POD_ANNOTATION.to_owned(), "csi-plugin-y".to_owned())].into());
        assert_eq!(sidecar_pod(&address, &target), "csi-plugin-y");
    }

    #[test]
    fn bad_specs_are_named() {
        assert!(validate(&node("")).unwrap_err().contains("endpoint is empty"));
        assert!(validate(&node("dns:///x:1")).unwrap_err().contains("only pod://"));
        let mut nameless = node("pod://p.ns:1");
        nameless.spec.driver.name.clear();
        assert!(validate(&nameless).unwrap_err().contains("name is empty"));
    }
}
