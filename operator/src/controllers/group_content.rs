//! VolumeGroupReplicationContent: the group at the driver, through the leader sidecar that offers
//! VOLUME_GROUP. fetch (class, owning group, leader) → decide (create, modify, or delete) → act
//! (CreateVolumeGroup / ModifyVolumeGroupMembership / DeleteVolumeGroup; GetReplicationDestinationInfo
//! once the group replicates) → spec (handle) and status (volumes and their destinations, the
//! destination group, `Ready` with the driver's error — ours, so the group can show it).
use std::sync::Arc;

use api::proto::internal::volume_group_controller_client::VolumeGroupControllerClient;
use api::proto::internal::{CreateVolumeGroupRequest, DeleteVolumeGroupRequest, ModifyVolumeGroupMembershipRequest};
use api::replication::{VolumeGroupReplication, VolumeGroupReplicationClass, VolumeGroupReplicationContent};
use futures::Future;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::ListParams;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::patch_merge;
use crate::compact::CsiPv;
use crate::context::{Context, ReconcileError, condition, set_condition};
use crate::pool::Connection;
use crate::replication::{self as rep, CONTENT_NAME, DESTINATION_INFO, VGR_FINALIZER, VOLUME_GROUP, VR_FINALIZER};

const NAME: &str = "volumegroupreplicationcontent";

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let contents = Api::<VolumeGroupReplicationContent>::all(ctx.client.clone());
    let (store, ready, changes) = super::spec_watch(contents, super::generation_or_deletion);
    ctx.caches.follow(NAME, ready);
    super::run_controller(Controller::for_stream(changes, store), ctx, NAME, stop, reconcile).await;
}

/// Everything a call needs.
struct Group {
    leader: Arc<Connection>,
    parameters: std::collections::HashMap<String, String>,
    secret: (String, String),
}

