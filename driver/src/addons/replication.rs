//! VolumeReplication: a primary's volumes are copied to a second "site" directory when replication
//! is enabled and then every `schedulingInterval`; last sync time, bytes and duration are reported.
//! Demoting stops the copies; resync (on a secondary) copies the site's data back.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use api::proto::replication as pb;
use pb::replication_source::Type as Source;
use tonic::{Request, Response, Status};

use crate::driver::Driver;
use crate::space;
use crate::state::{Replication, Role, State, SyncRecord};
use crate::volumes;

const DEFAULT_INTERVAL_SECS: u64 = 60;

pub struct Replicator(pub Arc<Driver>);

/// `volume/<id>` or `volumegroup/<id>`, from the request's source (or the deprecated volume_id).
fn source_key(source: Option<&pb::ReplicationSource>, deprecated_volume_id: &str) -> Result<String, Status> {
    let (kind, id) = match source.and_then(|s| s.r#type.as_ref()) {
        Some(Source::Volume(v)) => ("volume", v.volume_id.as_str()),
        Some(Source::Volumegroup(g)) => ("volumegroup", g.volume_group_id.as_str()),
        None if !deprecated_volume_id.is_empty() => ("volume", deprecated_volume_id),
        None => return Err(Status::invalid_argument("replication_source is required")),
    };
    volumes::validate_id("replication source ID", id)?;
    Ok(format!("{kind}/{id}"))
}

/// The volumes a source stands for, or NOT_FOUND.
fn source_volumes(state: &State, key: &str) -> Result<Vec<String>, Status> {
    match key.split_once('/') {
        Some(("volume", id)) if state.volumes.contains_key(id) => Ok(vec![id.to_owned()]),
        Some(("volumegroup", id)) => state
            .groups
            .get(id)
            .map(|g| g.volume_ids.clone())
            .ok_or_else(|| Status::not_found(format!("volume group {id} not found"))),
        _ => Err(Status::not_found(format!("replication source {key} not found"))),
    }
}

/// `30s`, `5m`, `1h` (or plain seconds).
fn parse_interval(text: &str) -> Result<u64, Status> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| Status::invalid_argument(format!("schedulingInterval {text:?} is not like 30s, 5m or 1h")))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(Status::invalid_argument(format!("schedulingInterval {text:?} is not like 30s, 5m or 1h"))),
    };
    if secs == 0 {
        return Err(Status::invalid_argument("schedulingInterval must be positive"));
    }
    Ok(secs)
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Replicator {
    fn site_file(&self, dest_id: &str) -> PathBuf {
        self.0.config.state_dir.join("site-b").join("volumes").join(format!("{dest_id}.img"))
    }

    /// Copies every volume of `key` to the site and records the sync.
    async fn sync(&self, key: &str) -> Result<(), Status> {
        let state = self.0.reload().await.map_err(|e| Status::internal(e.to_string()))?;
        let Some(replication) = state.replications.get(key) else { return Ok(()) };
        let pairs: Vec<(PathBuf, PathBuf)> = replication
            .destinations
            .iter()
            .map(|(src, dst)| (self.0.layout.volume_file(src), self.site_file(dst)))
            .collect();
        let started = Instant::now();
        let bytes = tokio::task::spawn_blocking(move || {
            pairs.iter().map(|(from, to)| space::sparse_copy(from, to)).sum::<std::io::Result<u64>>()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(format!("copying to the second site: {e}")))?;
        let record = SyncRecord {
            finished_unix_ms: unix_ms(SystemTime::now()),
            bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
            duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        };
        self.0
            .update(|state| {
                if let Some(r) = state.replications.get_mut(key) {
                    r.last_sync = Some(record);
                }
                Ok(())
            })
            .await
    }

    /// Syncs every primary replication whose interval has passed; runs until `stop`.
    pub async fn run_schedule(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let Ok(state) = self.0.reload().await else { continue };
            let now = unix_ms(SystemTime::now());
            for (key, r) in &state.replications {
                let due = r.last_sync.is_none_or(|s| {
                    now - s.finished_unix_ms >= i64::try_from(r.interval_secs * 1000).unwrap_or(i64::MAX)
                });
                if r.role == Role::Primary
                    && due
                    && let Err(e) = self.sync(key).await
                {
                    tracing::warn!(source = key, error = e.message(), "scheduled replication sync failed");
                }
            }
        }
    }

    /// Sets the role of an enabled replication (FAILED_PRECONDITION when not enabled).
    async fn set_role(&self, key: &str, role: Role) -> Result<(), Status> {
        self.0
            .update(|state| {
                let r = state
                    .replications
                    .get_mut(key)
                    .ok_or_else(|| Status::failed_precondition(format!("{key} is not replicated")))?;
                r.role = role;
                Ok(())
            })
            .await
    }
}

