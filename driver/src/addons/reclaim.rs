//! ReclaimSpace: release the blocks a volume no longer uses, and report allocated bytes before and
//! after (measured on the backing file, so `pre - post` is exactly what the host got back).
use std::path::{Path, PathBuf};
use std::sync::Arc;

use api::proto::reclaimspace as pb;
use tonic::{Request, Response, Status};

use crate::driver::Driver;
use crate::mounts;
use crate::space;
use crate::state::{AccessType, Volume};

pub struct Reclaim(pub Arc<Driver>);

/// A failure on the machine: RESOURCE_EXHAUSTED when the driver's filesystem is full (reclaiming
/// mounts through a directory it creates there), INTERNAL otherwise.
fn internal(e: impl std::error::Error + 'static) -> Status {
    space::failure_status(e)
}

/// Runs `reclaim` on a blocking thread and measures the backing file around it.
async fn measured(
    file: PathBuf,
    reclaim: impl FnOnce(&Path) -> Result<(), Status> + Send + 'static,
) -> Result<(i64, i64), Status> {
    tokio::task::spawn_blocking(move || {
        let pre = space::allocated_bytes(&file).map_err(internal)?;
        reclaim(&file)?;
        let post = space::allocated_bytes(&file).map_err(internal)?;
        Ok((pre, post))
    })
    .await
    .map_err(internal)?
}

fn usage(bytes: i64) -> Option<pb::StorageConsumption> {
    Some(pb::StorageConsumption { usage_bytes: bytes })
}

/// Offline reclaim: trim through the mount if the volume is mounted here, else through a private
/// mount; raw block and never-formatted volumes get their zeroed ranges punched out.
fn reclaim_offline(volume: &Volume, scratch: &Path, file: &Path) -> Result<(), Status> {
    if volume.access_type == AccessType::Block {
        return space::punch_zero_ranges(file).map_err(internal);
    }
    let attached = mounts::loop_devices_of(file).map_err(internal)?.into_iter().next();
    if let Some(device) = &attached
        && let Some(mount_point) = mounts::mount_point_of(device).map_err(internal)?
    {
        return space::fstrim(&mount_point).map_err(internal);
    }
    let device = match attached {
        Some(d) => d,
        None => mounts::attach(file).map_err(internal)?,
    };
    let result = if mounts::has_filesystem(&device) {
        let target = scratch.join(&volume.id);
        mounts::mount_filesystem(&device, &target)
            .and_then(|()| {
                let trimmed = space::fstrim(&target);
                mounts::unmount(&target)?;
                trimmed
            })
            .map_err(internal)
            .map(|()| {
                let _ = std::fs::remove_dir(&target);
            })
    } else {
        space::punch_zero_ranges(file).map_err(internal)
    };
    mounts::detach(file).map_err(internal)?;
    result
}

#[tonic::async_trait]
impl pb::reclaim_space_controller_server::ReclaimSpaceController for Reclaim {
    async fn controller_reclaim_space(
        &self,
        request: Request<pb::ControllerReclaimSpaceRequest>,
    ) -> Result<Response<pb::ControllerReclaimSpaceResponse>, Status> {
        let request = request.into_inner();
        // One line per call: the fault suite counts them to find operations run twice.
        tracing::info!(volume = %request.volume_id, "ControllerReclaimSpace");
        let volume = self.0.volume(&request.volume_id).await?;
        let _busy = self.0.begin(&volume.id)?;
        let file = self.0.layout.volume_file(&volume.id);
        let scratch = self.0.config.state_dir.join("reclaim");
        let (pre, post) = measured(file, move |file| {
            // A directory volume holds only its files' blocks: nothing is left to release.
            if file.is_dir() { Ok(()) } else { reclaim_offline(&volume, &scratch, file) }
        })
        .await?;
        Ok(Response::new(pb::ControllerReclaimSpaceResponse { pre_usage: usage(pre), post_usage: usage(post) }))
    }
}

#[tonic::async_trait]
impl pb::reclaim_space_node_server::ReclaimSpaceNode for Reclaim {
    async fn node_reclaim_space(
        &self,
        request: Request<pb::NodeReclaimSpaceRequest>,
    ) -> Result<Response<pb::NodeReclaimSpaceResponse>, Status> {
        let request = request.into_inner();
        tracing::info!(volume = %request.volume_id, "NodeReclaimSpace");
        let volume = self.0.volume(&request.volume_id).await?;
        let _busy = self.0.begin(&volume.id)?;
        let file = self.0.layout.volume_file(&volume.id);
        // The paths are hints (upstream's sidecar sends an empty volume_path and a computed staging
        // path): use the first that is a mount, else wherever the volume's device is mounted.
        let hints: Vec<PathBuf> = [request.volume_path, request.staging_target_path]
            .into_iter()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        let block = volume.access_type == AccessType::Block;
        let (pre, post) = measured(file, move |file| {
            if file.is_dir() {
                return Ok(()); // a directory volume: nothing to release (see above)
            }
            if block {
                return space::punch_zero_ranges(file).map_err(internal);
            }
            let mut mount_point = None;
            for hint in &hints {
                if mounts::is_mount_point(hint).map_err(internal)? {
                    mount_point = Some(hint.clone());
                    break;
                }
            }
            if mount_point.is_none()
                && let Some(device) = mounts::loop_devices_of(file).map_err(internal)?.into_iter().next()
            {
                mount_point = mounts::mount_point_of(&device).map_err(internal)?;
            }
            let mount_point =
                mount_point.ok_or_else(|| Status::failed_precondition("the volume is not mounted on this node"))?;
            space::fstrim(&mount_point).map_err(internal)
        })
        .await?;
        Ok(Response::new(pb::NodeReclaimSpaceResponse { pre_usage: usage(pre), post_usage: usage(post) }))
    }
}
