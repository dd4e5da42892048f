//! NetworkFence: fence or unfence CIDRs through the leader sidecar of the driver. fetch (class,
//! leader) → validate (`decide::validate`) → decide (`decide::up_to_date`) → act (Fence or
//! UnFence) → status and events. Unlike upstream:
//! - deleting a fence that may be applied unfences first (upstream leaves the CIDRs fenced) and
//!   says what it waits for; [differs: fence-unfence-on-delete]
//! - the deprecated inline fields raise a Warning event; [differs: fence-deprecated-warning]
//! - passes come from spec (generation) and annotation changes, not from our own status writes;
//! - a failed call is retried with the standard backoff, 5 s doubling to at most 5 min (upstream's,
//!   controller-runtime's, from 5 ms to about 17 minutes). [differs: fence-retry]
pub mod decide;

use std::sync::Arc;
use std::time::{Duration, Instant};

use api::csiaddons::{FenceState, NetworkFence, NetworkFenceClass, OperationResult};
use api::proto::internal::NetworkFenceRequest;
use api::proto::internal::network_fence_client::NetworkFenceClient;
use futures::Future;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Api, ResourceExt};
use serde_json::json;

use self::decide::{
    APPLIED_CONDITION, DELETE_WITHOUT_UNFENCE, DELETION_CONDITION, FENCE_SUCCEEDED, FINALIZER, FenceRequest,
    NETWORK_FENCE, UNFENCE_SUCCEEDED,
};
use crate::controllers::network_fence_class::decide::{ClassParameterError, ClassParameters, class_parameters};
use crate::core::Core;
use crate::core::action::Action;
use crate::core::backoff::Retrying;
use crate::core::status::{condition, set_condition};
use crate::sidecars::client::with_timeout;
use crate::sidecars::pool::{Connection, LookupError};

const NAME: &str = "networkfence";
/// Upstream's timeout of a fence or unfence call.
const CALL_TIMEOUT: Duration = Duration::from_secs(180);
/// A fence whose driver has no sidecar in the watched namespace is looked at again this often.
const OUT_OF_SCOPE_RECHECK: Duration = Duration::from_secs(30);

pub async fn run(core: Arc<Core>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    // Our own status writes change neither the generation nor the annotations: no pass for them.
    let fences = Api::<NetworkFence>::all(core.client.clone());
    let (store, ready, changes) = crate::core::watch::spec_watch(fences, spec_or_annotations);
    core.caches.follow(NAME, ready);
    let ctx = Retrying::retrying(core, &store);
    let controller = crate::core::queue::Triggers::new(changes).controller(store);
    crate::core::run::run_controller(controller, ctx, NAME, stop, reconcile).await;
}

fn spec_or_annotations(fence: &NetworkFence) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    fence.metadata.generation.hash(&mut hasher);
    fence.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    fence.annotations().get(DELETE_WITHOUT_UNFENCE).hash(&mut hasher);
    Some(hasher.finish())
}

/// Where a fence goes: the driver, and the class's parameters when it names one.
struct Target {
    driver: String,
    class: Option<ClassParameters>,
}

