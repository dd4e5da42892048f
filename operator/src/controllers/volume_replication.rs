//! VolumeReplication of a PVC: fetch (class, PVC, PV, leader sidecar) → validate (class
//! parameters, source, ownership) → decide (`replication::plan`) → act (Enable/Promote, Demote,
//! Resync; then replication and destination info) → status, conditions and events. Unlike
//! upstream: a PVC of a VolumeGroupReplication is refused whichever annotation came first
//! (defect 22); a driver without GetReplicationDestinationInfo is "not supported", not a retry
//! loop; terminating PVCs are never replicated; events on every transition and failure.
use std::sync::Arc;
use std::time::Duration;

use api::proto::internal::replication_client::ReplicationClient;
use api::proto::internal::{self as pb, replication_source as wire};
use api::replication::{ObservedReplicationState, ReplicationState, VolumeReplication, VolumeReplicationClass};
use futures::Future;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::replication_source::{self, Source};
use crate::context::{Context, ReconcileError, condition, set_condition};
use crate::pool::Connection;
use crate::replication::{self as rep, Call, ClassParameters, DESTINATION_INFO, VOLUME_REPLICATION, VR_FINALIZER};
use crate::sidecar_client::with_timeout;

const NAME: &str = "volumereplication";
const CALL_TIMEOUT: Duration = Duration::from_secs(180);
/// Upstream's waits: a fresh secondary, and a resync that is not ready yet.
const SECONDARY_RECHECK: Duration = Duration::from_secs(15);
const RESYNC_RECHECK: Duration = Duration::from_secs(30);

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    // Passes come from spec changes and deletion, and from the requeues that poll a primary's
    // info or a resync.
    let (store, ready, changes) = super::spec_watch(ctx.watched::<VolumeReplication>(), super::generation_or_deletion);
    ctx.caches.follow(NAME, ready);
    super::run_controller(Controller::for_stream(changes, store), ctx, NAME, stop, reconcile).await;
}

/// Everything a call needs.
struct Volume {
    source: Source,
    handle: String,
    class: ClassParameters,
    info_interval: Duration,
    leader: Arc<Connection>,
}

/// A problem that ends the pass in the status: its reason and message; retried after the delay
/// (None: only a change of the spec helps).
struct Problem {
    reason: &'static str,
    message: String,
    retry: Option<Duration>,
}

impl Problem {
    fn retry(reason: &'static str, message: String) -> Self {
        Problem { reason, message, retry: Some(Duration::from_secs(30)) }
    }
    fn permanent(reason: &'static str, message: String) -> Self {
        Problem { reason, message, retry: None }
    }
}

async fn reconcile(vr: Arc<VolumeReplication>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let deleting = vr.metadata.deletion_timestamp.is_some();
    if deleting && !vr.finalizers().iter().any(|f| f == VR_FINALIZER) {
        return Ok(Action::await_change());
    }
    let volume = match fetch(&ctx, &vr).await {
        Ok(volume) => volume,
        Err(problem) if deleting => {
            // Nothing left to disable through (the PVC or the class is gone): let it go.
            tracing::info!(vr = %vr.name_any(), why = %problem.message, "deleting without DisableVolumeReplication");
            release(&ctx, &vr, None).await?;
            return Ok(Action::await_change());
        }
        Err(problem) => return fail(&ctx, &vr, problem).await,
    };
    if deleting {
        let request = disable_request(&vr, &volume);
        let answer =
            ReplicationClient::new(volume.leader.channel.clone()).disable_volume_replication(timed(request)).await;
        match answer {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => {
                let message = format!("DisableVolumeReplication: {:?}: {}", s.code(), s.message());
                return fail(&ctx, &vr, Problem::retry("FailedToDisable", message)).await;
            }
        }
        release(&ctx, &vr, Some(&volume.source)).await?;
        return Ok(Action::await_change());
    }
    super::set_finalizer(&ctx, vr.as_ref(), VR_FINALIZER, true).await?;
    replication_source::claim(&ctx, &vr, &volume.source).await?;
    act(&ctx, &vr, &volume).await
}

