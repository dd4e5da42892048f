//! VolumeReplication of a PVC or a group: fetch (class, source, leader sidecar) → validate (class
//! parameters, source, ownership) → decide (`decide::plan`) → act (Enable/Promote, Demote,
//! Resync; then replication and destination info) → status, conditions and events. Unlike
//! upstream: a PVC of a VolumeGroupReplication is refused whichever annotation came first; a
//! driver without GetReplicationDestinationInfo is "not supported", not a retry loop; events on
//! every transition and failure (upstream records none). [differs: replication-events] As upstream,
//! a terminating PVC is not taken on.
pub mod decide;
pub mod source;

use std::sync::Arc;
use std::time::Duration;

use api::proto::internal::replication_client::ReplicationClient;
use api::proto::internal::{self as pb, replication_source as wire};
use api::replication::{ObservedReplicationState, ReplicationState, VolumeReplication, VolumeReplicationClass};
use futures::Future;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use serde_json::json;

use self::decide::Call;
use self::source::{Source, SourceError};
use crate::controllers::replication::{
    self as rep, ClassParameters, DESTINATION_INFO, VOLUME_REPLICATION, VR_FINALIZER,
};
use crate::controllers::replication_class::{self, ClassError};
use crate::core::Core;
use crate::core::action::Action;
use crate::core::backoff::Retrying;
use crate::core::status::set_condition;
use crate::sidecars::client::with_timeout;
use crate::sidecars::pool::Connection;
use crate::sidecars::pool::LookupError;

const NAME: &str = "volumereplication";
const CALL_TIMEOUT: Duration = Duration::from_secs(180);
/// Upstream's waits: a fresh secondary, and a resync that is not ready yet.
const SECONDARY_RECHECK: Duration = Duration::from_secs(15);
const RESYNC_RECHECK: Duration = Duration::from_secs(30);

pub async fn run(core: Arc<Core>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    // Passes come from spec changes and deletion, and from the requeues that poll a primary's
    // info or a resync.
    let watched = core.watched::<VolumeReplication>();
    let (store, ready, changes) = crate::core::watch::spec_watch(watched, crate::core::watch::generation_or_deletion);
    core.caches.follow(NAME, ready);
    let ctx = Retrying::retrying(core, &store);
    let controller = crate::core::queue::Triggers::new(changes).controller(store);
    crate::core::run::run_controller(controller, ctx, NAME, stop, reconcile).await;
}

/// Everything a call needs.
struct Volume {
    source: Source,
    handle: String,
    class: ClassParameters,
    info_interval: Duration,
    leader: Arc<Connection>,
}

/// A problem that ends the pass in the status: its message, what failed (the `Completed`
/// condition's message, upstream's words), and whether a growing wait may help (else only a
/// change of the spec does).
#[derive(Debug, thiserror::Error)]
enum Problem {
    #[error(transparent)]
    Class(#[from] ClassError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    NoLeader(#[from] LookupError),
    #[error("the leader sidecar {sidecar} of driver {driver} does not offer {VOLUME_REPLICATION}")]
    NotOffered { sidecar: String, driver: String },
    /// The driver's own words.
    #[error("{0}")]
    Disable(String),
}

impl Problem {
    fn what(&self, kind: &str) -> &'static str {
        match self {
            Problem::Class(class) if class.permanent() => "failed to validate parameters of volumeReplicationClass",
            Problem::Class(_) => "failed to get volumeReplication class",
            Problem::Source(_) if kind == "PersistentVolumeClaim" => "failed to find PVC",
            Problem::Source(_) if kind == "VolumeGroupReplication" => "failed to get VolumeGroupReplication",
            Problem::Source(_) => "unsupported datasource",
            Problem::NoLeader(_) | Problem::NotOffered { .. } => "failed to get the replication client",
            Problem::Disable(_) => "failed to disable volume replication",
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            Problem::Disable(_) => "FailedToDisable",
            _ => "Error",
        }
    }

    fn retry(&self) -> bool {
        match self {
            Problem::Class(class) => !class.permanent(),
            Problem::Source(source) => source.transient(),
            _ => true,
        }
    }
}

