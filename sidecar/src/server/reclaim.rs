//! `proto.ReclaimSpace`. Controller side: the PV's handle, attributes and node-stage Secret.
//! Node side, better than upstream: `volume_path` is the kubelet's publish path of a Pod on this
//! node that uses the volume, and `staging_target_path` is sent only where the driver stages.
//! [differs: reclaim-paths]
use std::sync::Arc;

use api::proto::{internal as pb, reclaimspace as driver};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use tonic::{Request, Response, Status};

use super::backend::Backend;
use crate::resolve::{self, Volume};

pub struct Reclaim(pub Arc<Backend>);

fn usage(u: Option<driver::StorageConsumption>) -> Option<pb::StorageConsumption> {
    u.map(|u| pb::StorageConsumption { usage_bytes: u.usage_bytes })
}

/// Where the kubelet publishes `volume` for the Pod with `pod_uid`.
pub fn publish_path(kubelet_dir: &str, pod_uid: &str, volume: &Volume) -> String {
    let root = kubelet_dir.trim_end_matches('/');
    if volume.block {
        format!("{root}/plugins/kubernetes.io/csi/volumeDevices/publish/{}/{pod_uid}", volume.pv_name)
    } else {
        format!("{root}/pods/{pod_uid}/volumes/kubernetes.io~csi/{}/mount", volume.pv_name)
    }
}

/// The UID of a running Pod among `pods` that mounts `claim`. Pods are read as plain JSON:
/// deserializing whole Pods would put their large types in the binary for three fields.
pub fn pod_using_claim<'a>(pods: &'a [DynamicObject], claim: &str) -> Option<&'a str> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !matches!(p.data["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .find(|p| {
            let volumes = p.data["spec"]["volumes"].as_array();
            volumes.into_iter().flatten().any(|v| v["persistentVolumeClaim"]["claimName"].as_str() == Some(claim))
        })
        .and_then(|p| p.metadata.uid.as_deref())
}

impl Reclaim {
    /// The publish path, or empty (as upstream) when no Pod here uses the volume or Pods cannot
    /// be listed.
    async fn volume_path(&self, volume: &Volume) -> String {
        let b = &self.0;
        let Some((namespace, claim)) = &volume.claim else { return String::new() };
        if b.node_id.is_empty() {
            return String::new();
        }
        let params = ListParams::default().fields(&format!("spec.nodeName={}", b.node_id));
        let pods = ApiResource::erase::<Pod>(&());
        match Api::<DynamicObject>::namespaced_with(b.kube.clone(), namespace, &pods).list(&params).await {
            Ok(pods) => pod_using_claim(&pods.items, claim)
                .map(|uid| publish_path(&b.kubelet_dir, uid, volume))
                .unwrap_or_default(),
            Err(e) => {
                tracing::debug!(error = %e, "listing Pods for the publish path failed; sending none");
                String::new()
            }
        }
    }
}

#[tonic::async_trait]
impl pb::reclaim_space_server::ReclaimSpace for Reclaim {
    async fn controller_reclaim_space(
        &self,
        request: Request<pb::ReclaimSpaceRequest>,
    ) -> Result<Response<pb::ReclaimSpaceResponse>, Status> {
        let b = &self.0;
        b.leadership.require()?;
        let volume = b.volume(&request.get_ref().pv_name).await?;
        let request = driver::ControllerReclaimSpaceRequest {
            volume_id: volume.handle.clone(),
            parameters: volume.attributes.clone(),
            secrets: b.stage_secret(&volume).await?,
        };
        let result = driver::reclaim_space_controller_client::ReclaimSpaceControllerClient::new(b.driver.clone())
            .controller_reclaim_space(request)
            .await;
        let r = b.driver_result("ControllerReclaimSpace", result)?;
        Ok(Response::new(pb::ReclaimSpaceResponse { pre_usage: usage(r.pre_usage), post_usage: usage(r.post_usage) }))
    }

    async fn node_reclaim_space(
        &self,
        request: Request<pb::ReclaimSpaceRequest>,
    ) -> Result<Response<pb::ReclaimSpaceResponse>, Status> {
        let b = &self.0;
        let volume = b.volume(&request.get_ref().pv_name).await?;
        let staging_target_path =
            if b.driver_stages().await { resolve::staging_path(&b.staging_root, &volume) } else { String::new() };
        let request = driver::NodeReclaimSpaceRequest {
            volume_id: volume.handle.clone(),
            volume_path: self.volume_path(&volume).await,
            staging_target_path,
            volume_capability: Some(resolve::capability(&volume)),
            secrets: b.stage_secret(&volume).await?,
        };
        let result = driver::reclaim_space_node_client::ReclaimSpaceNodeClient::new(b.driver.clone())
            .node_reclaim_space(request)
            .await;
        let r = b.driver_result("NodeReclaimSpace", result)?;
        Ok(Response::new(pb::ReclaimSpaceResponse { pre_usage: usage(r.pre_usage), post_usage: usage(r.post_usage) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(block: bool) -> Volume {
        Volume {
            pv_name: "pv-1".into(),
            driver: "d".into(),
            handle: "h".into(),
            attributes: Default::default(),
            node_stage_secret: None,
            block,
            access_modes: vec![],
            claim: Some(("ns".into(), "data".into())),
        }
    }

    #[test]
    fn publish_paths_follow_the_kubelet() {
        assert_eq!(
            publish_path("/var/lib/kubelet/", "uid-1", &volume(false)),
            "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount"
        );
        assert_eq!(
            publish_path("/var/lib/kubelet", "uid-1", &volume(true)),
            "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/uid-1"
        );
    }

    #[test]
    fn the_pod_is_found_by_its_claim() {
        let pod: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "uid": "uid-7"},
            "spec": {"containers": [], "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}
        }))
        .unwrap();
        let finished: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "q", "uid": "uid-8"},
            "spec": {"containers": [], "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]},
            "status": {"phase": "Succeeded"}
        }))
        .unwrap();
        assert_eq!(pod_using_claim(&[finished.clone(), pod], "data"), Some("uid-7"));
        assert_eq!(pod_using_claim(&[finished], "data"), None);
    }
}