/// Class, PVC, PV and leader; each missing piece is a Problem.
async fn fetch(ctx: &Context, vr: &VolumeReplication) -> Result<Volume, Problem> {
    let class_name = &vr.spec.volume_replication_class;
    let class = Api::<VolumeReplicationClass>::all(ctx.client.clone())
        .get_opt(class_name)
        .await
        .map_err(|e| Problem::retry("Error", format!("reading VolumeReplicationClass {class_name}: {e}")))?
        .ok_or_else(|| Problem::retry("Error", format!("VolumeReplicationClass {class_name} not found")))?;
    let parameters = rep::class_parameters(class.spec.parameters.as_ref())
        .map_err(|why| Problem::permanent("Error", format!("VolumeReplicationClass {class_name}: {why}")))?;
    let driver = &class.spec.provisioner;
    let (source, handle) = replication_source::fetch(ctx, vr, driver).await.map_err(|p| Problem {
        reason: "Error",
        message: p.message,
        retry: p.transient.then_some(Duration::from_secs(30)),
    })?;
    let leader = ctx.pool.leader(&ctx.client, driver).await.map_err(|e| Problem::retry("Error", e.to_string()))?;
    if !leader.offers(VOLUME_REPLICATION) {
        let message =
            format!("the leader sidecar {} of driver {driver} does not offer {VOLUME_REPLICATION}", leader.key());
        return Err(Problem::retry("Error", message));
    }
    Ok(Volume {
        source,
        handle,
        info_interval: rep::info_interval(class.spec.parameters.as_ref()),
        class: parameters,
        leader,
    })
}

/// Undoes the claim on the source and drops the VolumeReplication's finalizer.
async fn release(ctx: &Context, vr: &VolumeReplication, source: Option<&Source>) -> Result<(), ReconcileError> {
    replication_source::release(ctx, vr, source).await?;
    super::forget_failures(ctx, vr);
    super::set_finalizer(ctx, vr, VR_FINALIZER, false).await?;
    Ok(())
}

fn timed<T>(message: T) -> tonic::Request<T> {
    with_timeout(message, CALL_TIMEOUT)
}