#[tonic::async_trait]
impl pb::controller_server::Controller for Replicator {
    async fn enable_volume_replication(
        &self,
        request: Request<pb::EnableVolumeReplicationRequest>,
    ) -> Result<Response<pb::EnableVolumeReplicationResponse>, Status> {
        let request = request.into_inner();
        #[allow(deprecated)]
        let key = source_key(request.replication_source.as_ref(), &request.volume_id)?;
        let interval =
            request.parameters.get("schedulingInterval").map_or(Ok(DEFAULT_INTERVAL_SECS), |t| parse_interval(t))?;
        let _busy = self.0.begin(&key)?;
        let new_id = || volumes::new_id().map_err(|e| Status::internal(format!("generating a replica ID: {e}")));
        let created = self
            .0
            .update(|state| {
                if state.replications.contains_key(&key) {
                    return Ok(false);
                }
                let destinations = source_volumes(state, &key)?
                    .into_iter()
                    .map(|id| Ok((id, new_id()?)))
                    .collect::<Result<BTreeMap<String, String>, Status>>()?;
                let destination_group_id = if key.starts_with("volumegroup/") { Some(new_id()?) } else { None };
                state.replications.insert(
                    key.clone(),
                    Replication {
                        role: Role::Primary,
                        interval_secs: interval,
                        destinations,
                        destination_group_id,
                        last_sync: None,
                    },
                );
                Ok(true)
            })
            .await?;
        if created {
            self.sync(&key).await?;
        }
        Ok(Response::new(pb::EnableVolumeReplicationResponse {}))
    }

    async fn disable_volume_replication(
        &self,
        request: Request<pb::DisableVolumeReplicationRequest>,
    ) -> Result<Response<pb::DisableVolumeReplicationResponse>, Status> {
        let request = request.into_inner();
        #[allow(deprecated)]
        let key = source_key(request.replication_source.as_ref(), &request.volume_id)?;
        let _busy = self.0.begin(&key)?;
        let removed = self.0.update(|state| Ok(state.replications.remove(&key))).await?;
        for dest in removed.iter().flat_map(|r| r.destinations.values()) {
            let _ = std::fs::remove_file(self.site_file(dest));
        }
        Ok(Response::new(pb::DisableVolumeReplicationResponse {}))
    }

    async fn promote_volume(
        &self,
        request: Request<pb::PromoteVolumeRequest>,
    ) -> Result<Response<pb::PromoteVolumeResponse>, Status> {
        let request = request.into_inner();
        #[allow(deprecated)]
        let key = source_key(request.replication_source.as_ref(), &request.volume_id)?;
        self.set_role(&key, Role::Primary).await?;
        Ok(Response::new(pb::PromoteVolumeResponse {}))
    }

    async fn demote_volume(
        &self,
        request: Request<pb::DemoteVolumeRequest>,
    ) -> Result<Response<pb::DemoteVolumeResponse>, Status> {
        let request = request.into_inner();
        #[allow(deprecated)]
        let key = source_key(request.replication_source.as_ref(), &request.volume_id)?;
        self.set_role(&key, Role::Secondary).await?;
        Ok(Response::new(pb::DemoteVolumeResponse {}))
    }

