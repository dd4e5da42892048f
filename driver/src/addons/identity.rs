//! CSI-Addons Identity: what this driver process really offers.
use std::sync::Arc;

use api::proto::identity as pb;
use pb::capability::{self, Type};
use tonic::{Request, Response, Status};

use crate::driver::Driver;

pub struct Identity(pub Arc<Driver>);

/// The capabilities of a driver in `mode`.
pub fn capabilities(mode: crate::driver::Mode) -> Vec<pb::Capability> {
    let cap = |t: Type| pb::Capability { r#type: Some(t) };
    let mut caps = Vec::new();
    if mode.controller() {
        caps.push(cap(Type::Service(capability::Service {
            r#type: capability::service::Type::ControllerService as i32,
        })));
        caps.push(cap(Type::ReclaimSpace(capability::ReclaimSpace {
            r#type: capability::reclaim_space::Type::Offline as i32,
        })));
    }
    if mode.node() {
        caps.push(cap(Type::Service(capability::Service { r#type: capability::service::Type::NodeService as i32 })));
        caps.push(cap(Type::ReclaimSpace(capability::ReclaimSpace {
            r#type: capability::reclaim_space::Type::Online as i32,
        })));
        caps.push(cap(Type::EncryptionKeyRotation(capability::EncryptionKeyRotation {
            r#type: capability::encryption_key_rotation::Type::Encryptionkeyrotation as i32,
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