fn source(volume: &Volume) -> Option<pb::ReplicationSource> {
    let source = if volume.source.is_group() {
        wire::Type::VolumeGroup(wire::VolumeGroupSource { volume_group_id: volume.handle.clone() })
    } else {
        wire::Type::Volume(wire::VolumeSource { volume_id: volume.handle.clone() })
    };
    Some(pb::ReplicationSource { r#type: Some(source) })
}

fn secret(volume: &Volume) -> (String, String) {
    volume.class.secret.clone().unwrap_or_default()
}

fn parameters(volume: &Volume) -> std::collections::HashMap<String, String> {
    volume.class.parameters.clone().into_iter().collect()
}

fn disable_request(vr: &VolumeReplication, volume: &Volume) -> pb::DisableVolumeReplicationRequest {
    let (secret_name, secret_namespace) = secret(volume);
    pb::DisableVolumeReplicationRequest {
        replication_id: vr.spec.replication_handle.clone().unwrap_or_default(),
        parameters: parameters(volume),
        secret_name,
        secret_namespace,
        replication_source: source(volume),
    }
}

/// One call; the answer is the resync's readiness (true for the others).
async fn call(
    ctx: &Context,
    vr: &VolumeReplication,
    volume: &Volume,
    what: Call,
    force: bool,
) -> Result<bool, tonic::Status> {
    let mut client = ReplicationClient::new(volume.leader.channel.clone());
    let replication_id = vr.spec.replication_handle.clone().unwrap_or_default();
    let (secret_name, secret_namespace) = secret(volume);
    // The four requests share every field but `force`.
    macro_rules! request {
        ($kind:ident { $($extra:tt)* }) => {
            timed(pb::$kind {
                replication_id: replication_id.clone(),
                parameters: parameters(volume),
                secret_name: secret_name.clone(),
                secret_namespace: secret_namespace.clone(),
                replication_source: source(volume),
                $($extra)*
            })
        };
    }
    let method = match what {
        Call::Enable => "Replication/EnableVolumeReplication",
        Call::Promote => "Replication/PromoteVolume",
        Call::Demote => "Replication/DemoteVolume",
        Call::Resync { .. } => "Replication/ResyncVolume",
    };
    let ask = async {
        match what {
            Call::Enable => {
                client.enable_volume_replication(request!(EnableVolumeReplicationRequest {})).await.map(|_| true)
            }
            Call::Promote => client.promote_volume(request!(PromoteVolumeRequest { force })).await.map(|_| true),
            Call::Demote => client.demote_volume(request!(DemoteVolumeRequest { force })).await.map(|_| true),
            Call::Resync { force } => {
                client.resync_volume(request!(ResyncVolumeRequest { force })).await.map(|r| r.into_inner().ready)
            }
        }
    };
    ctx.metrics.timed_rpc(method, ask).await
}

/// Runs the plan and writes the outcome.
async fn act(ctx: &Context, vr: &VolumeReplication, volume: &Volume) -> Result<Action, ReconcileError> {
    let generation = vr.metadata.generation;
    let subject = rep::subject(&vr.spec.data_source.kind);
    let previous = vr.status.clone().unwrap_or_default();
    let desired = vr.spec.replication_state;
    let started = k8s_openapi::jiff::Timestamp::now();
    let mut conditions = previous.conditions.clone();
    let mut ready = true;
    for step in rep::plan(desired, previous.state, vr.spec.auto_resync) {
        let mut answer = call(ctx, vr, volume, step, false).await;
        if step == Call::Promote && answer.as_ref().is_err_and(|s| s.code() == tonic::Code::FailedPrecondition) {
            // As upstream: a promotion the driver refuses is tried once more with force.
            answer = call(ctx, vr, volume, step, true).await;
        }
        match answer {
            Ok(r) => ready = r,
            Err(status) => {
                let why = format!("{:?}: {}", status.code(), status.message());
                conditions = if step == Call::Enable && status.code() == tonic::Code::FailedPrecondition {
                    rep::prerequisite_not_met(&conditions, subject, generation, &why)
                } else {
                    rep::failed(&conditions, subject, generation, step, &why)
                };
                record(ctx, desired, "Failed", started);
                let state = previous.state.unwrap_or(ObservedReplicationState::Unknown);
                let body =
                    json!({"state": state, "message": why, "conditions": conditions, "observedGeneration": generation});
                ctx.apply_status(vr, body).await?;
                let reason =
                    conditions.iter().rev().find(|c| c.status == "False").map_or("Error", |c| c.reason.as_str());
                ctx.event(vr, true, reason, format!("{subject} {}: {why}", vr.name_any())).await;
                let delay =
                    if desired == ReplicationState::Primary { super::retry_delay(ctx, vr) } else { SECONDARY_RECHECK };
                return Ok(Action::requeue(delay));
            }
        }
    }
    super::forget_failures(ctx, vr);
    let first_secondary =
        desired == ReplicationState::Secondary && previous.state != Some(ObservedReplicationState::Secondary);
    conditions = match desired {
        ReplicationState::Primary => rep::promoted(&conditions, subject, generation),
        ReplicationState::Secondary if first_secondary => rep::demoted(&conditions, subject, generation),
        ReplicationState::Secondary | ReplicationState::Resync => {
            rep::resynced(&conditions, subject, generation, ready)
        }
    };
    let (state, mut message) = rep::reported(desired);
    let mut body = json!({
        "state": state,
        "observedGeneration": generation,
        "lastStartTime": Time(started),
        "lastCompletionTime": Time(k8s_openapi::jiff::Timestamp::now()),
    });
    let next = if desired == ReplicationState::Primary {
        conditions = info(ctx, vr, volume, conditions, &mut body).await;
        conditions = destination(ctx, vr, volume, conditions, &mut body).await;
        Action::requeue(volume.info_interval)
    } else {
        body["lastSyncTime"] = serde_json::Value::Null;
        conditions.retain(|c| c.type_ != "Replicating");
        if first_secondary {
            message = "volume is marked secondary and is degraded";
            Action::requeue(SECONDARY_RECHECK)
        } else if !ready {
            message = "volume is degraded";
            Action::requeue(RESYNC_RECHECK)
        } else {
            Action::await_change()
        }
    };
    body["message"] = json!(message);
    body["conditions"] = json!(conditions);
    if previous.state != Some(state) || previous.observed_generation != generation {
        record(ctx, desired, "Succeeded", started);
        let reason = match desired {
            ReplicationState::Primary => "Promoted",
            ReplicationState::Secondary => "Demoted",
            ReplicationState::Resync => "ResyncTriggered",
        };
        ctx.event(vr, false, reason, format!("{subject} {}: {message}", vr.name_any())).await;
    }
    ctx.apply_status(vr, body).await?;
    Ok(next)
}

/// `GetVolumeReplicationInfo` into lastSync* and the Replicating condition.
async fn info(
    ctx: &Context,
    vr: &VolumeReplication,
    volume: &Volume,
    conditions: Vec<Condition>,
    body: &mut serde_json::Value,
) -> Vec<Condition> {
    let subject = rep::subject(&vr.spec.data_source.kind);
    let (secret_name, secret_namespace) = secret(volume);
    let request = pb::GetVolumeReplicationInfoRequest {
        replication_id: vr.spec.replication_handle.clone().unwrap_or_default(),
        secret_name,
        secret_namespace,
        replication_source: source(volume),
    };
    let mut client = ReplicationClient::new(volume.leader.channel.clone());
    let ask = client.get_volume_replication_info(timed(request));
    let answer = ctx.metrics.timed_rpc("Replication/GetVolumeReplicationInfo", ask).await;
    let generation = vr.metadata.generation;
    match answer {
        Ok(info) => {
            let info = info.into_inner();
            if let Some(t) = info.last_sync_time.as_ref()
                && let Ok(time) = k8s_openapi::jiff::Timestamp::new(t.seconds, t.nanos)
            {
                body["lastSyncTime"] = json!(Time(time));
            }
            if let Some(d) = info.last_sync_duration.as_ref() {
                let duration = Duration::new(d.seconds.unsigned_abs(), d.nanos.unsigned_abs());
                body["lastSyncDuration"] = json!(rep::go_duration_string(duration));
            }
            if info.last_sync_bytes != 0 {
                body["lastSyncBytes"] = json!(info.last_sync_bytes);
            }
            let status = info.status().as_str_name();
            set_condition(&conditions, rep::replicating(subject, status, &info.status_message, generation))
        }
        // Nothing to report (yet), or the driver does not say.
        Err(s) if matches!(s.code(), tonic::Code::NotFound | tonic::Code::Unimplemented) => conditions,
        Err(s) => {
            let detail = format!("{:?}: {}", s.code(), s.message());
            set_condition(&conditions, rep::replicating(subject, "UNKNOWN", &detail, generation))
        }
    }
}

/// `GetReplicationDestinationInfo` into destinationVolumeID, where the leader offers it.
async fn destination(
    ctx: &Context,
    vr: &VolumeReplication,
    volume: &Volume,
    conditions: Vec<Condition>,
    body: &mut serde_json::Value,
) -> Vec<Condition> {
    const TYPE: &str = "DestinationInfoAvailable";
    let generation = vr.metadata.generation;
    // [main]: a group's destination is the content's business.
    if !volume.leader.offers(DESTINATION_INFO) || volume.source.is_group() {
        return conditions;
    }
    // Known not to be supported for this spec: not asked again at every info poll.
    let unsupported =
        |c: &&Condition| c.type_ == TYPE && c.reason == "NotSupported" && c.observed_generation == generation;
    if conditions.iter().any(|c| unsupported(&c)) {
        return conditions;
    }
    let (secret_name, secret_namespace) = secret(volume);
    let request =
        pb::GetReplicationDestinationInfoRequest { secret_name, secret_namespace, replication_source: source(volume) };
    let mut client = ReplicationClient::new(volume.leader.channel.clone());
    let ask = client.get_replication_destination_info(timed(request));
    let answer = ctx.metrics.timed_rpc("Replication/GetReplicationDestinationInfo", ask).await;
    let next = match answer {
        Ok(answer) => match answer.into_inner().replication_destination.and_then(|d| d.r#type) {
            Some(pb::replication_destination::Type::Volume(v)) => {
                body["destinationVolumeID"] = json!(v.volume_id);
                condition(TYPE, true, "DestinationInfoUpdated", "destination info is available", generation)
            }
            _ => condition(TYPE, false, "DestinationInfoPending", "the driver has no destination info yet", generation),
        },
        // Upstream's v0.14.0 sidecar answers so: the feature is missing, nothing to retry.
        Err(s) if s.code() == tonic::Code::Unimplemented => condition(
            TYPE,
            false,
            "NotSupported",
            "the sidecar does not support GetReplicationDestinationInfo",
            generation,
        ),
        Err(s) => {
            let message = format!("GetReplicationDestinationInfo: {:?}: {}", s.code(), s.message());
            condition(TYPE, false, "FailedToGetDestinationInfo", &message, generation)
        }
    };
    set_condition(&conditions, next)
}

fn record(ctx: &Context, desired: ReplicationState, result: &str, started: k8s_openapi::jiff::Timestamp) {
    let kind = match desired {
        ReplicationState::Primary => "VolumeReplication/Promote",
        ReplicationState::Secondary => "VolumeReplication/Demote",
        ReplicationState::Resync => "VolumeReplication/Resync",
    };
    ctx.metrics.operations.with_label_values(&[kind, result]).inc();
    let seconds =
        (k8s_openapi::jiff::Timestamp::now().as_millisecond() - started.as_millisecond()).max(0) as f64 / 1000.0;
    ctx.metrics.operation_duration.with_label_values(&[kind]).observe(seconds);
}

/// A Problem into the status (message, Unknown state kept) and a Warning event when new.
async fn fail(ctx: &Context, vr: &VolumeReplication, problem: Problem) -> Result<Action, ReconcileError> {
    let previous = vr.status.clone().unwrap_or_default();
    if previous.message.as_deref() != Some(problem.message.as_str()) {
        let state = previous.state.unwrap_or(ObservedReplicationState::Unknown);
        let body = json!({"state": state, "message": problem.message, "observedGeneration": vr.metadata.generation});
        ctx.apply_status(vr, body).await?;
        ctx.event(vr, true, problem.reason, problem.message.clone()).await;
    }
    Ok(problem.retry.map_or_else(Action::await_change, |_| Action::requeue(super::retry_delay(ctx, vr))))
}
