//! `proto.EncryptionKeyRotation`: the PV's handle, attributes and node-stage Secret, with a
//! complete volume capability (upstream sends one without an access type, invalid in CSI).
//! [differs: key-rotation-capability]
//! Served on every replica, leader or not.
use std::sync::Arc;

use api::proto::{encryptionkeyrotation as driver, internal as pb};
use tonic::{Request, Response, Status};

use super::backend::Backend;
use crate::resolve;

pub struct KeyRotation(pub Arc<Backend>);

#[tonic::async_trait]
impl pb::encryption_key_rotation_server::EncryptionKeyRotation for KeyRotation {
    async fn encryption_key_rotate(
        &self,
        request: Request<pb::EncryptionKeyRotateRequest>,
    ) -> Result<Response<pb::EncryptionKeyRotateResponse>, Status> {
        // Served without the Lease: the manager sends it to the volume's node when it is attached.
        let b = &self.0;
        let volume = b.volume(&request.get_ref().pv_name).await?;
        let request = driver::EncryptionKeyRotateRequest {
            volume_id: volume.handle.clone(),
            parameters: volume.attributes.clone(),
            secrets: b.stage_secret(&volume).await?,
            volume_capability: Some(resolve::capability(&volume)),
            ..Default::default()
        };
        let result = driver::encryption_key_rotation_controller_client::EncryptionKeyRotationControllerClient::new(
            b.driver.clone(),
        )
        .encryption_key_rotate(request)
        .await;
        b.driver_result("EncryptionKeyRotate", result)?;
        Ok(Response::new(pb::EncryptionKeyRotateResponse {}))
    }
}
