//! CSI Controller: volumes as sparse files under the state directory.
use std::sync::Arc;

use api::proto::csi::v1 as csi;
use csi::controller_service_capability::rpc::Type as Rpc;
use csi::volume_capability::AccessType as CapAccessType;
use tonic::{Request, Response, Status};

use crate::driver::Driver;
use crate::state::{AccessType, Volume};
use crate::volumes::{self, validate_id, validate_name};

/// Size of a volume whose request names none.
const DEFAULT_VOLUME_BYTES: i64 = 1 << 30;

/// StorageClass parameters added by Kubernetes components rather than by users; accepted and ignored.
const FOREIGN_PARAMETER_PREFIXES: &[&str] = &["csi.storage.k8s.io/"];

pub struct Controller(pub Arc<Driver>);

/// The one access type all capabilities ask for, or why they cannot be served.
fn access_type(capabilities: &[csi::VolumeCapability]) -> Result<AccessType, Status> {
    if capabilities.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities are required"));
    }
    let mut found = None;
    for capability in capabilities {
        if capability.access_mode.is_none() {
            return Err(Status::invalid_argument("every volume capability needs an access_mode"));
        }
        let this = match capability.access_type {
            Some(CapAccessType::Mount(_)) => AccessType::Mount,
            Some(CapAccessType::Block(_)) => AccessType::Block,
            None => {
                return Err(Status::invalid_argument("every volume capability needs an access_type (mount or block)"));
            }
        };
        if found.is_some_and(|f| f != this) {
            return Err(Status::invalid_argument("a volume cannot be both mount and block"));
        }
        found = Some(this);
    }
    found.ok_or_else(|| Status::invalid_argument("volume_capabilities are required"))
}

/// The size to create: at least the required bytes (or the default), at most the limit.
fn volume_bytes(range: Option<&csi::CapacityRange>) -> Result<i64, Status> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(Status::out_of_range("capacity_range bytes must not be negative"));
    }
    if limit > 0 && required > limit {
        return Err(Status::out_of_range(format!("required_bytes {required} exceeds limit_bytes {limit}")));
    }
    let bytes = if required > 0 { required } else { DEFAULT_VOLUME_BYTES };
    Ok(if limit > 0 { bytes.min(limit) } else { bytes })
}

fn check_parameters(parameters: &std::collections::HashMap<String, String>) -> Result<(), Status> {
    let unknown: Vec<&String> = parameters
        .keys()
        .filter(|k| *k != crate::profiles::PARAMETER && !FOREIGN_PARAMETER_PREFIXES.iter().any(|p| k.starts_with(p)))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!("unknown StorageClass parameters: {unknown:?}")))
    }
}

pub fn to_csi(volume: &Volume) -> csi::Volume {
    csi::Volume {
        volume_id: volume.id.clone(),
        capacity_bytes: volume.capacity_bytes,
        content_source: volume.content_source.as_deref().and_then(crate::snapshots::to_csi_source),
        ..Default::default()
    }
}

