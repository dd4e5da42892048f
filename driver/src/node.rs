//! CSI Node: stage = loop device (+ ext4 mounted at the staging path), publish = bind mount.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use api::proto::csi::v1 as csi;
use csi::node_service_capability::rpc::Type as Rpc;
use csi::volume_capability::AccessType as CapAccessType;
use tonic::{Request, Response, Status};

use crate::driver::Driver;
use crate::mounts::{self, MountError};
use crate::state::{AccessType, Volume};
use crate::volumes::validate_id;

pub struct Node(pub Arc<Driver>);

fn internal(e: MountError) -> Status {
    match e {
        // Not a fault of the call: this machine cannot serve the volume at all.
        MountError::LoopUnavailable(_) => Status::failed_precondition(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

fn required_path(what: &str, path: &str) -> Result<PathBuf, Status> {
    if path.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    let path = PathBuf::from(path);
    if !path.is_absolute() || path.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(Status::invalid_argument(format!("{what} must be an absolute path without `..`")));
    }
    Ok(path)
}

fn requested_access_type(capability: Option<&csi::VolumeCapability>) -> Result<AccessType, Status> {
    match capability.and_then(|c| c.access_type.as_ref()) {
        Some(CapAccessType::Mount(_)) => Ok(AccessType::Mount),
        Some(CapAccessType::Block(_)) => Ok(AccessType::Block),
        None if capability.is_none() => Err(Status::invalid_argument("volume_capability is required")),
        None => Err(Status::invalid_argument("volume_capability needs an access_type")),
    }
}

impl Node {
    async fn volume(&self, id: &str) -> Result<Volume, Status> {
        self.0.volume(id).await
    }

    /// The volume and the path a caller says it is at (NodeGetVolumeStats, NodeExpandVolume):
    /// INVALID_ARGUMENT when either is missing, NOT_FOUND when either does not exist. The path is
    /// only looked at, so any path is safe; one that is not absolute is not where the volume is.
    async fn volume_at(&self, id: &str, path: &str) -> Result<(Volume, PathBuf), Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if path.is_empty() {
            return Err(Status::invalid_argument("volume_path is required"));
        }
        let volume = self.volume(id).await?;
        let path = PathBuf::from(path);
        if !path.is_absolute() || !path.exists() {
            return Err(Status::not_found(format!("volume_path {} does not exist", path.display())));
        }
        Ok((volume, path))
    }

    fn file(&self, volume: &Volume) -> PathBuf {
        self.0.layout.volume_file(&volume.id)
    }
}

fn capability(rpc: Rpc) -> csi::NodeServiceCapability {
    csi::NodeServiceCapability {
        r#type: Some(csi::node_service_capability::Type::Rpc(csi::node_service_capability::Rpc { r#type: rpc as i32 })),
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for Node {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let staging = required_path("staging_target_path", &request.staging_target_path)?;
        let access_type = requested_access_type(request.volume_capability.as_ref())?;
        let volume = self.volume(&request.volume_id).await?;
        if volume.access_type != access_type {
            return Err(Status::invalid_argument(format!(
                "volume {} is {:?}, not {access_type:?}",
                volume.id, volume.access_type
            )));
        }
        let file = self.file(&volume);
        if file.is_dir() {
            // A directory volume (no loop devices here): staged by a bind mount.
            if !mounts::is_mount_point(&staging).map_err(internal)? {
                std::fs::create_dir_all(&staging)
                    .map_err(|source| internal(MountError::Io { action: "creating", path: staging.clone(), source }))?;
                mounts::bind(&file, &staging, false).map_err(internal)?;
            }
            return Ok(Response::new(csi::NodeStageVolumeResponse {}));
        }
        let device = mounts::attach(&file).map_err(internal)?;
        if access_type == AccessType::Mount && !mounts::is_mount_point(&staging).map_err(internal)? {
            mounts::format_if_blank(&device).map_err(internal)?;
            // The volume may have grown while unstaged (ControllerExpandVolume).
            mounts::grow_filesystem_offline(&device).map_err(internal)?;
            mounts::mount_filesystem(&device, &staging).map_err(internal)?;
        }
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let staging = required_path("staging_target_path", &request.staging_target_path)?;
        mounts::unmount(&staging).map_err(internal)?;
        if validate_id("volume_id", &request.volume_id).is_ok() {
            let file = self.0.layout.volume_file(&request.volume_id);
            if file.is_file() {
                mounts::detach(&file).map_err(internal)?;
            }
        }
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let target = required_path("target_path", &request.target_path)?;
        let staging = required_path("staging_target_path", &request.staging_target_path)?;
        let access_type = requested_access_type(request.volume_capability.as_ref())?;
        let volume = self.volume(&request.volume_id).await?;
        // `volume()` just reloaded the state from disk, so a fence set by the controller counts.
        if let Some(cidr) = crate::addons::fence::fenced_by(&self.0.snapshot().await, self.0.config.node_ip) {
            return Err(Status::failed_precondition(format!("this node is fenced off the storage by {cidr}")));
        }
        if mounts::is_mount_point(&target).map_err(internal)? {
            return Ok(Response::new(csi::NodePublishVolumeResponse {}));
        }
        let io = |action: &'static str| {
            let path = target.clone();
            move |source| internal(MountError::Io { action, path, source })
        };
        match access_type {
            AccessType::Mount => {
                if !mounts::is_mount_point(&staging).map_err(internal)? {
                    return Err(Status::failed_precondition(format!(
                        "volume {} is not staged at {}",
                        volume.id,
                        staging.display()
                    )));
                }
                std::fs::create_dir_all(&target).map_err(io("creating"))?;
                mounts::bind(&staging, &target, request.readonly).map_err(internal)?;
            }
            AccessType::Block => {
                let device = mounts::loop_devices_of(&self.file(&volume)).map_err(internal)?.into_iter().next();
                let device =
                    device.ok_or_else(|| Status::failed_precondition(format!("volume {} is not staged", volume.id)))?;
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(io("creating"))?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&target)
                    .map_err(io("creating"))?;
                mounts::bind(Path::new(&device), &target, request.readonly).map_err(internal)?;
            }
        }
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let target = required_path("target_path", &request.target_path)?;
        mounts::unmount(&target).map_err(internal)?;
        let removed = if target.is_dir() { std::fs::remove_dir(&target) } else { std::fs::remove_file(&target) };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(internal(MountError::Io { action: "removing", path: target, source: e }));
            }
            _ => {}
        }
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let request = request.into_inner();
        let (volume, path) = self.volume_at(&request.volume_id, &request.volume_path).await?;
        let file = self.file(&volume);
        let condition = match std::fs::metadata(&file) {
            Ok(_) => csi::VolumeCondition { abnormal: false, message: "volume is healthy".into() },
            Err(e) => csi::VolumeCondition {
                abnormal: true,
                message: format!("the volume's backing file is unreadable: {e}"),
            },
        };
        let usage = if volume.access_type == AccessType::Mount && mounts::is_mount_point(&path).map_err(internal)? {
            let u = mounts::usage(&path).map_err(internal)?;
            let unit = |unit: csi::volume_usage::Unit, total: u64, available: u64| csi::VolumeUsage {
                total: i64::try_from(total).unwrap_or(i64::MAX),
                available: i64::try_from(available).unwrap_or(i64::MAX),
                used: i64::try_from(total.saturating_sub(available)).unwrap_or(i64::MAX),
                unit: unit as i32,
            };
            vec![
                unit(csi::volume_usage::Unit::Bytes, u.total_bytes, u.available_bytes),
                unit(csi::volume_usage::Unit::Inodes, u.total_inodes, u.free_inodes),
            ]
        } else {
            vec![csi::VolumeUsage {
                total: volume.capacity_bytes,
                unit: csi::volume_usage::Unit::Bytes as i32,
                ..Default::default()
            }]
        };
        Ok(Response::new(csi::NodeGetVolumeStatsResponse { usage, volume_condition: Some(condition) }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let request = request.into_inner();
        let (volume, _) = self.volume_at(&request.volume_id, &request.volume_path).await?;
        let _busy = self.0.begin(&volume.id)?;
        let file = self.file(&volume);
        if file.is_dir() {
            // A directory has no size to grow.
            return Ok(Response::new(csi::NodeExpandVolumeResponse { capacity_bytes: volume.capacity_bytes }));
        }
        mounts::refresh_size(&file).map_err(internal)?;
        if volume.access_type == AccessType::Mount
            && let Some(device) = mounts::loop_devices_of(&file).map_err(internal)?.into_iter().next()
        {
            if mounts::mount_point_of(&device).map_err(internal)?.is_some() {
                mounts::grow_filesystem_online(&device).map_err(|e| {
                    Status::failed_precondition(format!(
                        "growing the mounted filesystem failed ({e}); it grows when the volume is next staged"
                    ))
                })?;
            } else {
                mounts::grow_filesystem_offline(&device).map_err(internal)?;
            }
        }
        Ok(Response::new(csi::NodeExpandVolumeResponse { capacity_bytes: volume.capacity_bytes }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [Rpc::StageUnstageVolume, Rpc::GetVolumeStats, Rpc::VolumeCondition, Rpc::ExpandVolume]
            .into_iter()
            .map(capability)
            .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.0.config.node_id.clone(),
            accessible_topology: self.0.topology().into_iter().next(),
            ..Default::default()
        }))
    }
}
