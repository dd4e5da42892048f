//! The pure part of a VolumeGroupReplicationContent's reconcile: what to do with it, the driver's
//! words, and the status that lists the group's volumes and where they replicate to.
use std::collections::HashMap;

use api::replication::{VolumeGroupReplication, VolumeGroupReplicationContent};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::compact::CsiPv;
use crate::controllers::replication::{VGR_FINALIZER, VR_FINALIZER};
use crate::core::status::{condition, set_condition};

/// What a reconcile does with a content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing: deleted and already released, or its group still stands (only the group's
    /// deletion takes its content away).
    Leave,
    /// Its deletion waits: the group's VolumeReplication still holds it.
    InUse,
    /// Empty and delete the group at the driver, then release the content.
    Delete,
    /// Create the group at the driver, or bring its membership up to date.
    Ensure,
}

/// The step for `content`, owned by `group` (if it still exists).
pub fn step(content: &VolumeGroupReplicationContent, group: Option<&VolumeGroupReplication>) -> Step {
    if content.metadata.deletion_timestamp.is_none() {
        return Step::Ensure;
    }
    let holds = |finalizer: &str| content.finalizers().iter().any(|f| f == finalizer);
    if !holds(VGR_FINALIZER) || group.is_some_and(|g| g.metadata.deletion_timestamp.is_none()) {
        return Step::Leave;
    }
    if holds(VR_FINALIZER) { Step::InUse } else { Step::Delete }
}

/// A group already gone is as good as deleted.
pub fn not_found_is_done(status: tonic::Status) -> Result<(), tonic::Status> {
    if status.code() == tonic::Code::NotFound { Ok(()) } else { Err(status) }
}

/// The driver's words, with the code: what the content's `Ready` condition and the group show.
pub fn words(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// The content's conditions with `Ready` set.
pub fn with_ready(content: &VolumeGroupReplicationContent, ready: bool, reason: &str, message: &str) -> Vec<Condition> {
    let conditions = content.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    set_condition(conditions, condition("Ready", ready, reason, message, content.metadata.generation))
}

/// The PVs holding `volume_ids`: (PV name, volume handle), sorted by name.
pub fn volume_mapping(pvs: &[CsiPv], volume_ids: &[String]) -> Vec<(String, String)> {
    let mut mapping: Vec<(String, String)> = pvs
        .iter()
        .filter_map(|pv| {
            let handle = pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone();
            volume_ids.contains(&handle).then(|| (pv.name_any(), handle))
        })
        .collect();
    mapping.sort();
    mapping
}

/// What the driver says of the group's destination.
pub enum GroupDestination {
    /// The leader does not offer GetReplicationDestinationInfo, or there is no group yet.
    NotAsked,
    /// The sidecar lacks the call (upstream's v0.14.0).
    NotSupported,
    /// Not known yet (replication not running, or the driver failed): asked again later.
    Unknown,
    /// The destination group, and source volume handle → destination volume handle.
    Known { group: String, volumes: HashMap<String, String> },
}

/// The status of a ready content holding `mapping`, and whether it is settled: every volume's
/// destination known, or no destination to ask for. A destination group known before is kept
/// while the driver cannot say (a retry may yet).
pub fn ready_status(
    content: &VolumeGroupReplicationContent,
    mapping: &[(String, String)],
    destination: &GroupDestination,
) -> (Value, bool) {
    let (group_destination, volumes) = match destination {
        GroupDestination::Known { group, volumes } => (Some(group.clone()), Some(volumes)),
        _ => (None, None),
    };
    let destination_of = |handle: &str| volumes.and_then(|v| v.get(handle)).filter(|d| !d.is_empty());
    let conditions = with_ready(content, true, "Ready", "the volume group holds the listed volumes");
    let mut status = json!({
        "persistentVolumeRefList": mapping.iter().map(|(name, _)| json!({"name": name})).collect::<Vec<_>>(),
        "persistentVolumeMappingList": mapping.iter().map(|(name, handle)| {
            let mut entry = json!({"name": name, "volumeHandle": handle});
            if let Some(destination) = destination_of(handle) {
                entry["destinationVolumeHandle"] = json!(destination);
            }
            entry
        }).collect::<Vec<_>>(),
        "conditions": conditions,
    });
    let known_before = content.status.as_ref().and_then(|s| s.destination_volume_group_id.clone());
    if let Some(group) = group_destination.or(known_before) {
        status["destinationVolumeGroupID"] = json!(group);
    }
    let settled = match destination {
        GroupDestination::Known { .. } => mapping.iter().all(|(_, handle)| destination_of(handle).is_some()),
        GroupDestination::NotAsked | GroupDestination::NotSupported => true,
        GroupDestination::Unknown => false,
    };
    (status, settled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(finalizers: &[&str], deleting: bool) -> VolumeGroupReplicationContent {
        let mut content = VolumeGroupReplicationContent::new("c", Default::default());
        content.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        if deleting {
            content.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        content
    }

    #[test]
    fn only_the_groups_deletion_takes_its_content_away() {
        let mut group = VolumeGroupReplication::new("g", Default::default());
        assert_eq!(step(&content(&[VGR_FINALIZER], false), Some(&group)), Step::Ensure);
        assert_eq!(step(&content(&[VGR_FINALIZER], true), Some(&group)), Step::Leave, "the group stands");
        assert_eq!(step(&content(&[VGR_FINALIZER], true), None), Step::Delete);
        group.metadata.deletion_timestamp = content(&[], true).metadata.deletion_timestamp;
        assert_eq!(step(&content(&[VGR_FINALIZER], true), Some(&group)), Step::Delete);
        assert_eq!(step(&content(&[VGR_FINALIZER, VR_FINALIZER], true), None), Step::InUse);
        assert_eq!(step(&content(&[], true), None), Step::Leave, "already released");
    }

    #[test]
    fn the_status_lists_volumes_and_waits_for_every_destination() {
        let mapping = vec![("pv-a".to_owned(), "h-a".to_owned()), ("pv-b".to_owned(), "h-b".to_owned())];
        let partial = GroupDestination::Known {
            group: "dest-group".into(),
            volumes: [("h-a".to_owned(), "d-a".to_owned()), ("h-b".to_owned(), String::new())].into(),
        };
        let (status, settled) = ready_status(&content(&[], false), &mapping, &partial);
        assert!(!settled, "h-b's destination is not known yet");
        assert_eq!(status["destinationVolumeGroupID"], "dest-group");
        assert_eq!(status["persistentVolumeMappingList"][0]["destinationVolumeHandle"], "d-a");
        assert!(status["persistentVolumeMappingList"][1].get("destinationVolumeHandle").is_none());
        assert_eq!(status["persistentVolumeRefList"], json!([{"name": "pv-a"}, {"name": "pv-b"}]));
        assert_eq!(status["conditions"][0]["type"], "Ready");

        let mut known = content(&[], false);
        known.status = Some(serde_json::from_value(json!({"destinationVolumeGroupID": "earlier"})).unwrap());
        let (status, settled) = ready_status(&known, &mapping, &GroupDestination::Unknown);
        assert!(!settled);
        assert_eq!(status["destinationVolumeGroupID"], "earlier", "kept while the driver cannot say");
        assert!(ready_status(&known, &mapping, &GroupDestination::NotSupported).1);
    }

    #[test]
    fn a_group_already_gone_counts_as_deleted() {
        assert!(not_found_is_done(tonic::Status::not_found("gone")).is_ok());
        let failed = not_found_is_done(tonic::Status::internal("disk on fire")).unwrap_err();
        assert_eq!(words(&failed), "Internal: disk on fire");
    }
}
