//! ControllerPublishVolume and ControllerUnpublishVolume: which nodes a volume is attached to.
//!
//! The driver's CSIDriver says `attachRequired: true`, so the attach-detach controller makes a
//! VolumeAttachment for every volume a Pod uses and csi-attacher turns it into these calls before the
//! kubelet stages the volume, as with network block storage. A volume with a single-node access mode
//! is attached to one node at a time; nodes are those whose node plugin has started against the same
//! state directory.
use std::collections::BTreeMap;
use std::sync::Arc;

use api::proto::csi::v1 as csi;
use csi::volume_capability::access_mode::Mode as AccessMode;
use tonic::Status;

use crate::driver::Driver;
use crate::state::{State, Volume};
use crate::volumes::validate_id;

/// The key of the publish context: the node the volume was attached to, which the kubelet hands
/// back to NodeStageVolume.
pub const ATTACHED_TO: &str = "reference.csi-addons-rs.io/attached-to";

/// Whether `mode` lets the volume be attached to more than one node at once.
fn multi_node(mode: i32) -> bool {
    matches!(
        AccessMode::try_from(mode),
        Ok(AccessMode::MultiNodeReaderOnly | AccessMode::MultiNodeSingleWriter | AccessMode::MultiNodeMultiWriter)
    )
}

/// What ControllerPublishVolume must do, decided from the state alone.
#[derive(Debug, PartialEq)]
enum Publish {
    /// Already attached there the same way: nothing to change.
    Already,
    Attach,
}

fn decide_publish(
    state: &State,
    volume: &Volume,
    request: &csi::ControllerPublishVolumeRequest,
) -> Result<Publish, Status> {
    if !state.nodes.contains(&request.node_id) {
        return Err(Status::not_found(format!("node {} has no node plugin of this driver", request.node_id)));
    }
    let capability =
        request.volume_capability.as_ref().ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    let mode = capability
        .access_mode
        .as_ref()
        .map(|m| m.mode)
        .ok_or_else(|| Status::invalid_argument("volume_capability needs an access_mode"))?;
    if let Some(&readonly) = volume.published_nodes.get(&request.node_id) {
        if readonly == request.readonly {
            return Ok(Publish::Already);
        }
        return Err(Status::already_exists(format!(
            "volume {} is attached to node {} with readonly={readonly}",
            volume.id, request.node_id
        )));
    }
    if !multi_node(mode)
        && let Some(other) = volume.published_nodes.keys().next()
    {
        return Err(Status::failed_precondition(format!(
            "volume {} is attached to node {other}, and its access mode allows one node",
            volume.id
        )));
    }
    Ok(Publish::Attach)
}

pub async fn publish(
    driver: &Arc<Driver>,
    request: csi::ControllerPublishVolumeRequest,
) -> Result<csi::ControllerPublishVolumeResponse, Status> {
    if request.volume_id.is_empty() {
        return Err(Status::invalid_argument("volume_id is required"));
    }
    if request.node_id.is_empty() {
        return Err(Status::invalid_argument("node_id is required"));
    }
    if request.volume_capability.is_none() {
        return Err(Status::invalid_argument("volume_capability is required"));
    }
    validate_id("volume_id", &request.volume_id).map_err(|_| not_found(&request.volume_id))?;
    let _busy = driver.begin(&request.volume_id)?;
    driver
        .update(|state| {
            let volume = state.volumes.get(&request.volume_id).ok_or_else(|| not_found(&request.volume_id))?;
            if decide_publish(state, volume, &request)? == Publish::Attach
                && let Some(volume) = state.volumes.get_mut(&request.volume_id)
            {
                volume.published_nodes.insert(request.node_id.clone(), request.readonly);
            }
            Ok(())
        })
        .await?;
    tracing::info!(volume = %request.volume_id, node = %request.node_id, "attached");
    Ok(csi::ControllerPublishVolumeResponse {
        publish_context: BTreeMap::from([(ATTACHED_TO.to_owned(), request.node_id)]).into_iter().collect(),
    })
}

/// Detaches; a volume or node this driver does not know is detached already (the spec's answer).
/// An empty node_id detaches from every node.
pub async fn unpublish(driver: &Arc<Driver>, request: csi::ControllerUnpublishVolumeRequest) -> Result<(), Status> {
    if request.volume_id.is_empty() {
        return Err(Status::invalid_argument("volume_id is required"));
    }
    if validate_id("volume_id", &request.volume_id).is_err() {
        return Ok(());
    }
    let _busy = driver.begin(&request.volume_id)?;
    driver
        .update(|state| {
            if let Some(volume) = state.volumes.get_mut(&request.volume_id) {
                if request.node_id.is_empty() {
                    volume.published_nodes.clear();
                } else {
                    volume.published_nodes.remove(&request.node_id);
                }
            }
            Ok(())
        })
        .await?;
    tracing::info!(volume = %request.volume_id, node = %request.node_id, "detached");
    Ok(())
}

fn not_found(id: &str) -> Status {
    Status::not_found(format!("volume {id} not found"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::AccessType;

    fn state_with_node(node: &str) -> State {
        let mut state = State::default();
        state.nodes.insert(node.to_owned());
        state
    }

    fn volume(published: &[(&str, bool)]) -> Volume {
        Volume {
            id: "v".into(),
            name: "v".into(),
            capacity_bytes: 1,
            access_type: AccessType::Mount,
            parameters: Default::default(),
            content_source: None,
            published_nodes: published.iter().map(|(n, r)| ((*n).to_owned(), *r)).collect(),
            key_id: None,
        }
    }

    fn request(node: &str, mode: AccessMode, readonly: bool) -> csi::ControllerPublishVolumeRequest {
        csi::ControllerPublishVolumeRequest {
            volume_id: "v".into(),
            node_id: node.into(),
            readonly,
            volume_capability: Some(csi::VolumeCapability {
                access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
                access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_without_a_node_plugin_is_not_found() {
        let state = state_with_node("a");
        let err = decide_publish(&state, &volume(&[]), &request("b", AccessMode::SingleNodeWriter, false)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
    }

    #[test]
    fn publishing_again_the_same_way_changes_nothing_and_another_way_is_refused() {
        let state = state_with_node("a");
        let attached = volume(&[("a", false)]);
        assert_eq!(
            decide_publish(&state, &attached, &request("a", AccessMode::SingleNodeWriter, false)).unwrap(),
            Publish::Already
        );
        let err = decide_publish(&state, &attached, &request("a", AccessMode::SingleNodeWriter, true)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::AlreadyExists);
    }

    #[test]
    fn single_node_volumes_attach_to_one_node_multi_node_ones_to_many() {
        let mut state = state_with_node("a");
        state.nodes.insert("b".into());
        let attached = volume(&[("a", false)]);
        let err = decide_publish(&state, &attached, &request("b", AccessMode::SingleNodeWriter, false)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert_eq!(
            decide_publish(&state, &attached, &request("b", AccessMode::MultiNodeMultiWriter, false)).unwrap(),
            Publish::Attach
        );
    }
}
