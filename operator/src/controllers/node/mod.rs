//! CSIAddonsNode: connect to the sidecar it names, pool the connection, report the driver's
//! capabilities. fetch → validate (`decide::validate`) → decide (reuse or dial;
//! `decide::after_failure`) → act (GetCapabilities) → status. Unlike upstream: the retry count is
//! a status field (upstream writes it into `status.reason` as text), a healthy pooled connection
//! is reused rather than replaced every pass [differs: keep-connection], `ip:port` endpoints work.
pub mod decide;
pub mod fence_clients;
pub mod roster;

use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::{CSIADDONSNODE_FINALIZER, CSIAddonsNode, NetworkFenceClientStatus};
use api::proto::identity::GetCapabilitiesRequest;
use api::proto::identity::identity_client::IdentityClient;
use futures::{Future, StreamExt};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use self::decide::{AfterFailure, MAX_RETRIES, RECHECK, after_failure, retry_policy, sidecar_pod, validate};
use self::fence_clients::FenceClientsError;
pub use self::roster::Roster;
use crate::core::Core;
use crate::core::action::Action;
use crate::core::backoff::Backoff;
use crate::core::clock::now_seconds;
use crate::core::error::{Categorized, Category, kube_category};
use crate::core::fingerprints::{Fingerprints, spec_and_annotations};
use crate::core::run::Context;
use crate::core::wakeups::Wakeups;
use crate::sidecars::client::{ClientError, with_timeout};
use crate::sidecars::idle_channel::IdleChannel;
use crate::sidecars::pool::{Connection, ResolveError, Target, pool_key, resolve};

const NAME: &str = "csiaddonsnode";
const CAPABILITIES_TIMEOUT: Duration = Duration::from_secs(60);

pub const CONNECTED: &str = "Connected";
pub const RETRYING: &str = "Retrying";
pub const FAILED: &str = "Failed";

/// The controller's context: the core, the backoff of connection attempts, and the roster.
pub type NodeContext = Context<NodeState>;

/// What the CSIAddonsNode controller alone keeps.
pub struct NodeState {
    /// Attempts in a row that failed: a pass that comes early (an annotation bumped during the
    /// wait) must not cut the wait short.
    retry: Backoff,
    roster: Roster,
    /// What of each node the last pass acted on: a change to anything else (our own status
    /// write) starts no pass, as upstream's predicate (generation or annotations changed).
    fingerprints: Fingerprints,
    /// Each Connected node's next check, an hour on.
    checks: Wakeups,
}

/// Why a pass could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The connection is pooled and Connected; only the fence clients are missing.
    #[error("listing fence clients: {0}")]
    FenceClients(#[source] FenceClientsError),
}

impl Categorized for Error {
    fn category(&self) -> Category {
        match self {
            Error::Api(e) => kube_category(e),
            Error::FenceClients(FenceClientsError::InvalidClass { .. }) => Category::Permanent,
            Error::FenceClients(FenceClientsError::ReadClass { source, .. }) => kube_category(source),
            Error::FenceClients(_) => Category::Transient,
        }
    }

    /// A failure of the fence clients has its own event (`FenceClientsFailed`).
    fn announced(&self) -> bool {
        matches!(self, Error::FenceClients(_))
    }
}

/// Why a sidecar could not be reached.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The client's own words (they name the address).
    #[error("{source}")]
    Dial {
        address: String,
        #[source]
        source: ClientError,
    },
    #[error("GetCapabilities: {code:?}: {message}")]
    Capabilities { code: tonic::Code, message: String },
}

/// The CSIAddonsNode watch, the manager's only one: the roster the other controllers read, the
/// node controller's stream of changes, a copy of each change for the NetworkFenceClass
/// controller (a second watch of every node would cost its list requests and its decoding), and
/// the news of drivers whose sidecars were pooled.
pub fn watch(
    core: &Core,
) -> (
    Roster,
    impl futures::Stream<Item = Result<CSIAddonsNode, watcher::Error>> + Send + 'static,
    mpsc::UnboundedReceiver<CSIAddonsNode>,
    mpsc::UnboundedReceiver<String>,
) {
    let (store, ready, changes) = crate::core::watch::trimmed_watch(core.watched::<CSIAddonsNode>());
    let (copies, copied) = mpsc::unbounded_channel();
    let changes = changes.inspect(move |change| {
        if let Ok(node) = change {
            // The receiver goes only when the manager stops leading, as this stream does.
            let _ = copies.send(node.clone());
        }
    });
    let (connected, news) = mpsc::unbounded_channel();
    (Roster { store, ready, failed: Arc::default(), connected }, changes, copied, news)
}