pub(crate) async fn reconcile(vr: Arc<VolumeReplication>, ctx: Arc<Retrying>) -> Result<Action, kube::Error> {
    let deleting = vr.metadata.deletion_timestamp.is_some();
    if deleting && !vr.finalizers().iter().any(|f| f == VR_FINALIZER) {
        return Ok(Action::await_change());
    }
    let volume = match fetch(&ctx, &vr).await {
        Ok(volume) => volume,
        // No sidecar registered yet, as just after the manager or the driver started: the
        // replication is disabled once one is, never skipped.
        Err(problem @ Problem::NoLeader(_)) if deleting => return fail(&ctx, &vr, problem).await,
        Err(problem) if deleting => {
            // Nothing left to disable through (the PVC or the class is gone, or the driver cannot
            // replicate): let it go, and let go of a PVC that is still claimed.
            tracing::info!(vr = %vr.name_any(), why = %problem, "deleting without DisableVolumeReplication");
            let claimed = source::fetch_claimed(&ctx, &vr).await?;
            release(&ctx, &vr, claimed.as_ref()).await?;
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
                return fail(&ctx, &vr, Problem::Disable(s.message().to_owned())).await;
            }
        }
        release(&ctx, &vr, Some(&volume.source)).await?;
        return Ok(Action::await_change());
    }
    crate::core::patch::set_finalizer(&ctx, vr.as_ref(), VR_FINALIZER, true).await?;
    source::claim(&ctx, &vr, &volume.source).await?;
    act(&ctx, &vr, &volume).await
}

/// Class, PVC, PV and leader; each missing piece is a Problem.
async fn fetch(ctx: &Core, vr: &VolumeReplication) -> Result<Volume, Problem> {
    let (class, parameters) =
        replication_class::read::<VolumeReplicationClass>(&ctx.client, &vr.spec.volume_replication_class).await?;
    let driver = &class.spec.provisioner;
    let (source, handle) = source::fetch(ctx, vr, driver).await?;
    let leader = ctx.pool.leader(&ctx.client, driver).await?;
    if !leader.offers(VOLUME_REPLICATION) {
        return Err(Problem::NotOffered { sidecar: leader.key(), driver: driver.clone() });
    }
    Ok(Volume {
        source,
        handle,
        info_interval: decide::info_interval(class.spec.parameters.as_ref()),
        class: parameters,
        leader,
    })
}

/// Undoes the claim on the source and drops the VolumeReplication's finalizer.
async fn release(ctx: &Retrying, vr: &VolumeReplication, source: Option<&Source>) -> Result<(), kube::Error> {
    source::release(ctx, vr, source).await?;
    ctx.forget(vr);
    crate::core::patch::set_finalizer(ctx, vr, VR_FINALIZER, false).await?;
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
    ctx: &Core,
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

/// The status as it is, to change and write back whole: a server-side apply leaves out nothing
/// this manager wrote before unless the pass means to drop it (set to null).
fn status_body(vr: &VolumeReplication) -> serde_json::Value {
    vr.status.as_ref().map_or_else(|| json!({}), |s| json!(s))
}

/// What failed, in upstream's words, for the `Completed` condition.
fn what_failed(step: Call, forced: bool) -> &'static str {
    match step {
        Call::Enable => "failed to enable volume replication",
        Call::Promote if forced => "failed to force promote volume",
        Call::Promote => "failed to promote volume",
        Call::Demote => "failed to demote volume",
        Call::Resync { .. } => "failed to resync volume",
    }
}