    async fn resync_volume(
        &self,
        request: Request<pb::ResyncVolumeRequest>,
    ) -> Result<Response<pb::ResyncVolumeResponse>, Status> {
        let request = request.into_inner();
        #[allow(deprecated)]
        let key = source_key(request.replication_source.as_ref(), &request.volume_id)?;
        let _busy = self.0.begin(&key)?;
        let state = self.0.reload().await.map_err(|e| Status::internal(e.to_string()))?;
        let r = state
            .replications
            .get(&key)
            .ok_or_else(|| Status::failed_precondition(format!("{key} is not replicated")))?;
        if r.role != Role::Secondary {
            return Err(Status::failed_precondition(format!("{key} is primary; only a secondary resyncs")));
        }
        let pairs: Vec<(PathBuf, PathBuf)> =
            r.destinations.iter().map(|(src, dst)| (self.site_file(dst), self.0.layout.volume_file(src))).collect();
        tokio::task::spawn_blocking(move || {
            pairs.iter().try_for_each(|(from, to)| space::sparse_copy(from, to).map(|_| ()))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(format!("copying from the second site: {e}")))?;
        Ok(Response::new(pb::ResyncVolumeResponse { ready: true }))
    }

    async fn get_volume_replication_info(
        &self,
        request: Request<pb::GetVolumeReplicationInfoRequest>,
    ) -> Result<Response<pb::GetVolumeReplicationInfoResponse>, Status> {
        let request = request.into_inner();
        #[allow(deprecated)]
        let key = source_key(request.replication_source.as_ref(), &request.volume_id)?;
        let state = self.0.reload().await.map_err(|e| Status::internal(e.to_string()))?;
        let r = state
            .replications
            .get(&key)
            .ok_or_else(|| Status::failed_precondition(format!("{key} is not replicated")))?;
        let sync = r.last_sync.ok_or_else(|| Status::failed_precondition(format!("{key} has not synced yet")))?;
        let millis = |ms: i64| (ms.div_euclid(1000), i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0));
        let (secs, nanos) = millis(sync.finished_unix_ms);
        let (dsecs, dnanos) = millis(sync.duration_ms);
        Ok(Response::new(pb::GetVolumeReplicationInfoResponse {
            last_sync_time: Some(prost_types::Timestamp { seconds: secs, nanos }),
            last_sync_duration: Some(prost_types::Duration { seconds: dsecs, nanos: dnanos }),
            last_sync_bytes: sync.bytes,
            status: pb::get_volume_replication_info_response::Status::Healthy as i32,
            status_message: format!("{:?}, last synced {} bytes", r.role, sync.bytes),
        }))
    }

    async fn get_replication_destination_info(
        &self,
        request: Request<pb::GetReplicationDestinationInfoRequest>,
    ) -> Result<Response<pb::GetReplicationDestinationInfoResponse>, Status> {
        let request = request.into_inner();
        let key = source_key(request.replication_source.as_ref(), "")?;
        let state = self.0.reload().await.map_err(|e| Status::internal(e.to_string()))?;
        let r = state.replications.get(&key).ok_or_else(|| Status::not_found(format!("{key} is not replicated")))?;
        if r.last_sync.is_none() {
            return Err(Status::unavailable(format!("{key} has no replica yet")));
        }
        use pb::replication_destination::{Type, VolumeDestination, VolumeGroupDestination};
        let destination = match &r.destination_group_id {
            Some(group) => Type::Volumegroup(VolumeGroupDestination {
                volume_group_id: group.clone(),
                volume_ids: r.destinations.clone().into_iter().collect(),
            }),
            None => Type::Volume(VolumeDestination {
                volume_id: r.destinations.values().next().cloned().unwrap_or_default(),
            }),
        };
        Ok(Response::new(pb::GetReplicationDestinationInfoResponse {
            replication_destination: Some(pb::ReplicationDestination { r#type: Some(destination) }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse_like_upstreams_examples() {
        assert_eq!(parse_interval("30s").unwrap(), 30);
        assert_eq!(parse_interval("5m").unwrap(), 300);
        assert_eq!(parse_interval("1h").unwrap(), 3600);
        assert_eq!(parse_interval("90").unwrap(), 90);
        for bad in ["", "0s", "5d", "m", "-1s"] {
            assert_eq!(parse_interval(bad).unwrap_err().code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
    }
}
