//! EncryptionKeyRotation: each volume has a key ID in the state; rotating replaces it. The key
//! material a caller may send is a secret and is neither stored nor logged.
use std::sync::Arc;

use api::proto::encryptionkeyrotation as pb;
use tonic::{Request, Response, Status};

use crate::driver::Driver;
use crate::volumes;

pub struct KeyRotation(pub Arc<Driver>);

#[tonic::async_trait]
impl pb::encryption_key_rotation_controller_server::EncryptionKeyRotationController for KeyRotation {
    async fn encryption_key_rotate(
        &self,
        request: Request<pb::EncryptionKeyRotateRequest>,
    ) -> Result<Response<pb::EncryptionKeyRotateResponse>, Status> {
        let request = request.into_inner();
        let volume = self.0.volume(&request.volume_id).await?;
        let _busy = self.0.begin(&volume.id)?;
        let new_key = volumes::new_id().map_err(|e| Status::internal(format!("generating a key ID: {e}")))?;
        self.0
            .update(|state| {
                let v = state
                    .volumes
                    .get_mut(&volume.id)
                    .ok_or_else(|| Status::not_found(format!("volume {} not found", volume.id)))?;
                v.key_id = Some(new_key);
                Ok(())
            })
            .await?;
        Ok(Response::new(pb::EncryptionKeyRotateResponse {}))
    }
}
