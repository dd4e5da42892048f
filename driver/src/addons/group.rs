//! VolumeGroup: named sets of volumes. A volume belongs to at most one group; a group must be
//! emptied before it is deleted, and a volume cannot be deleted while it is in a group.
use std::collections::BTreeMap;
use std::sync::Arc;

use api::proto::volumegroup as pb;
use tonic::{Request, Response, Status};

use crate::driver::Driver;
use crate::state::{Group, State};
use crate::volumes::{self, validate_id, validate_name};

pub struct Groups(pub Arc<Driver>);

fn to_pb(state: &State, group: &Group) -> pb::VolumeGroup {
    pb::VolumeGroup {
        volume_group_id: group.id.clone(),
        volume_group_context: Default::default(),
        volumes: group
            .volume_ids
            .iter()
            .filter_map(|id| state.volumes.get(id))
            .map(crate::controller::to_csi)
            .collect(),
    }
}

/// Checks that every volume exists and is in no group other than `group_id`.
fn check_members(state: &State, group_id: Option<&str>, volume_ids: &[String]) -> Result<(), Status> {
    for id in volume_ids {
        validate_id("volume_ids", id)?;
        if !state.volumes.contains_key(id) {
            return Err(Status::not_found(format!("volume {id} not found")));
        }
        if let Some(other) =
            state.groups.values().find(|g| Some(g.id.as_str()) != group_id && g.volume_ids.contains(id))
        {
            return Err(Status::failed_precondition(format!("volume {id} is already in volume group {}", other.id)));
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl pb::controller_server::Controller for Groups {
    async fn create_volume_group(
        &self,
        request: Request<pb::CreateVolumeGroupRequest>,
    ) -> Result<Response<pb::CreateVolumeGroupResponse>, Status> {
        let request = request.into_inner();
        validate_name("name", &request.name)?;
        let new_id = volumes::new_id().map_err(|e| Status::internal(format!("generating a group ID: {e}")))?;
        let parameters: BTreeMap<String, String> = request.parameters.into_iter().collect();
        let group = self
            .0
            .update(|state| {
                if let Some(existing) = state.groups.values().find(|g| g.name == request.name) {
                    if existing.parameters != parameters || existing.volume_ids != request.volume_ids {
                        return Err(Status::already_exists(format!(
                            "volume group {:?} exists with other parameters or volumes",
                            request.name
                        )));
                    }
                    return Ok(to_pb(state, existing));
                }
                check_members(state, None, &request.volume_ids)?;
                let group = Group {
                    id: new_id,
                    name: request.name.clone(),
                    parameters,
                    volume_ids: request.volume_ids.clone(),
                };
                state.groups.insert(group.id.clone(), group.clone());
                Ok(to_pb(state, &group))
            })
            .await?;
        Ok(Response::new(pb::CreateVolumeGroupResponse { volume_group: Some(group) }))
    }

    async fn modify_volume_group_membership(
        &self,
        request: Request<pb::ModifyVolumeGroupMembershipRequest>,
    ) -> Result<Response<pb::ModifyVolumeGroupMembershipResponse>, Status> {
        let request = request.into_inner();
        validate_id("volume_group_id", &request.volume_group_id)?;
        let group = self
            .0
            .update(|state| {
                if !state.groups.contains_key(&request.volume_group_id) {
                    return Err(Status::not_found(format!("volume group {} not found", request.volume_group_id)));
                }
                check_members(state, Some(&request.volume_group_id), &request.volume_ids)?;
                let group = state
                    .groups
                    .get_mut(&request.volume_group_id)
                    .ok_or_else(|| Status::not_found("volume group vanished"))?;
                group.volume_ids = request.volume_ids.clone();
                let group = group.clone();
                Ok(to_pb(state, &group))
            })
            .await?;
        Ok(Response::new(pb::ModifyVolumeGroupMembershipResponse { volume_group: Some(group) }))
    }

    async fn delete_volume_group(
        &self,
        request: Request<pb::DeleteVolumeGroupRequest>,
    ) -> Result<Response<pb::DeleteVolumeGroupResponse>, Status> {
        let id = request.into_inner().volume_group_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_group_id is required"));
        }
        self.0
            .update(|state| {
                match state.groups.get(&id) {
                    Some(group) if !group.volume_ids.is_empty() => {
                        return Err(Status::failed_precondition(format!(
                            "volume group {id} still has {} volume(s)",
                            group.volume_ids.len()
                        )));
                    }
                    _ => {}
                }
                state.groups.remove(&id);
                Ok(())
            })
            .await?;
        Ok(Response::new(pb::DeleteVolumeGroupResponse {}))
    }

    async fn list_volume_groups(
        &self,
        request: Request<pb::ListVolumeGroupsRequest>,
    ) -> Result<Response<pb::ListVolumeGroupsResponse>, Status> {
        let request = request.into_inner();
        let state = self.0.reload().await.map_err(|e| Status::internal(e.to_string()))?;
        let groups: Vec<&Group> = state.groups.values().collect();
        let (page, next_token) = crate::paging::page(&groups, &request.starting_token, request.max_entries)?;
        let entries = page
            .into_iter()
            .map(|g| pb::list_volume_groups_response::Entry { volume_group: Some(to_pb(&state, g)) })
            .collect();
        Ok(Response::new(pb::ListVolumeGroupsResponse { entries, next_token }))
    }

    async fn controller_get_volume_group(
        &self,
        request: Request<pb::ControllerGetVolumeGroupRequest>,
    ) -> Result<Response<pb::ControllerGetVolumeGroupResponse>, Status> {
        let id = request.into_inner().volume_group_id;
        validate_id("volume_group_id", &id)?;
        let state = self.0.reload().await.map_err(|e| Status::internal(e.to_string()))?;
        let group = state.groups.get(&id).ok_or_else(|| Status::not_found(format!("volume group {id} not found")))?;
        Ok(Response::new(pb::ControllerGetVolumeGroupResponse { volume_group: Some(to_pb(&state, group)) }))
    }
}