fn capability(rpc: Rpc) -> csi::ControllerServiceCapability {
    csi::ControllerServiceCapability {
        r#type: Some(csi::controller_service_capability::Type::Rpc(csi::controller_service_capability::Rpc {
            r#type: rpc as i32,
        })),
    }
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Controller {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        validate_name("name", &request.name)?;
        let access_type = access_type(&request.volume_capabilities)?;
        let bytes = volume_bytes(request.capacity_range.as_ref())?;
        check_parameters(&request.parameters)?;
        let profile = request.parameters.get(crate::profiles::PARAMETER).map(String::as_str);
        crate::profiles::check(profile, access_type, self.0.config.directories)?;
        let source = crate::snapshots::content_source(&self.0, request.volume_content_source.as_ref()).await?;
        // A volume made from a snapshot or a volume is at least as large as its source.
        let bytes = match &source {
            Some((_, _, source_bytes)) if *source_bytes > bytes => {
                if request.capacity_range.as_ref().is_some_and(|r| r.limit_bytes > 0 && r.limit_bytes < *source_bytes) {
                    return Err(Status::out_of_range(format!(
                        "the source holds {source_bytes} bytes, more than limit_bytes"
                    )));
                }
                *source_bytes
            }
            _ => bytes,
        };
        let new_id = volumes::new_id().map_err(|e| Status::internal(format!("generating a volume ID: {e}")))?;
        let total = self.0.config.capacity_bytes;
        let layout = self.0.layout.clone();
        let volume = self
            .0
            .update(|state| {
                if let Some(existing) = state.volume_by_name(&request.name) {
                    let fits = existing.capacity_bytes >= bytes
                        && request
                            .capacity_range
                            .as_ref()
                            .is_none_or(|r| r.limit_bytes == 0 || existing.capacity_bytes <= r.limit_bytes);
                    let same_source = existing.content_source.as_deref() == source.as_ref().map(|(s, _, _)| s.as_str());
                    if !fits || existing.access_type != access_type || !same_source {
                        return Err(Status::already_exists(format!(
                            "volume {:?} exists with {} bytes ({:?}), incompatible with this request",
                            request.name, existing.capacity_bytes, existing.access_type
                        )));
                    }
                    return Ok(existing.clone());
                }
                if state.allocated_bytes() + bytes > total {
                    return Err(Status::resource_exhausted(format!(
                        "{bytes} bytes requested, {} of {total} free",
                        total - state.allocated_bytes()
                    )));
                }
                let volume = Volume {
                    id: new_id,
                    name: request.name.clone(),
                    capacity_bytes: bytes,
                    access_type,
                    parameters: request.parameters.clone().into_iter().collect(),
                    content_source: source.as_ref().map(|(s, _, _)| s.clone()),
                    published_nodes: Default::default(),
                    key_id: None,
                };
                // The file first: state that names a volume always has its data.
                if let Some((_, source_file, _)) = &source {
                    crate::space::sparse_copy(source_file, &layout.volume_file(&volume.id))
                        .map_err(|e| Status::internal(format!("copying the volume's source: {e}")))?;
                }
                layout
                    .create_volume_file(&volume.id, bytes.unsigned_abs(), access_type == AccessType::Mount)
                    .map_err(|e| Status::internal(format!("creating the volume's file: {e}")))?;
                state.volumes.insert(volume.id.clone(), volume.clone());
                Ok(volume)
            })
            .await?;
        let mut volume = to_csi(&volume);
        volume.accessible_topology = self.0.topology();
        Ok(Response::new(csi::CreateVolumeResponse { volume: Some(volume) }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let id = request.into_inner().volume_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if validate_id("volume_id", &id).is_err() {
            // Not an ID this driver could have made: nothing to delete.
            return Ok(Response::new(csi::DeleteVolumeResponse {}));
        }
        let layout = self.0.layout.clone();
        self.0
            .update(|state| {
                if let Some(node) = state.volumes.get(&id).and_then(|v| v.published_nodes.keys().next()) {
                    return Err(Status::failed_precondition(format!(
                        "volume {id} is attached to node {node}; detach it (ControllerUnpublishVolume) first"
                    )));
                }
                if let Some(group) = state.groups.values().find(|g| g.volume_ids.contains(&id)) {
                    return Err(Status::failed_precondition(format!(
                        "volume {id} is in volume group {}; remove it from the group first",
                        group.id
                    )));
                }
                layout
                    .remove_volume_file(&id)
                    .map_err(|e| Status::internal(format!("removing the volume's file: {e}")))?;
                state.volumes.remove(&id);
                Ok(())
            })
            .await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let request = request.into_inner();
        validate_id("volume_id", &request.volume_id)?;
        let wanted = access_type(&request.volume_capabilities)?;
        let state = self.0.snapshot().await;
        let volume = state
            .volumes
            .get(&request.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} not found", request.volume_id)))?;
        let confirmed = (volume.access_type == wanted).then(|| csi::validate_volume_capabilities_response::Confirmed {
            volume_context: request.volume_context,
            volume_capabilities: request.volume_capabilities,
            parameters: request.parameters,
            mutable_parameters: Default::default(),
        });
        let message = if confirmed.is_some() { String::new() } else { format!("volume is {:?}", volume.access_type) };
        Ok(Response::new(csi::ValidateVolumeCapabilitiesResponse { confirmed, message }))
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let request = request.into_inner();
        let state = self.0.snapshot().await;
        let volumes: Vec<&Volume> = state.volumes.values().collect();
        let (page, next_token) = crate::paging::page(&volumes, &request.starting_token, request.max_entries)?;
        let entries = page
            .into_iter()
            .map(|v| csi::list_volumes_response::Entry { volume: Some(to_csi(v)), status: None })
            .collect();
        Ok(Response::new(csi::ListVolumesResponse { entries, next_token }))
    }

    async fn get_capacity(
        &self,
        _: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let allocated = self.0.snapshot().await.allocated_bytes();
        let available = (self.0.config.capacity_bytes - allocated).max(0);
        Ok(Response::new(csi::GetCapacityResponse { available_capacity: available, ..Default::default() }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            Rpc::CreateDeleteVolume,
            Rpc::PublishUnpublishVolume,
            Rpc::ListVolumes,
            Rpc::GetCapacity,
            Rpc::CreateDeleteSnapshot,
            Rpc::ListSnapshots,
            // GetSnapshot is served but not advertised: csi-sanity v5.4.0 rejects capability
            // values newer than it knows.
            Rpc::CloneVolume,
            Rpc::ExpandVolume,
        ]
        .into_iter()
        .map(capability)
        .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let range = request.capacity_range.ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let wanted = volume_bytes(Some(&range))?;
        let volume = self.0.volume(&request.volume_id).await?;
        let _busy = self.0.begin(&volume.id)?;
        let (total, layout) = (self.0.config.capacity_bytes, self.0.layout.clone());
        let grown = self
            .0
            .update(|state| {
                let others = state.allocated_bytes() - volume.capacity_bytes;
                let v = state
                    .volumes
                    .get_mut(&volume.id)
                    .ok_or_else(|| Status::not_found(format!("volume {} not found", volume.id)))?;
                if wanted <= v.capacity_bytes {
                    return Ok(v.clone()); // never shrink; already large enough
                }
                if others + wanted > total {
                    return Err(Status::resource_exhausted(format!(
                        "{wanted} bytes do not fit in {} free",
                        total - others
                    )));
                }
                layout
                    .create_volume_file(&v.id, wanted.unsigned_abs(), v.access_type == AccessType::Mount)
                    .map_err(|e| Status::internal(format!("growing the volume's file: {e}")))?;
                v.capacity_bytes = wanted;
                Ok(v.clone())
            })
            .await?;
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: grown.capacity_bytes,
            node_expansion_required: grown.access_type == AccessType::Mount,
        }))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        Ok(Response::new(crate::attach::publish(&self.0, request.into_inner()).await?))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        crate::attach::unpublish(&self.0, request.into_inner()).await?;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let snapshot = crate::snapshots::create(&self.0, request.into_inner()).await?;
        Ok(Response::new(csi::CreateSnapshotResponse { snapshot: Some(snapshot) }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        crate::snapshots::delete(&self.0, &request.into_inner().snapshot_id).await?;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        Ok(Response::new(crate::snapshots::list(&self.0, &request.into_inner()).await?))
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        let snapshot = crate::snapshots::get(&self.0, &request.into_inner().snapshot_id).await?;
        Ok(Response::new(csi::GetSnapshotResponse { snapshot: Some(snapshot) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_honour_required_limit_and_default() {
        let range = |required_bytes, limit_bytes| csi::CapacityRange { required_bytes, limit_bytes };
        assert_eq!(volume_bytes(None).unwrap(), DEFAULT_VOLUME_BYTES);
        assert_eq!(volume_bytes(Some(&range(10, 0))).unwrap(), 10);
        assert_eq!(volume_bytes(Some(&range(0, 100))).unwrap(), 100);
        assert_eq!(volume_bytes(Some(&range(200, 100))).unwrap_err().code(), tonic::Code::OutOfRange);
        assert_eq!(volume_bytes(Some(&range(-1, 0))).unwrap_err().code(), tonic::Code::OutOfRange);
    }

    #[test]
    fn parameters_from_kubernetes_components_are_accepted_unknown_ones_are_not() {
        let params = |k: &str| std::collections::HashMap::from([(k.to_owned(), "x".to_owned())]);
        check_parameters(&params("csi.storage.k8s.io/pvc/name")).unwrap();
        assert_eq!(check_parameters(&params("replicas")).unwrap_err().code(), tonic::Code::InvalidArgument);
    }
}