async fn reconcile(content: Arc<VolumeGroupReplicationContent>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let Some(owner) = content.spec.volume_group_replication_ref.clone() else {
        return Ok(Action::await_change());
    };
    let (namespace, vgr_name) = (owner.namespace.unwrap_or_default(), owner.name.unwrap_or_default());
    if ctx.watch_namespace.as_ref().is_some_and(|n| *n != namespace) {
        return Ok(Action::await_change()); // another manager's group
    }
    let vgrs = Api::<VolumeGroupReplication>::namespaced(ctx.client.clone(), &namespace);
    let vgr = vgrs.get_opt(&vgr_name).await?;
    let deleting = content.metadata.deletion_timestamp.is_some();
    if deleting && !content.finalizers().iter().any(|f| f == VGR_FINALIZER) {
        return Ok(Action::await_change());
    }
    if deleting && vgr.as_ref().is_some_and(|g| g.metadata.deletion_timestamp.is_none()) {
        return Ok(Action::await_change()); // only the group's deletion takes its content away
    }
    if deleting && content.finalizers().iter().any(|f| f == VR_FINALIZER) {
        return Err(ReconcileError::Transient(format!(
            "VolumeGroupReplicationContent {}: its VolumeReplication still uses it",
            content.name_any()
        )));
    }
    let group = match connect(&ctx, &content).await {
        Ok(group) => group,
        Err(message) => return not_ready(&ctx, &content, "NoLeaderSidecar", message).await,
    };
    let handle = content.spec.volume_group_replication_handle.clone().filter(|h| !h.is_empty());
    let mut client = VolumeGroupControllerClient::new(group.leader.channel.clone());
    let (secret_name, secret_namespace) = group.secret.clone();
    if deleting {
        if let Some(id) = handle {
            let empty = ModifyVolumeGroupMembershipRequest {
                volume_group_id: id.clone(),
                volume_ids: Vec::new(),
                secret_name: secret_name.clone(),
                secret_namespace: secret_namespace.clone(),
                parameters: group.parameters.clone(),
            };
            let answer =
                observed(&ctx, "VolumeGroup/ModifyVolumeGroupMembership", client.modify_volume_group_membership(empty))
                    .await;
            if let Err(message) = answer.map(|_| ()).or_else(not_found_is_done) {
                return not_ready(&ctx, &content, "ModifyVolumeGroupFailed", message).await;
            }
            let request = DeleteVolumeGroupRequest { volume_group_id: id, secret_name, secret_namespace };
            let answer = observed(&ctx, "VolumeGroup/DeleteVolumeGroup", client.delete_volume_group(request)).await;
            if let Err(message) = answer.map(|_| ()).or_else(not_found_is_done) {
                return not_ready(&ctx, &content, "DeleteVolumeGroupFailed", message).await;
            }
        }
        if let Some(vgr) = vgr.as_ref().filter(|g| g.annotations().contains_key(CONTENT_NAME)) {
            patch_merge(&ctx, vgr, &json!({"metadata": {"annotations": {CONTENT_NAME: null}}})).await?;
        }
        super::set_finalizer(&ctx, content.as_ref(), VGR_FINALIZER, false).await?;
        return Ok(Action::await_change());
    }
    if let Some(vgr) = vgr.as_ref().filter(|g| g.annotations().get(CONTENT_NAME) != Some(&content.name_any())) {
        patch_merge(&ctx, vgr, &json!({"metadata": {"annotations": {CONTENT_NAME: content.name_any()}}})).await?;
    }
    super::set_finalizer(&ctx, content.as_ref(), VGR_FINALIZER, true).await?;
    let volume_ids = content.spec.source.volume_handles.clone();
    let group_id = handle.clone();
    match handle {
        None => {
            let request = CreateVolumeGroupRequest {
                name: content.name_any(),
                parameters: group.parameters.clone(),
                secret_name,
                secret_namespace,
                volume_ids: volume_ids.clone(),
            };
            let created =
                match observed(&ctx, "VolumeGroup/CreateVolumeGroup", client.create_volume_group(request)).await {
                    Ok(answer) => answer.volume_group.unwrap_or_default(),
                    Err(message) => return not_ready(&ctx, &content, "CreateVolumeGroupFailed", message).await,
                };
            let spec = json!({"spec": {
                "volumeGroupReplicationHandle": created.volume_group_id,
                "volumeGroupAttributes": created.volume_group_context,
            }});
            patch_merge(&ctx, content.as_ref(), &spec).await?;
        }
        Some(id) => {
            let request = ModifyVolumeGroupMembershipRequest {
                volume_group_id: id,
                volume_ids: volume_ids.clone(),
                secret_name,
                secret_namespace,
                parameters: group.parameters.clone(),
            };
            let answer = observed(
                &ctx,
                "VolumeGroup/ModifyVolumeGroupMembership",
                client.modify_volume_group_membership(request),
            )
            .await;
            if let Err(message) = answer {
                return not_ready(&ctx, &content, "ModifyVolumeGroupFailed", message).await;
            }
        }
    }
    // The PVs of the group's volumes, by name (upstream lists every PV too).
    let pvs = Api::<CsiPv>::all(ctx.client.clone()).list(&ListParams::default()).await?;
    let mut mapping: Vec<(String, String)> = pvs
        .items
        .iter()
        .filter_map(|pv| {
            let handle = pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone();
            volume_ids.contains(&handle).then(|| (pv.name_any(), handle))
        })
        .collect();
    mapping.sort();
    // Where the driver replicates the group to, once replication runs (upstream [main]).
    let destination = match group_id {
        Some(id) if group.leader.offers(DESTINATION_INFO) => destination(&ctx, &group, id).await,
        _ => GroupDestination::NotAsked,
    };
    let (group_destination, volumes) = match &destination {
        GroupDestination::Known { group, volumes } => (Some(group.clone()), Some(volumes)),
        _ => (None, None),
    };
    let destination_of = |handle: &str| volumes.and_then(|v| v.get(handle)).filter(|d| !d.is_empty());
    let conditions = with_ready(&content, true, "Ready", "the volume group holds the listed volumes");
    let mut status = json!({
        "persistentVolumeRefList": mapping.iter().map(|(name, _)| json!({"name": name})).collect::<Vec<_>>(),
        "persistentVolumeMappingList": mapping.iter().map(|(name, handle)| {
            let mut entry = json!({"name": name, "volumeHandle": handle});
            if let Some(destination) = destination_of(handle) {
                entry["destinationVolumeHandle"] = json!(destination);
            }
            entry
        }).collect::<Vec<_>>(),
        "conditions": conditions,
    });
    if let Some(group_destination) = group_destination {
        status["destinationVolumeGroupID"] = json!(group_destination);
    } else if let Some(known) = content.status.as_ref().and_then(|s| s.destination_volume_group_id.clone()) {
        // Kept while the driver cannot say (a retry may yet).
        status["destinationVolumeGroupID"] = json!(known);
    }
    ctx.apply_status(content.as_ref(), status).await?;
    let complete = mapping.iter().all(|(_, handle)| destination_of(handle).is_some());
    match destination {
        GroupDestination::Known { .. } if complete => {}
        GroupDestination::NotAsked | GroupDestination::NotSupported => {}
        // Replication may not have started yet: asked again, less and less often.
        _ => return Ok(Action::requeue(super::retry_delay(&ctx, content.as_ref()))),
    }
    super::forget_failures(&ctx, content.as_ref());
    Ok(Action::await_change())
}

