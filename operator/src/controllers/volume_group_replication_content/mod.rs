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
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::compact::CsiPv;
use crate::controllers::replication::{CONTENT_NAME, DESTINATION_INFO, VGR_FINALIZER, VOLUME_GROUP};
use crate::controllers::replication_class::{self, ClassError};
use crate::core::Core;
use crate::core::action::Action;
use crate::core::backoff::Retrying;
use crate::core::error::{Categorized, Category, kube_category};
use crate::core::patch::patch_merge;
use crate::sidecars::pool::{Connection, LookupError};

pub mod decide;

use self::decide::{GroupDestination, Step, not_found_is_done, with_ready, words};

const NAME: &str = "volumegroupreplicationcontent";

pub async fn run(core: Arc<Core>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let contents = Api::<VolumeGroupReplicationContent>::all(core.client.clone());
    let (store, ready, changes) = crate::core::watch::spec_watch(contents, crate::core::watch::generation_or_deletion);
    core.caches.follow(NAME, ready);
    let ctx = Retrying::retrying(core, &store);
    let controller = crate::core::queue::Triggers::new(changes).controller(store);
    crate::core::run::run_controller(controller, ctx, NAME, stop, reconcile).await;
}

/// Why a pass could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("VolumeGroupReplicationContent {0}: its VolumeReplication still uses it")]
    InUse(String),
}

impl Categorized for Error {
    fn category(&self) -> Category {
        match self {
            Error::Api(e) => kube_category(e),
            Error::InUse(_) => Category::Transient,
        }
    }
}

/// Why the group's driver cannot be reached through its leader sidecar.
#[derive(Debug, thiserror::Error)]
enum NoGroupClient {
    #[error(transparent)]
    Class(#[from] ClassError),
    #[error(transparent)]
    NoLeader(#[from] LookupError),
    #[error("the leader sidecar {sidecar} of driver {driver} does not offer {VOLUME_GROUP}")]
    NotOffered { sidecar: String, driver: String },
}

/// Everything a call needs.
struct Group {
    leader: Arc<Connection>,
    parameters: std::collections::HashMap<String, String>,
    secret: (String, String),
}

pub(crate) async fn reconcile(
    content: Arc<VolumeGroupReplicationContent>,
    ctx: Arc<Retrying>,
) -> Result<Action, Error> {
    let Some(owner) = content.spec.volume_group_replication_ref.clone() else {
        return Ok(Action::await_change());
    };
    let (namespace, vgr_name) = (owner.namespace.unwrap_or_default(), owner.name.unwrap_or_default());
    if ctx.watch_namespace.as_ref().is_some_and(|n| *n != namespace) {
        return Ok(Action::await_change()); // another manager's group
    }
    let vgrs = Api::<VolumeGroupReplication>::namespaced(ctx.client.clone(), &namespace);
    let vgr = vgrs.get_opt(&vgr_name).await?;
    let deleting = match decide::step(&content, vgr.as_ref()) {
        Step::Leave => return Ok(Action::await_change()),
        Step::InUse => return Err(Error::InUse(content.name_any())),
        Step::Delete => true,
        Step::Ensure => false,
    };
    let group = match connect(&ctx, &content).await {
        Ok(group) => group,
        Err(why) => return not_ready(&ctx, &content, "NoLeaderSidecar", why.to_string()).await,
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
            if let Err(status) = answer.map(|_| ()).or_else(not_found_is_done) {
                return not_ready(&ctx, &content, "ModifyVolumeGroupFailed", words(&status)).await;
            }
            let request = DeleteVolumeGroupRequest { volume_group_id: id, secret_name, secret_namespace };
            let answer = observed(&ctx, "VolumeGroup/DeleteVolumeGroup", client.delete_volume_group(request)).await;
            if let Err(status) = answer.map(|_| ()).or_else(not_found_is_done) {
                return not_ready(&ctx, &content, "DeleteVolumeGroupFailed", words(&status)).await;
            }
        }
        if let Some(vgr) = vgr.as_ref().filter(|g| g.annotations().contains_key(CONTENT_NAME)) {
            patch_merge(&ctx, vgr, &json!({"metadata": {"annotations": {CONTENT_NAME: null}}})).await?;
        }
        crate::core::patch::set_finalizer(&ctx, content.as_ref(), VGR_FINALIZER, false).await?;
        return Ok(Action::await_change());
    }
    if let Some(vgr) = vgr.as_ref().filter(|g| g.annotations().get(CONTENT_NAME) != Some(&content.name_any())) {
        patch_merge(&ctx, vgr, &json!({"metadata": {"annotations": {CONTENT_NAME: content.name_any()}}})).await?;
    }
    crate::core::patch::set_finalizer(&ctx, content.as_ref(), VGR_FINALIZER, true).await?;
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
                    Err(status) => {
                        return not_ready(&ctx, &content, "CreateVolumeGroupFailed", words(&status)).await;
                    }
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
            if let Err(status) = answer {
                return not_ready(&ctx, &content, "ModifyVolumeGroupFailed", words(&status)).await;
            }
        }
    }
    // The PVs of the group's volumes, by name (upstream lists every PV too).
    let pvs = Api::<CsiPv>::all(ctx.client.clone()).list(&ListParams::default()).await?;
    let mapping = decide::volume_mapping(&pvs.items, &volume_ids);
    // Where the driver replicates the group to, once replication runs (as upstream's main branch).
    let destination = match group_id {
        Some(id) if group.leader.offers(DESTINATION_INFO) => destination(&ctx, &group, id).await,
        _ => GroupDestination::NotAsked,
    };
    let (status, settled) = decide::ready_status(&content, &mapping, &destination);
    ctx.apply_status(content.as_ref(), status).await?;
    if !settled {
        // Replication may not have started yet: asked again, less and less often.
        return Ok(Action::requeue(ctx.retry(content.as_ref())));
    }
    ctx.forget(content.as_ref());
    Ok(Action::await_change())
}

