//! Snapshots (sparse copies of a volume's file) and volumes created from a snapshot or a volume.
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use api::proto::csi::v1 as csi;
use tonic::Status;

use crate::driver::Driver;
use crate::space;
use crate::state::Snapshot;
use crate::volumes::{self, validate_id, validate_name};

fn to_csi(snapshot: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        snapshot_id: snapshot.id.clone(),
        source_volume_id: snapshot.source_volume_id.clone(),
        size_bytes: snapshot.size_bytes,
        creation_time: Some(prost_types::Timestamp {
            seconds: snapshot.created_unix_ms.div_euclid(1000),
            nanos: i32::try_from(snapshot.created_unix_ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
        }),
        ready_to_use: true,
        ..Default::default()
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

pub async fn create(driver: &Arc<Driver>, request: csi::CreateSnapshotRequest) -> Result<csi::Snapshot, Status> {
    validate_name("name", &request.name)?;
    if request.source_volume_id.is_empty() {
        return Err(Status::invalid_argument("source_volume_id is required"));
    }
    let source = driver.volume(&request.source_volume_id).await?;
    let state = driver.snapshot().await;
    if let Some(existing) = state.snapshots.values().find(|s| s.name == request.name) {
        if existing.source_volume_id != source.id {
            return Err(Status::already_exists(format!("snapshot {:?} exists for another volume", request.name)));
        }
        return Ok(to_csi(existing));
    }
    let _busy = driver.begin(&source.id)?;
    let id = volumes::new_id().map_err(internal)?;
    let (from, to) = (driver.layout.volume_file(&source.id), driver.layout.snapshot_file(&id));
    tokio::task::spawn_blocking(move || space::sparse_copy(&from, &to)).await.map_err(internal)?.map_err(internal)?;
    let created_unix_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
    let snapshot = Snapshot {
        id,
        name: request.name,
        source_volume_id: source.id,
        size_bytes: source.capacity_bytes,
        created_unix_ms,
    };
    driver
        .update(|state| {
            state.snapshots.insert(snapshot.id.clone(), snapshot.clone());
            Ok(())
        })
        .await?;
    Ok(to_csi(&snapshot))
}

pub async fn delete(driver: &Arc<Driver>, id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("snapshot_id is required"));
    }
    if validate_id("snapshot_id", id).is_err() {
        return Ok(()); // not an ID this driver made: nothing to delete
    }
    let file = driver.layout.snapshot_file(id);
    driver
        .update(|state| {
            space::remove_data(&file).map_err(internal)?;
            state.snapshots.remove(id);
            Ok(())
        })
        .await
}

pub async fn list(
    driver: &Arc<Driver>,
    request: &csi::ListSnapshotsRequest,
) -> Result<csi::ListSnapshotsResponse, Status> {
    let state = driver.reload().await.map_err(internal)?;
    let matching: Vec<&Snapshot> = state
        .snapshots
        .values()
        .filter(|s| request.snapshot_id.is_empty() || s.id == request.snapshot_id)
        .filter(|s| request.source_volume_id.is_empty() || s.source_volume_id == request.source_volume_id)
        .collect();
    let (page, next_token) = crate::paging::page(&matching, &request.starting_token, request.max_entries)?;
    let entries = page.into_iter().map(|s| csi::list_snapshots_response::Entry { snapshot: Some(to_csi(s)) }).collect();
    Ok(csi::ListSnapshotsResponse { entries, next_token })
}

pub async fn get(driver: &Arc<Driver>, id: &str) -> Result<csi::Snapshot, Status> {
    validate_id("snapshot_id", id)?;
    let state = driver.reload().await.map_err(internal)?;
    state.snapshots.get(id).map(to_csi).ok_or_else(|| Status::not_found(format!("snapshot {id} not found")))
}

/// Where a new volume's initial data comes from: `snapshot:<id>` / `volume:<id>`, the file to
/// copy and its size; NOT_FOUND when the source does not exist.
pub async fn content_source(
    driver: &Arc<Driver>,
    source: Option<&csi::VolumeContentSource>,
) -> Result<Option<(String, std::path::PathBuf, i64)>, Status> {
    use csi::volume_content_source::Type;
    let Some(kind) = source.and_then(|s| s.r#type.as_ref()) else { return Ok(None) };
    let state = driver.reload().await.map_err(internal)?;
    match kind {
        Type::Snapshot(s) => {
            validate_id("snapshot_id", &s.snapshot_id)?;
            let snapshot = state
                .snapshots
                .get(&s.snapshot_id)
                .ok_or_else(|| Status::not_found(format!("snapshot {} not found", s.snapshot_id)))?;
            Ok(Some((
                format!("snapshot:{}", snapshot.id),
                driver.layout.snapshot_file(&snapshot.id),
                snapshot.size_bytes,
            )))
        }
        Type::Volume(v) => {
            validate_id("volume_id", &v.volume_id)?;
            let volume = state
                .volumes
                .get(&v.volume_id)
                .ok_or_else(|| Status::not_found(format!("volume {} not found", v.volume_id)))?;
            Ok(Some((format!("volume:{}", volume.id), driver.layout.volume_file(&volume.id), volume.capacity_bytes)))
        }
    }
}

/// The CSI form of a stored `snapshot:<id>` / `volume:<id>` source.
pub fn to_csi_source(source: &str) -> Option<csi::VolumeContentSource> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let r#type = match source.split_once(':')? {
        ("snapshot", id) => Type::Snapshot(SnapshotSource { snapshot_id: id.to_owned() }),
        ("volume", id) => Type::Volume(VolumeSource { volume_id: id.to_owned() }),
        _ => return None,
    };
    Some(csi::VolumeContentSource { r#type: Some(r#type) })
}
