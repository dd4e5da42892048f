//! CSI-Addons Identity: what this driver process really offers.
use std::sync::Arc;

use api::proto::identity as pb;
use pb::capability::{self, Type};
use tonic::{Request, Response, Status};

use crate::driver::Driver;

pub struct Identity(pub Arc<Driver>);

/// The capabilities of a driver in `mode`: exactly the services `addons::routes` serves.
pub fn capabilities(mode: crate::driver::Mode) -> Vec<pb::Capability> {
    use capability::{
        encryption_key_rotation::Type as Ekr, network_fence::Type as Fence, reclaim_space::Type as Reclaim,
        service::Type as Service, volume_group::Type as Vg, volume_replication::Type as Vr,
    };
    let cap = |t: Type| pb::Capability { r#type: Some(t) };
    let mut caps = Vec::new();
    if mode.controller() {
        caps.push(cap(Type::Service(capability::Service { r#type: Service::ControllerService as i32 })));
        caps.push(cap(Type::ReclaimSpace(capability::ReclaimSpace { r#type: Reclaim::Offline as i32 })));
        for fence in [Fence::NetworkFence, Fence::GetClientsToFence] {
            caps.push(cap(Type::NetworkFence(capability::NetworkFence { r#type: fence as i32 })));
        }
        for replication in [Vr::VolumeReplication, Vr::GetReplicationDestinationInfo] {
            caps.push(cap(Type::VolumeReplication(capability::VolumeReplication { r#type: replication as i32 })));
        }
        for group in [
            Vg::VolumeGroup,
            Vg::LimitVolumeToOneVolumeGroup,
            Vg::ModifyVolumeGroup,
            Vg::GetVolumeGroup,
            Vg::ListVolumeGroups,
        ] {
            caps.push(cap(Type::VolumeGroup(capability::VolumeGroup { r#type: group as i32 })));
        }
    }
    if mode.node() {
        caps.push(cap(Type::Service(capability::Service { r#type: Service::NodeService as i32 })));
        caps.push(cap(Type::ReclaimSpace(capability::ReclaimSpace { r#type: Reclaim::Online as i32 })));
        caps.push(cap(Type::EncryptionKeyRotation(capability::EncryptionKeyRotation {
            r#type: Ekr::Encryptionkeyrotation as i32,
        })));
    }
    caps
}

#[tonic::async_trait]
impl pb::identity_server::Identity for Identity {
    async fn get_identity(
        &self,
        _: Request<pb::GetIdentityRequest>,
    ) -> Result<Response<pb::GetIdentityResponse>, Status> {
        Ok(Response::new(pb::GetIdentityResponse {
            name: self.0.config.name.clone(),
            vendor_version: build_info::VERSION.to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_capabilities(
        &self,
        _: Request<pb::GetCapabilitiesRequest>,
    ) -> Result<Response<pb::GetCapabilitiesResponse>, Status> {
        Ok(Response::new(pb::GetCapabilitiesResponse { capabilities: capabilities(self.0.config.mode) }))
    }

    async fn probe(&self, _: Request<pb::ProbeRequest>) -> Result<Response<pb::ProbeResponse>, Status> {
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}