/// What the driver says of the group's destination.
enum GroupDestination {
    /// The leader does not offer GetReplicationDestinationInfo, or there is no group yet.
    NotAsked,
    /// The sidecar lacks the call (upstream's v0.14.0).
    NotSupported,
    /// Not known yet (replication not running, or the driver failed): asked again later.
    Unknown,
    /// The destination group, and source volume handle → destination volume handle.
    Known { group: String, volumes: std::collections::HashMap<String, String> },
}

/// `GetReplicationDestinationInfo` for the group `id`, with the class's group secret.
async fn destination(ctx: &Context, group: &Group, id: String) -> GroupDestination {
    use api::proto::internal::replication_client::ReplicationClient;
    use api::proto::internal::{GetReplicationDestinationInfoRequest, ReplicationSource, replication_source};
    let (secret_name, secret_namespace) = group.secret.clone();
    let source = replication_source::Type::VolumeGroup(replication_source::VolumeGroupSource { volume_group_id: id });
    let request = GetReplicationDestinationInfoRequest {
        secret_name,
        secret_namespace,
        replication_source: Some(ReplicationSource { r#type: Some(source) }),
    };
    let mut client = ReplicationClient::new(group.leader.channel.clone());
    let answer = ctx
        .metrics
        .timed_rpc("Replication/GetReplicationDestinationInfo", client.get_replication_destination_info(request))
        .await;
    use api::proto::internal::replication_destination::Type;
    match answer.map(|a| a.into_inner().replication_destination.and_then(|d| d.r#type)) {
        Ok(Some(Type::Volumegroup(g))) if !g.volume_group_id.is_empty() => {
            GroupDestination::Known { group: g.volume_group_id, volumes: g.volume_ids }
        }
        Ok(_) => GroupDestination::Unknown,
        Err(s) if s.code() == tonic::Code::Unimplemented => GroupDestination::NotSupported,
        Err(s) => {
            tracing::debug!(code = ?s.code(), message = s.message(), "the group's destination is not known yet");
            GroupDestination::Unknown
        }
    }
}

fn not_found_is_done(message: String) -> Result<(), String> {
    if message.starts_with("NotFound") { Ok(()) } else { Err(message) }
}

/// The leader of the content's driver, and the class's parameters and group secret.
async fn connect(ctx: &Context, content: &VolumeGroupReplicationContent) -> Result<Group, String> {
    let class_name = &content.spec.volume_group_replication_class_name;
    let class = Api::<VolumeGroupReplicationClass>::all(ctx.client.clone())
        .get_opt(class_name)
        .await
        .map_err(|e| format!("reading VolumeGroupReplicationClass {class_name}: {e}"))?
        .ok_or_else(|| format!("VolumeGroupReplicationClass {class_name} not found"))?;
    let parameters = rep::class_parameters(class.spec.parameters.as_ref())
        .map_err(|why| format!("VolumeGroupReplicationClass {class_name}: {why}"))?;
    let driver = &content.spec.provisioner;
    let leader = ctx.pool.leader(&ctx.client, driver).await.map_err(|e| e.to_string())?;
    if !leader.offers(VOLUME_GROUP) {
        return Err(format!("the leader sidecar {} of driver {driver} does not offer {VOLUME_GROUP}", leader.key()));
    }
    Ok(Group {
        leader,
        parameters: parameters.parameters.into_iter().collect(),
        secret: parameters.group_secret.unwrap_or_default(),
    })
}

/// A call's answer, its latency recorded; an error as `Code: message`.
async fn observed<T>(
    ctx: &Context,
    method: &str,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    let answer = ctx.metrics.timed_rpc(method, call).await;
    let result = if answer.is_ok() { "Succeeded" } else { "Failed" };
    ctx.metrics.operations.with_label_values(&[method, result]).inc();
    answer.map(tonic::Response::into_inner).map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

fn with_ready(content: &VolumeGroupReplicationContent, ready: bool, reason: &str, message: &str) -> Vec<Condition> {
    let conditions = content.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    set_condition(conditions, condition("Ready", ready, reason, message, content.metadata.generation))
}

/// `Ready=False` with the driver's words (the group shows them), a Warning event, a retry.
async fn not_ready(
    ctx: &Context,
    content: &VolumeGroupReplicationContent,
    reason: &str,
    message: String,
) -> Result<Action, ReconcileError> {
    let previous = content.status.clone().unwrap_or_default();
    let conditions = with_ready(content, false, reason, &message);
    let mut status = json!(previous);
    status["conditions"] = json!(conditions);
    ctx.apply_status(content, status).await?;
    ctx.event(content, true, reason, message).await;
    Ok(Action::requeue(super::retry_delay(ctx, content)))
}
