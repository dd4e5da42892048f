//! The CSI-Addons services, served on their own socket as drivers conventionally do.
use std::sync::Arc;

use api::proto::{
    encryptionkeyrotation, fence as fence_pb, identity as addons_identity, reclaimspace, replication as replication_pb,
    volumegroup,
};
use tonic::service::Routes;

use crate::driver::Driver;

pub mod fence;
mod group;
mod identity;
mod keyrotation;
mod reclaim;
pub mod replication;

/// Every CSI-Addons service this driver's mode offers.
pub fn routes(driver: &Arc<Driver>) -> Routes {
    let mut routes =
        Routes::new(addons_identity::identity_server::IdentityServer::new(identity::Identity(driver.clone())));
    if driver.config.mode.controller() {
        routes = routes
            .add_service(reclaimspace::reclaim_space_controller_server::ReclaimSpaceControllerServer::new(
                reclaim::Reclaim(driver.clone()),
            ))
            .add_service(fence_pb::fence_controller_server::FenceControllerServer::new(fence::Fence(driver.clone())))
            .add_service(volumegroup::controller_server::ControllerServer::new(group::Groups(driver.clone())))
            .add_service(replication_pb::controller_server::ControllerServer::new(replication::Replicator(
                driver.clone(),
            )));
    }
    if driver.config.mode.node() {
        routes = routes
            .add_service(reclaimspace::reclaim_space_node_server::ReclaimSpaceNodeServer::new(reclaim::Reclaim(driver.clone())))
            .add_service(
                encryptionkeyrotation::encryption_key_rotation_controller_server::EncryptionKeyRotationControllerServer::new(
                    keyrotation::KeyRotation(driver.clone()),
                ),
            );
    }
    routes
}