/// Runs the plan and writes the outcome.
async fn act(ctx: &Retrying, vr: &VolumeReplication, volume: &Volume) -> Result<Action, kube::Error> {
    let generation = vr.metadata.generation;
    let subject = rep::subject(&vr.spec.data_source.kind);
    let previous = vr.status.clone().unwrap_or_default();
    let desired = vr.spec.replication_state;
    let started = k8s_openapi::jiff::Timestamp::now();
    let mut conditions = previous.conditions.clone();
    let mut body = status_body(vr);
    body["lastStartTime"] = json!(Time(started));
    body["observedGeneration"] = json!(generation);
    let mut ready = true;
    for step in decide::plan(desired, previous.state, vr.spec.auto_resync) {
        let mut answer = call(ctx, vr, volume, step, false).await;
        let mut forced = false;
        if step == Call::Promote && answer.as_ref().is_err_and(|s| s.code() == tonic::Code::FailedPrecondition) {
            // As upstream: a promotion the driver refuses is tried once more with force.
            forced = true;
            answer = call(ctx, vr, volume, step, true).await;
        }
        let status = match answer {
            Ok(r) => {
                ready = r;
                continue;
            }
            Err(status) => status,
        };
        let failure = (what_failed(step, forced), rep::go_error(&status));
        let failure = (failure.0, failure.1.as_str());
        conditions = if step == Call::Enable && status.code() == tonic::Code::FailedPrecondition {
            decide::prerequisite_not_met(&conditions, subject, generation, failure)
        } else {
            decide::failed(&conditions, subject, generation, decide::Attempt::of_call(step), failure)
        };
        record(ctx, desired, "Failed", started);
        body["state"] = json!(previous.state.unwrap_or(ObservedReplicationState::Unknown));
        // As upstream: the driver's own words.
        body["message"] = json!(status.message());
        body["conditions"] = json!(conditions);
        ctx.apply_status(vr, body).await?;
        let reason = conditions.iter().find(|c| c.type_ == "Completed").map_or("Error", |c| c.reason.as_str());
        ctx.event(vr, true, reason, format!("{subject} {}: {}: {}", vr.name_any(), failure.0, failure.1)).await;
        // As upstream: a volume that is secondary already is looked at again soon.
        let delay =
            if previous.state == Some(ObservedReplicationState::Secondary) { SECONDARY_RECHECK } else { ctx.retry(vr) };
        return Ok(Action::requeue(delay));
    }
    ctx.forget(vr);
    let first_secondary =
        desired == ReplicationState::Secondary && previous.state != Some(ObservedReplicationState::Secondary);
    conditions = match desired {
        ReplicationState::Primary => decide::promoted(&conditions, subject, generation),
        ReplicationState::Secondary if first_secondary => decide::demoted(&conditions, subject, generation),
        ReplicationState::Secondary | ReplicationState::Resync => {
            decide::resynced(&conditions, subject, generation, ready)
        }
    };
    let (mut state, mut message) = decide::reported(desired);
    let now = json!(Time(k8s_openapi::jiff::Timestamp::now()));
    let next = if desired == ReplicationState::Primary {
        body["lastCompletionTime"] = now;
        conditions = info(ctx, vr, volume, conditions, &mut body).await;
        conditions = destination(ctx, vr, volume, conditions, &mut body).await;
        Action::requeue(volume.info_interval)
    } else {
        // From the first demotion pass on (upstream's from the next one): a volume just made
        // secondary does not say it replicates. [differs: demote-replicating]
        body["lastSyncTime"] = serde_json::Value::Null;
        conditions.retain(|c| c.type_ != "Replicating");
        if first_secondary {
            body["lastCompletionTime"] = now;
            message = "volume is marked secondary and is degraded";
            Action::requeue(SECONDARY_RECHECK)
        } else if !ready {
            // As upstream: the state stays what it was until the resync is done.
            state = previous.state.unwrap_or(ObservedReplicationState::Unknown);
            message = "volume is degraded";
            Action::requeue(RESYNC_RECHECK)
        } else {
            body["lastCompletionTime"] = now;
            conditions = destination(ctx, vr, volume, conditions, &mut body).await;
            Action::await_change()
        }
    };
    body["state"] = json!(state);
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

/// `GetVolumeReplicationInfo` into lastSync* and the Replicating condition. The last sync's
/// figures are replaced only when the driver reports a last sync, as upstream.
async fn info(
    ctx: &Core,
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
                body["lastSyncDuration"] = serde_json::Value::Null;
                body["lastSyncBytes"] = serde_json::Value::Null;
                if let Some(d) = info.last_sync_duration.as_ref() {
                    let duration = Duration::new(d.seconds.unsigned_abs(), d.nanos.unsigned_abs());
                    body["lastSyncDuration"] = json!(decide::go_duration_string(duration));
                }
                if info.last_sync_bytes != 0 {
                    body["lastSyncBytes"] = json!(info.last_sync_bytes);
                }
            }
            let status = info.status().as_str_name();
            set_condition(&conditions, decide::replicating(subject, status, &info.status_message, generation))
        }
        // Nothing to report (yet), or the driver does not say.
        Err(s) if matches!(s.code(), tonic::Code::NotFound | tonic::Code::Unimplemented) => conditions,
        // Replicating Unknown, and the pass goes on (upstream's ends there, retried with backoff).
        // [differs: replication-info-error]
        Err(s) => set_condition(&conditions, decide::replicating(subject, "UNKNOWN", &rep::go_error(&s), generation)),
    }
}

