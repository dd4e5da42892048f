//! `proto.VolumeGroupController`: the Secret read by reference (unreadable: INTERNAL, as
//! upstream); the driver's CSI volumes flattened to their IDs.
use std::collections::HashMap;
use std::sync::Arc;

use api::proto::{internal as pb, volumegroup as driver};
use tonic::{Code, Request, Response, Status};

use super::backend::Backend;

pub struct Groups(pub Arc<Backend>);

fn group(g: Option<driver::VolumeGroup>) -> Option<pb::VolumeGroup> {
    g.map(|g| pb::VolumeGroup {
        volume_group_id: g.volume_group_id,
        volume_group_context: g.volume_group_context,
        volume_ids: g.volumes.into_iter().map(|v| v.volume_id).collect(),
    })
}

impl Groups {
    fn client(&self) -> driver::controller_client::ControllerClient<tonic::transport::Channel> {
        driver::controller_client::ControllerClient::new(self.0.driver.clone())
    }

    /// The Secret of a call that changes a group: the Lease holder's alone.
    async fn secrets(&self, namespace: &str, name: &str) -> Result<HashMap<String, String>, Status> {
        self.0.leadership.require()?;
        self.read_secrets(namespace, name).await
    }

    /// The Secret of a call that only reads, served on every replica.
    async fn read_secrets(&self, namespace: &str, name: &str) -> Result<HashMap<String, String>, Status> {
        self.0.secret(namespace, name, Code::Internal).await
    }
}

#[tonic::async_trait]
impl pb::volume_group_controller_server::VolumeGroupController for Groups {
    async fn create_volume_group(
        &self,
        request: Request<pb::CreateVolumeGroupRequest>,
    ) -> Result<Response<pb::CreateVolumeGroupResponse>, Status> {
        let r = request.into_inner();
        let request = driver::CreateVolumeGroupRequest {
            secrets: self.secrets(&r.secret_namespace, &r.secret_name).await?,
            name: r.name,
            parameters: r.parameters,
            volume_ids: r.volume_ids,
        };
        let result = self.client().create_volume_group(request).await;
        let created = self.0.driver_result("CreateVolumeGroup", result)?;
        Ok(Response::new(pb::CreateVolumeGroupResponse { volume_group: group(created.volume_group) }))
    }

    async fn modify_volume_group_membership(
        &self,
        request: Request<pb::ModifyVolumeGroupMembershipRequest>,
    ) -> Result<Response<pb::ModifyVolumeGroupMembershipResponse>, Status> {
        let r = request.into_inner();
        let request = driver::ModifyVolumeGroupMembershipRequest {
            secrets: self.secrets(&r.secret_namespace, &r.secret_name).await?,
            volume_group_id: r.volume_group_id,
            volume_ids: r.volume_ids,
            parameters: r.parameters,
        };
        let result = self.client().modify_volume_group_membership(request).await;
        let modified = self.0.driver_result("ModifyVolumeGroupMembership", result)?;
        Ok(Response::new(pb::ModifyVolumeGroupMembershipResponse { volume_group: group(modified.volume_group) }))
    }

    async fn delete_volume_group(
        &self,
        request: Request<pb::DeleteVolumeGroupRequest>,
    ) -> Result<Response<pb::DeleteVolumeGroupResponse>, Status> {
        let r = request.into_inner();
        let request = driver::DeleteVolumeGroupRequest {
            secrets: self.secrets(&r.secret_namespace, &r.secret_name).await?,
            volume_group_id: r.volume_group_id,
        };
        let result = self.client().delete_volume_group(request).await;
        self.0.driver_result("DeleteVolumeGroup", result)?;
        Ok(Response::new(pb::DeleteVolumeGroupResponse {}))
    }

    async fn controller_get_volume_group(
        &self,
        request: Request<pb::ControllerGetVolumeGroupRequest>,
    ) -> Result<Response<pb::ControllerGetVolumeGroupResponse>, Status> {
        let r = request.into_inner();
        let request = driver::ControllerGetVolumeGroupRequest {
            secrets: self.read_secrets(&r.secret_namespace, &r.secret_name).await?,
            volume_group_id: r.volume_group_id,
        };
        let result = self.client().controller_get_volume_group(request).await;
        let got = self.0.driver_result("ControllerGetVolumeGroup", result)?;
        Ok(Response::new(pb::ControllerGetVolumeGroupResponse { volume_group: group(got.volume_group) }))
    }
}