/// `GetReplicationDestinationInfo` for the group `id`, with the class's group secret.
async fn destination(ctx: &Core, group: &Group, id: String) -> GroupDestination {
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

/// The leader of the content's driver, and the class's parameters and group secret.
async fn connect(ctx: &Core, content: &VolumeGroupReplicationContent) -> Result<Group, NoGroupClient> {
    let class_name = &content.spec.volume_group_replication_class_name;
    let (_, parameters) = replication_class::read::<VolumeGroupReplicationClass>(&ctx.client, class_name).await?;
    let driver = &content.spec.provisioner;
    let leader = ctx.pool.leader(&ctx.client, driver).await?;
    if !leader.offers(VOLUME_GROUP) {
        return Err(NoGroupClient::NotOffered { sidecar: leader.key(), driver: driver.clone() });
    }
    Ok(Group {
        leader,
        parameters: parameters.parameters.into_iter().collect(),
        secret: parameters.group_secret.unwrap_or_default(),
    })
}

/// A call's answer, its latency and outcome recorded.
async fn observed<T>(
    ctx: &Core,
    method: &str,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    let answer = ctx.metrics.timed_rpc(method, call).await;
    let result = if answer.is_ok() { "Succeeded" } else { "Failed" };
    ctx.metrics.operation_ended(method, result);
    answer.map(tonic::Response::into_inner)
}

/// `Ready=False` with the driver's words (the group shows them), a Warning event, a retry.
async fn not_ready(
    ctx: &Retrying,
    content: &VolumeGroupReplicationContent,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    let previous = content.status.clone().unwrap_or_default();
    let conditions = with_ready(content, false, reason, &message);
    let mut status = json!(previous);
    status["conditions"] = json!(conditions);
    ctx.apply_status(content, status).await?;
    ctx.event(content, true, reason, message).await;
    Ok(Action::requeue(ctx.retry(content)))
}