pub async fn run(
    core: Arc<Core>,
    roster: Roster,
    changes: impl futures::Stream<Item = Result<CSIAddonsNode, watcher::Error>> + Send + 'static,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    core.caches.follow(NAME, roster.ready.clone());
    // A driver's CA appearing, changing or going has its sidecars dialled again under it now,
    // not at the next hourly check.
    let trust_changes = core.security.trust().changes();
    let fingerprints = Fingerprints::default();
    let changes = fingerprints.filter(changes, spec_and_annotations);
    let checks = Wakeups::default();
    let controller = crate::core::queue::Triggers::new(changes)
        .all_on(trust_changes, roster.store.clone())
        .on(checks.due::<CSIAddonsNode>())
        .controller(roster.store.clone());
    let state = NodeState { retry: Backoff::default(), roster, fingerprints, checks };
    let ctx = Arc::new(Context::new(core, state));
    let prune = |ctx: &NodeContext, live: &std::collections::HashSet<String>| {
        ctx.state.retry.retain(live);
        ctx.state.fingerprints.retain(live);
        crate::primitives::locked(&ctx.state.roster.failed).retain(|uid| live.contains(uid));
    };
    crate::core::backoff::prune_periodically(Arc::downgrade(&ctx), ctx.state.roster.store.clone(), prune);
    crate::core::run::run_controller(controller, ctx, NAME, stop, reconcile).await;
}

