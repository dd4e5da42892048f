//! The server the controller calls: upstream's six services (package `proto` plus the CSI-Addons
//! `identity.Identity`), each RPC resolved to a driver call. The controller sends PV names and
//! Secret references; the sidecar reads them with its own RBAC.
use std::sync::Arc;

pub use self::backend::{Backend, Leadership};

mod backend;
mod fence;
mod group;
mod identity;
mod keyrotation;
mod reclaim;
mod replication;

/// All six services, ready to serve.
pub fn routes(backend: Arc<Backend>) -> tonic::service::Routes {
    use api::proto::{identity as id, internal as pb};
    tonic::service::Routes::new(id::identity_server::IdentityServer::new(identity::Identity(backend.clone())))
        .add_service(pb::reclaim_space_server::ReclaimSpaceServer::new(reclaim::Reclaim(backend.clone())))
        .add_service(pb::network_fence_server::NetworkFenceServer::new(fence::Fence(backend.clone())))
        .add_service(pb::replication_server::ReplicationServer::new(replication::Replication(backend.clone())))
        .add_service(pb::volume_group_controller_server::VolumeGroupControllerServer::new(group::Groups(
            backend.clone(),
        )))
        .add_service(pb::encryption_key_rotation_server::EncryptionKeyRotationServer::new(keyrotation::KeyRotation(
            backend,
        )))
}