/// `GetReplicationDestinationInfo` into destinationVolumeID, where the leader offers it, until it
/// is known (as upstream, a known destination is not asked for again). A group's destination is
/// its content's (`volume_group_replication_content`). A failure is recorded with the rest of the
/// pass's results (upstream discards the pass). [differs: destination-info-error]
async fn destination(
    ctx: &Core,
    vr: &VolumeReplication,
    volume: &Volume,
    conditions: Vec<Condition>,
    body: &mut serde_json::Value,
) -> Vec<Condition> {
    let generation = vr.metadata.generation;
    if !volume.leader.offers(DESTINATION_INFO) || volume.source.is_group() {
        return conditions;
    }
    let known = conditions.iter().find(|c| c.type_ == rep::DESTINATION_CONDITION);
    // Known, or known not to be supported for this spec: not asked at every info poll.
    if known.is_some_and(|c| c.status == "True" || (c.reason == "NotSupported" && c.observed_generation == generation))
    {
        return conditions;
    }
    let (secret_name, secret_namespace) = secret(volume);
    let request =
        pb::GetReplicationDestinationInfoRequest { secret_name, secret_namespace, replication_source: source(volume) };
    let mut client = ReplicationClient::new(volume.leader.channel.clone());
    let ask = client.get_replication_destination_info(timed(request));
    let answer = ctx.metrics.timed_rpc("Replication/GetReplicationDestinationInfo", ask).await;
    let found = match answer {
        Ok(answer) => match answer.into_inner().replication_destination.and_then(|d| d.r#type) {
            Some(pb::replication_destination::Type::Volume(v)) if !v.volume_id.is_empty() => {
                body["destinationVolumeID"] = json!(v.volume_id);
                rep::Destination::Available
            }
            _ => rep::Destination::Failed("replication destination volume ID is empty".into()),
        },
        // Upstream's v0.14.0 sidecar answers so: the feature is missing, nothing to retry.
        // [differs: destination-info-unimplemented]
        Err(s) if s.code() == tonic::Code::Unimplemented => rep::Destination::NotSupported,
        Err(s) => rep::Destination::Failed(s.message().to_owned()),
    };
    let subject = rep::subject(&vr.spec.data_source.kind);
    set_condition(&conditions, rep::destination_condition(subject, &found, generation))
}

fn record(ctx: &Core, desired: ReplicationState, result: &str, started: k8s_openapi::jiff::Timestamp) {
    let kind = match desired {
        ReplicationState::Primary => "VolumeReplication/Promote",
        ReplicationState::Secondary => "VolumeReplication/Demote",
        ReplicationState::Resync => "VolumeReplication/Resync",
    };
    ctx.metrics.operation_ended(kind, result);
    let seconds =
        (k8s_openapi::jiff::Timestamp::now().as_millisecond() - started.as_millisecond()).max(0) as f64 / 1000.0;
    ctx.metrics.operation_duration.with_label_values(&[kind]).observe(seconds);
}

/// A Problem into the status, as upstream's failures: the state kept (Unknown if none), the
/// message, the failure conditions of what the spec asks for, this generation; a Warning event
/// when the message is new. Upstream writes nothing for a failure before any call.
/// [differs: failure-before-call]
async fn fail(ctx: &Retrying, vr: &VolumeReplication, problem: Problem) -> Result<Action, kube::Error> {
    let previous = vr.status.clone().unwrap_or_default();
    let generation = vr.metadata.generation;
    let message = problem.to_string();
    let new_message = previous.message.as_deref() != Some(message.as_str());
    if new_message || previous.observed_generation != generation {
        let kind = &vr.spec.data_source.kind;
        let subject = rep::subject(kind);
        let attempt = decide::Attempt::of_spec(vr.spec.replication_state);
        let failure = (problem.what(kind), message.as_str());
        let conditions = decide::failed(&previous.conditions, subject, generation, attempt, failure);
        let mut body = status_body(vr);
        body["state"] = json!(previous.state.unwrap_or(ObservedReplicationState::Unknown));
        body["message"] = json!(message);
        body["conditions"] = json!(conditions);
        body["observedGeneration"] = json!(generation);
        ctx.apply_status(vr, body).await?;
    }
    if new_message {
        ctx.event(vr, true, problem.reason(), message).await;
    }
    Ok(if problem.retry() { Action::requeue(ctx.retry(vr)) } else { Action::await_change() })
}