/// Why a fence cannot be carried out now: its status message, and its Warning event's reason.
#[derive(Debug, thiserror::Error)]
enum Blocked {
    #[error("reading NetworkFenceClass {class}: {source}")]
    ClassUnreadable {
        class: String,
        #[source]
        source: kube::Error,
    },
    #[error("NetworkFenceClass {0} not found")]
    ClassNotFound(String),
    #[error("NetworkFenceClass {class}: {source}")]
    InvalidClass {
        class: String,
        #[source]
        source: ClassParameterError,
    },
    #[error(transparent)]
    NoLeaderSidecar(#[from] LookupError),
    #[error("the leader sidecar {sidecar} of driver {driver} does not offer {NETWORK_FENCE}")]
    NotSupported { sidecar: String, driver: String },
    #[error("{method} through {sidecar}: {code:?}: {message}")]
    CallFailed { method: &'static str, sidecar: String, code: tonic::Code, message: String },
    /// With `--watch-namespace`: another manager's driver.
    #[error("driver {0} has no sidecar in the watched namespace")]
    OutOfScope(String),
}

impl Blocked {
    fn reason(&self, unfencing: bool) -> &'static str {
        match self {
            Blocked::ClassUnreadable { .. } => "ClassUnreadable",
            Blocked::ClassNotFound(_) => "ClassNotFound",
            Blocked::InvalidClass { .. } => "InvalidClass",
            Blocked::NoLeaderSidecar(_) => "NoLeaderSidecar",
            Blocked::NotSupported { .. } => "NotSupported",
            Blocked::CallFailed { .. } if unfencing => "UnfenceFailed",
            Blocked::CallFailed { .. } => "FenceFailed",
            Blocked::OutOfScope(_) => "OutOfScope",
        }
    }
}

/// The wait before `fence` is tried again, one failure more.
pub(crate) async fn reconcile(fence: Arc<NetworkFence>, ctx: Arc<Retrying>) -> Result<Action, kube::Error> {
    if fence.metadata.deletion_timestamp.is_some() {
        return delete(&ctx, &fence).await;
    }
    if let Err(invalid) = decide::validate(&fence.spec) {
        return fail(&ctx, &fence, "InvalidSpec", invalid.to_string(), None).await;
    }
    if let Err(refused) = decide::check_reach(&fence.spec, fence.annotations()) {
        return fail(&ctx, &fence, "FencesEverything", refused.to_string(), None).await;
    }
    if decide::up_to_date(&fence) {
        return Ok(Action::await_change());
    }
    let target = match target(&ctx, &fence).await {
        Ok(target) => target,
        Err(blocked) => {
            let retry = Some(ctx.retry(fence.as_ref()));
            return fail(&ctx, &fence, blocked.reason(false), blocked.to_string(), retry).await;
        }
    };
    if out_of_scope(&ctx, &target.driver) {
        return Ok(Action::requeue(OUT_OF_SCOPE_RECHECK));
    }
    let deprecated = decide::deprecated_fields(&fence.spec);
    if fence.spec.network_fence_class_name.is_none() && !deprecated.is_empty() {
        let note = format!("{} deprecated: name a NetworkFenceClass instead", deprecated.join(", "));
        ctx.event(fence.as_ref(), true, "DeprecatedFields", note).await;
    }
    let leader = match leader(&ctx, &target.driver).await {
        Ok(leader) => leader,
        Err(blocked) => {
            let retry = Some(ctx.retry(fence.as_ref()));
            return fail(&ctx, &fence, blocked.reason(false), blocked.to_string(), retry).await;
        }
    };
    crate::core::patch::set_finalizer(&ctx, fence.as_ref(), FINALIZER, true).await?;
    let request = decide::request(&fence.spec, target.class.as_ref());
    let state = fence.spec.fence_state;
    let answer = call(&ctx, &leader, state, request).await;
    let generation = fence.metadata.generation;
    match answer {
        Ok(()) => {
            ctx.forget(fence.as_ref());
            let (applied, reason, message) = match state {
                FenceState::Fenced => (true, "Fenced", FENCE_SUCCEEDED),
                FenceState::Unfenced => (false, "Unfenced", UNFENCE_SUCCEEDED),
            };
            let conditions = with_condition(&fence, condition(APPLIED_CONDITION, applied, reason, message, generation));
            write_status(&ctx, &fence, OperationResult::Succeeded, message, conditions).await?;
            let cidrs = fence.spec.cidrs.join(", ");
            ctx.event(fence.as_ref(), false, reason, format!("{message}: {cidrs} through {}", leader.key())).await;
            Ok(Action::await_change())
        }
        Err(failed) => {
            let reason = failed.reason(state == FenceState::Unfenced);
            let message = failed.to_string();
            let delay = ctx.retry(fence.as_ref());
            // A failed call may have done part of its work: the state at the driver is unknown.
            let mut unknown = condition(APPLIED_CONDITION, false, reason, &message, generation);
            unknown.status = "Unknown".into();
            let conditions = with_condition(&fence, unknown);
            write_status(&ctx, &fence, OperationResult::Failed, &message, conditions).await?;
            ctx.event(fence.as_ref(), true, reason, message).await;
            Ok(Action::requeue(delay))
        }
    }
}

/// Deletion: unfence first where the fence may be applied, then drop the finalizer.
async fn delete(ctx: &Retrying, fence: &NetworkFence) -> Result<Action, kube::Error> {
    if !fence.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    if fence.annotations().get(DELETE_WITHOUT_UNFENCE).is_some_and(|v| v == "true") {
        let note = format!(
            "finalizer removed without unfencing ({DELETE_WITHOUT_UNFENCE}=true): {} may still be fenced at the driver",
            fence.spec.cidrs.join(", ")
        );
        ctx.event(fence, true, "DeletedWithoutUnfence", note).await;
        ctx.forget(fence);
        crate::core::patch::set_finalizer(ctx, fence, FINALIZER, false).await?;
        return Ok(Action::await_change());
    }
    if !decide::maybe_applied(fence) {
        ctx.forget(fence);
        crate::core::patch::set_finalizer(ctx, fence, FINALIZER, false).await?;
        return Ok(Action::await_change());
    }
    let blocked = async {
        let target = target(ctx, fence).await?;
        if out_of_scope(ctx, &target.driver) {
            return Err(Blocked::OutOfScope(target.driver));
        }
        let leader = leader(ctx, &target.driver).await?;
        let request = decide::request(&fence.spec, target.class.as_ref());
        call(ctx, &leader, FenceState::Unfenced, request).await?;
        Ok::<_, Blocked>(leader)
    }
    .await;
    match blocked {
        Ok(leader) => {
            let note = format!(
                "{UNFENCE_SUCCEEDED} before deletion: {} through {}",
                fence.spec.cidrs.join(", "),
                leader.key()
            );
            ctx.event(fence, false, "Unfenced", note).await;
            ctx.forget(fence);
            crate::core::patch::set_finalizer(ctx, fence, FINALIZER, false).await?;
            Ok(Action::await_change())
        }
        Err(Blocked::OutOfScope(_)) => Ok(Action::requeue(OUT_OF_SCOPE_RECHECK)),
        Err(why) => {
            let reason = why.reason(true);
            let message = format!(
                "waiting to unfence before deletion: {why} (to delete without unfencing, annotate it {DELETE_WITHOUT_UNFENCE}=true)"
            );
            let delay = ctx.retry(fence);
            let conditions =
                with_condition(fence, condition(DELETION_CONDITION, true, reason, &message, fence.metadata.generation));
            let status = fence.status.as_ref();
            let result = status.and_then(|s| s.result).unwrap_or(OperationResult::Failed);
            write_status(ctx, fence, result, status.and_then(|s| s.message.as_deref()).unwrap_or(""), conditions)
                .await?;
            ctx.event(fence, true, reason, message).await;
            Ok(Action::requeue(delay))
        }
    }
}

/// The driver, from the class or the deprecated inline field.
async fn target(ctx: &Core, fence: &NetworkFence) -> Result<Target, Blocked> {
    let Some(class_name) = fence.spec.network_fence_class_name.as_deref().filter(|c| !c.is_empty()) else {
        let driver = fence.spec.driver.clone().unwrap_or_default();
        return Ok(Target { driver, class: None });
    };
    let class = Api::<NetworkFenceClass>::all(ctx.client.clone())
        .get_opt(class_name)
        .await
        .map_err(|source| Blocked::ClassUnreadable { class: class_name.to_owned(), source })?
        .ok_or_else(|| Blocked::ClassNotFound(class_name.to_owned()))?;
    let parameters = class_parameters(class.spec.parameters.as_ref())
        .map_err(|source| Blocked::InvalidClass { class: class_name.to_owned(), source })?;
    Ok(Target { driver: class.spec.provisioner, class: Some(parameters) })
}

/// The leader sidecar of `driver`, which must offer fencing.
async fn leader(ctx: &Core, driver: &str) -> Result<Arc<Connection>, Blocked> {
    let leader = ctx.pool.leader(&ctx.client, driver).await?;
    if !leader.offers(NETWORK_FENCE) {
        return Err(Blocked::NotSupported { sidecar: leader.key(), driver: driver.to_owned() });
    }
    Ok(leader)
}

/// With `--watch-namespace`, a cluster-scoped fence is this manager's only when its driver has a
/// sidecar in that namespace (another manager may serve the driver).
fn out_of_scope(ctx: &Core, driver: &str) -> bool {
    ctx.watch_namespace.as_ref().is_some_and(|namespace| !ctx.pool.namespaces_of(driver).contains(namespace))
}

/// One fence or unfence: the RPC's latency, and the operation's count and duration, recorded.
async fn call(ctx: &Core, leader: &Connection, state: FenceState, request: FenceRequest) -> Result<(), Blocked> {
    let message = NetworkFenceRequest {
        parameters: request.parameters.into_iter().collect(),
        secret_name: request.secret_name,
        secret_namespace: request.secret_namespace,
        cidrs: request.cidrs,
    };
    let request = with_timeout(message, CALL_TIMEOUT);
    let mut client = NetworkFenceClient::new(leader.channel.clone());
    let started = Instant::now();
    let (method, answer) = match state {
        FenceState::Fenced => {
            let method = "NetworkFence/FenceClusterNetwork";
            (method, ctx.metrics.timed_rpc(method, client.fence_cluster_network(request)).await)
        }
        FenceState::Unfenced => {
            let method = "NetworkFence/UnFenceClusterNetwork";
            (method, ctx.metrics.timed_rpc(method, client.un_fence_cluster_network(request)).await)
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let kind = match state {
        FenceState::Fenced => "NetworkFence/Fence",
        FenceState::Unfenced => "NetworkFence/Unfence",
    };
    ctx.metrics.operation_duration.with_label_values(&[kind]).observe(seconds);
    let result = if answer.is_ok() { "Succeeded" } else { "Failed" };
    ctx.metrics.operation_ended(kind, result);
    answer.map(|_| ()).map_err(|s| Blocked::CallFailed {
        method,
        sidecar: leader.key(),
        code: s.code(),
        message: s.message().to_owned(),
    })
}

/// A Failed status with `message` and a Warning event; retried after `retry` (None: only a spec
/// change helps).
async fn fail(
    ctx: &Core,
    fence: &NetworkFence,
    reason: &str,
    message: String,
    retry: Option<Duration>,
) -> Result<Action, kube::Error> {
    let status = fence.status.as_ref();
    if status.and_then(|s| s.message.as_deref()) != Some(message.as_str()) {
        let conditions = status.map(|s| s.conditions.clone()).unwrap_or_default();
        write_status(ctx, fence, OperationResult::Failed, &message, conditions).await?;
        ctx.event(fence, true, reason, message).await;
    }
    Ok(retry.map_or_else(Action::await_change, Action::requeue))
}

fn with_condition(fence: &NetworkFence, next: Condition) -> Vec<Condition> {
    let conditions = fence.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    set_condition(conditions, next)
}

async fn write_status(
    ctx: &Core,
    fence: &NetworkFence,
    result: OperationResult,
    message: &str,
    conditions: Vec<Condition>,
) -> Result<(), kube::Error> {
    ctx.apply_status(fence, json!({"result": result, "message": message, "conditions": conditions})).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_follow_the_spec_and_the_force_annotation_only() {
        let mut fence = NetworkFence::new("f", Default::default());
        fence.metadata.generation = Some(1);
        let first = spec_or_annotations(&fence);
        fence.status = Some(Default::default());
        assert_eq!(spec_or_annotations(&fence), first, "a status write is no reason for a pass");
        fence.metadata.annotations = Some([(DELETE_WITHOUT_UNFENCE.to_owned(), "true".to_owned())].into());
        assert_ne!(spec_or_annotations(&fence), first);
    }
}
