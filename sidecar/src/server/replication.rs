//! `proto.Replication`: the replication source, force, parameters and the Secret read by
//! reference (an unreadable Secret is INTERNAL, as upstream).
use std::sync::Arc;

use api::proto::{internal as pb, replication as driver};
use tonic::{Code, Request, Response, Status};

use super::backend::Backend;

pub struct Replication(pub Arc<Backend>);

fn source(source: Option<pb::ReplicationSource>) -> Result<Option<driver::ReplicationSource>, Status> {
    use driver::replication_source::{Type, VolumeGroupSource, VolumeSource};
    use pb::replication_source::Type as In;
    let r#type = match source.and_then(|s| s.r#type) {
        Some(In::Volume(v)) if !v.volume_id.is_empty() => Type::Volume(VolumeSource { volume_id: v.volume_id }),
        Some(In::VolumeGroup(g)) if !g.volume_group_id.is_empty() => {
            Type::Volumegroup(VolumeGroupSource { volume_group_id: g.volume_group_id })
        }
        _ => return Err(Status::invalid_argument("replication_source needs a volume ID or a volume group ID")),
    };
    Ok(Some(driver::ReplicationSource { r#type: Some(r#type) }))
}

fn destination(d: Option<driver::ReplicationDestination>) -> Option<pb::ReplicationDestination> {
    use driver::replication_destination::Type as Out;
    use pb::replication_destination::{Type, VolumeDestination, VolumeGroupDestination};
    let r#type = match d?.r#type? {
        Out::Volume(v) => Type::Volume(VolumeDestination { volume_id: v.volume_id }),
        Out::Volumegroup(g) => {
            Type::Volumegroup(VolumeGroupDestination { volume_group_id: g.volume_group_id, volume_ids: g.volume_ids })
        }
    };
    Some(pb::ReplicationDestination { r#type: Some(r#type) })
}

impl Replication {
    fn client(&self) -> driver::controller_client::ControllerClient<tonic::transport::Channel> {
        driver::controller_client::ControllerClient::new(self.0.driver.clone())
    }

    /// The Secret of a call that changes replication: the Lease holder's alone.
    async fn secrets(&self, namespace: &str, name: &str) -> Result<std::collections::HashMap<String, String>, Status> {
        self.0.leadership.require()?;
        self.read_secrets(namespace, name).await
    }

    /// The Secret of a call that only reads, served on every replica.
    async fn read_secrets(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<std::collections::HashMap<String, String>, Status> {
        self.0.secret(namespace, name, Code::Internal).await
    }
}

#[tonic::async_trait]
impl pb::replication_server::Replication for Replication {
    async fn enable_volume_replication(
        &self,
        request: Request<pb::EnableVolumeReplicationRequest>,
    ) -> Result<Response<pb::EnableVolumeReplicationResponse>, Status> {
        let r = request.into_inner();
        let request = driver::EnableVolumeReplicationRequest {
            secrets: self.secrets(&r.secret_namespace, &r.secret_name).await?,
            replication_source: source(r.replication_source)?,
            parameters: r.parameters,
            replication_id: r.replication_id,
            ..Default::default()
        };
        let result = self.client().enable_volume_replication(request).await;
        self.0.driver_result("EnableVolumeReplication", result)?;
        Ok(Response::new(pb::EnableVolumeReplicationResponse {}))
    }

    async fn disable_volume_replication(
        &self,
        request: Request<pb::DisableVolumeReplicationRequest>,
    ) -> Result<Response<pb::DisableVolumeReplicationResponse>, Status> {
        let r = request.into_inner();
        let request = driver::DisableVolumeReplicationRequest {
            secrets: self.secrets(&r.secret_namespace, &r.secret_name).await?,
            replication_source: source(r.replication_source)?,
            parameters: r.parameters,
            replication_id: r.replication_id,
            ..Default::default()
        };
        let result = self.client().disable_volume_replication(request).await;
        self.0.driver_result("DisableVolumeReplication", result)?;
        Ok(Response::new(pb::DisableVolumeReplicationResponse {}))
    }

    async fn promote_volume(
        &self,
        request: Request<pb::PromoteVolumeRequest>,
    ) -> Result<Response<pb::PromoteVolumeResponse>, Status> {
        let r = request.into_inner();
        let request = driver::PromoteVolumeRequest {
            secrets: self.secrets(&r.secret_namespace, &r.secret_name).await?,
            replication_source: source(r.replication_source)?,
            parameters: r.parameters,
            replication_id: r.replication_id,
            force: r.force,
            ..Default::default()
        };
        let result = self.client().promote_volume(request).await;
        self.0.driver_result("PromoteVolume", result)?;
        Ok(Response::new(pb::PromoteVolumeResponse {}))
    }

    async fn demote_volume(
        &self,
        request: Request<pb::DemoteVolumeRequest>,
    ) -> Result<Response<pb::DemoteVolumeResponse>, Status> {
        let r = request.into_inner();
        let request = driver::DemoteVolumeRequest {
            secrets: self.secrets(&r.secret_namespace, &r.secret_name).await?,
            replication_source: source(r.replication_source)?,
            parameters: r.parameters,
            replication_id: r.replication_id,
            force: r.force,
            ..Default::default()
        };
        let result = self.client().demote_volume(request).await;
        self.0.driver_result("DemoteVolume", result)?;
        Ok(Response::new(pb::DemoteVolumeResponse {}))
    }

    async fn resync_volume(
        &self,
        request: Request<pb::ResyncVolumeRequest>,
    ) -> Result<Response<pb::ResyncVolumeResponse>, Status> {
        let r = request.into_inner();
        let request = driver::ResyncVolumeRequest {
            secrets: self.secrets(&r.secret_namespace, &r.secret_name).await?,
            replication_source: source(r.replication_source)?,
            parameters: r.parameters,
            replication_id: r.replication_id,
            force: r.force,
            ..Default::default()
        };
        let result = self.client().resync_volume(request).await;
        let ready = self.0.driver_result("ResyncVolume", result)?.ready;
        Ok(Response::new(pb::ResyncVolumeResponse { ready }))
    }

    async fn get_volume_replication_info(
        &self,
        request: Request<pb::GetVolumeReplicationInfoRequest>,
    ) -> Result<Response<pb::GetVolumeReplicationInfoResponse>, Status> {
        let r = request.into_inner();
        let request = driver::GetVolumeReplicationInfoRequest {
            secrets: self.read_secrets(&r.secret_namespace, &r.secret_name).await?,
            replication_source: source(r.replication_source)?,
            replication_id: r.replication_id,
            ..Default::default()
        };
        let result = self.client().get_volume_replication_info(request).await;
        let info = self.0.driver_result("GetVolumeReplicationInfo", result)?;
        Ok(Response::new(pb::GetVolumeReplicationInfoResponse {
            last_sync_time: info.last_sync_time,
            last_sync_duration: info.last_sync_duration,
            last_sync_bytes: info.last_sync_bytes,
            // Both enums number UNKNOWN, HEALTHY, DEGRADED, ERROR alike.
            status: info.status,
            status_message: info.status_message,
        }))
    }

    async fn get_replication_destination_info(
        &self,
        request: Request<pb::GetReplicationDestinationInfoRequest>,
    ) -> Result<Response<pb::GetReplicationDestinationInfoResponse>, Status> {
        let r = request.into_inner();
        let request = driver::GetReplicationDestinationInfoRequest {
            secrets: self.read_secrets(&r.secret_namespace, &r.secret_name).await?,
            replication_source: source(r.replication_source)?,
        };
        let result = self.client().get_replication_destination_info(request).await;
        let info = self.0.driver_result("GetReplicationDestinationInfo", result)?;
        Ok(Response::new(pb::GetReplicationDestinationInfoResponse {
            replication_destination: destination(info.replication_destination),
        }))
    }
}