pub(crate) async fn reconcile(node: Arc<CSIAddonsNode>, ctx: Arc<NodeContext>) -> Result<Action, Error> {
    let namespace = node.namespace().unwrap_or_default();
    let name = node.name_any();
    let uid = node.uid().unwrap_or_default();
    let target = match validate(&node) {
        Ok(target) => target,
        Err(invalid) => {
            ctx.state.checks.forget(&namespace, &name);
            let message = invalid.to_string();
            if node.metadata.deletion_timestamp.is_some() {
                crate::core::patch::set_finalizer(&ctx, node.as_ref(), CSIADDONSNODE_FINALIZER, false).await?;
                return Ok(Action::await_change());
            }
            let status = NodeStatus { state: FAILED, message: &message, retries: None, capabilities: None };
            write_state(&ctx, &node, status, None).await?;
            ctx.state.roster.set_failed(&uid, true);
            publish_connections(&ctx);
            ctx.event(node.as_ref(), true, "InvalidSpec", message).await;
            return Ok(Action::await_change());
        }
    };
    let key = pool_key(&namespace, &sidecar_pod(&node, &target));
    if node.metadata.deletion_timestamp.is_some() {
        ctx.state.checks.forget(&namespace, &name);
        ctx.pool.remove_node(&namespace, &name);
        ctx.state.retry.forget(&uid);
        ctx.state.roster.set_failed(&uid, false);
        crate::core::patch::set_finalizer(&ctx, node.as_ref(), CSIADDONSNODE_FINALIZER, false).await?;
        publish_connections(&ctx);
        return Ok(Action::await_change());
    }
    // A retry that is not due yet (this pass came from our own status write).
    let policy = retry_policy(ctx.settings().csi_addons_node_retry_delay);
    if let Some(wait) = ctx.state.retry.wait(&uid, policy, now_seconds()) {
        return Ok(Action::requeue(wait));
    }
    crate::core::patch::set_finalizer(&ctx, node.as_ref(), CSIADDONSNODE_FINALIZER, true).await?;

    // A check keeps no connection open that calls did not have open already: at a manager's start
    // every node is checked at once, and an open HTTP/2 connection holds some 40 KiB.
    let in_use = ctx.pool.get(&key).is_some_and(|c| c.channel.is_open());
    match connect(&ctx, &node, &target, &key).await {
        Ok(connection) => {
            let was = node.status.as_ref().and_then(|s| s.state.clone());
            let capabilities = connection.capabilities.clone();
            ctx.state.retry.forget(&uid);
            ctx.state.roster.set_failed(&uid, false);
            let newly = !ctx.pool.holds_node(&namespace, &name);
            // Pooled before the fence clients are asked for: a failure there leaks nothing
            // (upstream's manager loses the connection it dialled). [differs: fence-clients-pooled]
            let connection = ctx.pool.put(connection);
            publish_connections(&ctx);
            if newly {
                // The PVC controller stops with the other reconcilers: a send can only fail then.
                let _ = ctx.state.roster.connected.send(connection.driver.clone());
            }
            let clients = fence_clients::list(&ctx, &node, &connection).await;
            if !in_use {
                connection.channel.close();
            }
            let message = "Successfully established connection with sidecar";
            let status = NodeStatus { state: CONNECTED, message, retries: None, capabilities: Some(capabilities) };
            write_state(&ctx, &node, status, clients.as_ref().ok().cloned()).await?;
            // Told when a node recovers (it was Retrying or Failed); a first connection is told
            // by the status alone: after an install or upgrade the sidecars of a large cluster all
            // connect at once, and an Event each would double the writes the API server takes.
            if was.as_deref().is_some_and(|was| was != CONNECTED) {
                ctx.event(node.as_ref(), false, "Connected", format!("{message} at {}", node.spec.driver.endpoint))
                    .await;
            }
            if let Err(why) = clients {
                ctx.event(node.as_ref(), true, "FenceClientsFailed", why.to_string()).await;
                return Err(Error::FenceClients(why));
            }
            // From the compact queue, not kube's scheduler: a node waiting there takes about a
            // fifth of the memory (see `core::wakeups`).
            ctx.state.checks.after(&namespace, &name, RECHECK);
            Ok(Action::await_change())
        }
        Err(ConnectError::Resolve(why @ ResolveError::NoIp { .. })) => {
            // A Pod without an IP is still starting (its sandbox not up yet): waiting for it is
            // no failed attempt, so a slow start never uses up the retries that end in deletion.
            // The count so far stays as it was; the pass comes back after the first retry delay.
            let message = format!("Waiting for the sidecar's address: {why}; not counted as a failed attempt");
            tracing::info!(node = %format!("{namespace}/{name}"), %message);
            let retries = node.status.as_ref().and_then(|s| s.retries).and_then(|n| u32::try_from(n).ok());
            let status = NodeStatus { state: RETRYING, message: &message, retries, capabilities: None };
            write_state(&ctx, &node, status, None).await?;
            Ok(Action::requeue(retry_policy(ctx.settings().csi_addons_node_retry_delay).delay(1)))
        }
        Err(why) => {
            // A connection dialled under trust that no longer holds (a CA that appeared, changed or
            // broke) is not left for other callers while this one retries.
            let stamp = ctx.security.trust().stamp(&node.spec.driver.name);
            if ctx.pool.get(&key).is_some_and(|c| c.trust_stamp != stamp) {
                ctx.pool.remove_node(&namespace, &name);
            }
            let failures = node.status.as_ref().and_then(|s| s.retries).and_then(|n| u32::try_from(n).ok());
            match after_failure(failures.unwrap_or(0), ctx.settings().csi_addons_node_retry_delay) {
                AfterFailure::Retry { attempt, delay } => {
                    let why = crate::core::run::with_causes(&why);
                    let message = format!("Connection failed: {why}. Retrying attempt {attempt}/{MAX_RETRIES}.");
                    tracing::info!(node = %format!("{namespace}/{name}"), %message);
                    ctx.state.retry.set(&uid, attempt, now_seconds());
                    publish_connections(&ctx);
                    let status =
                        NodeStatus { state: RETRYING, message: &message, retries: Some(attempt), capabilities: None };
                    write_state(&ctx, &node, status, None).await?;
                    Ok(Action::requeue(delay))
                }
                AfterFailure::Delete => {
                    let message = format!(
                        "Connection failed {} times ({}); deleting the CSIAddonsNode so the sidecar registers again",
                        MAX_RETRIES + 1,
                        crate::core::run::with_causes(&why)
                    );
                    ctx.event(node.as_ref(), true, "ConnectionFailed", message).await;
                    ctx.pool.remove_node(&namespace, &name);
                    ctx.state.retry.forget(&uid);
                    ctx.state.checks.forget(&namespace, &name);
                    let api = Api::<CSIAddonsNode>::namespaced(ctx.client.clone(), &namespace);
                    match api.delete(&name, &Default::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(Error::Api(e)),
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
async fn connect(ctx: &Core, node: &CSIAddonsNode, target: &Target, key: &str) -> Result<Connection, ConnectError> {
    let address = resolve(&ctx.client, target).await?;
    // Read before dialling: a trust change during the dial makes the next pass dial again.
    let trust_stamp = ctx.security.trust().stamp(&node.spec.driver.name);
    let pooled = ctx.pool.get(key).filter(|c| c.endpoint == address && c.trust_stamp == trust_stamp);
    let dial = |address: &str| {
        let address = address.to_owned();
        let driver = node.spec.driver.name.clone();
        async move {
            match ctx.security.connect(&address, &driver).await {
                Ok(channel) => {
                    let security = ctx.security.clone();
                    let redial = move || security.connect_lazy(&address, &driver);
                    Ok(IdleChannel::new(channel, redial))
                }
                Err(source) => Err(ConnectError::Dial { address, source }),
            }
        }
    };
    let channel = match &pooled {
        Some(connection) => connection.channel.clone(),
        None => dial(&address).await?,
    };
    let (capabilities, channel) = match capabilities(ctx, channel.clone()).await {
        Ok(capabilities) => (capabilities, channel),
        Err(_) if pooled.is_some() => {
            // The pooled channel may be stale (the sidecar restarted at the same address): dial once.
            let fresh = dial(&address).await?;
            (capabilities(ctx, fresh.clone()).await?, fresh)
        }
        Err(e) => return Err(e),
    };
    Ok(connection(node, target, address, capabilities, channel, trust_stamp))
}

fn connection(
    node: &CSIAddonsNode,
    target: &Target,
    address: String,
    capabilities: Vec<String>,
    channel: IdleChannel,
    trust_stamp: u64,
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
        trust_stamp,
    }
}

async fn capabilities(ctx: &Core, channel: IdleChannel) -> Result<Vec<String>, ConnectError> {
    let request = with_timeout(GetCapabilitiesRequest {}, CAPABILITIES_TIMEOUT);
    let mut client = IdentityClient::new(channel);
    let answer = ctx.metrics.timed_rpc("Identity/GetCapabilities", client.get_capabilities(request)).await;
    let answer = answer.map_err(|s| ConnectError::Capabilities { code: s.code(), message: s.message().to_owned() })?;
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

/// Writes the status; `fence_clients` None keeps the previous list. A status that already says
/// all of it is not written again (the hourly check of a healthy node costs no write).
async fn write_state(
    ctx: &Core,
    node: &CSIAddonsNode,
    next: NodeStatus<'_>,
    fence_clients: Option<Vec<NetworkFenceClientStatus>>,
) -> Result<(), kube::Error> {
    let previous = node.status.clone().unwrap_or_default();
    let capabilities = next.capabilities.unwrap_or_else(|| previous.capabilities.clone());
    let clients = fence_clients.unwrap_or_else(|| previous.network_fence_client_status.clone());
    let retries = next.retries.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
    let unchanged = previous.state.as_deref() == Some(next.state)
        && previous.message.as_deref() == Some(next.message)
        && previous.retries == retries
        && previous.capabilities == capabilities
        && previous.network_fence_client_status == clients;
    if unchanged {
        return Ok(());
    }
    let mut status = json!({"state": next.state, "message": next.message, "capabilities": capabilities});
    if let Some(retries) = retries {
        status["retries"] = json!(retries);
    }
    // An empty list is written too, so a class taken out of the annotation leaves the status.
    status["networkFenceClientStatus"] = serde_json::to_value(&clients).unwrap_or(serde_json::Value::Null);
    ctx.apply_status(node, status).await
}

/// `csi_addons_sidecar_connections{state}`: connected (pooled), retrying (a retry is due),
/// failed (a spec that cannot be used).
fn publish_connections(ctx: &NodeContext) {
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let gauge = &ctx.metrics.sidecar_connections;
    gauge.with_label_values(&["connected"]).set(count(ctx.pool.len()));
    gauge.with_label_values(&["retrying"]).set(count(ctx.state.retry.len()));
    gauge.with_label_values(&["failed"]).set(count(ctx.state.roster.failed_count()));
}
