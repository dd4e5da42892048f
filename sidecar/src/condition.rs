//! The volume-condition reporter (`--enable-volume-condition`): every interval, asks the driver's
//! CSI socket (`--csi-address`) for the condition of each of its volumes attached to this node and
//! records changes in the log, as PVC events, and as a PVC annotation. Unlike upstream, a failed
//! listing is retried at the next tick instead of ending the process (upstream's sidecar exits).
//! [differs: condition-retry]
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use api::proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::watch;

/// Annotation prefix on PVCs; the suffix is the node's UID.
pub const HEALTH_ANNOTATION: &str = "csiaddons.openshift.io/volumehealth";

/// Where conditions go (`--volume-condition-recorders`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecorderKind {
    Log,
    PvcEvent,
    PvcAnnotation,
}

/// An unknown recorder name, as a start-up error (upstream treats it as fatal too).
#[derive(Debug, thiserror::Error)]
#[error("--volume-condition-recorders: unknown recorder {0:?} (known: log, pvcEvent, pvcAnnotation)")]
pub struct UnknownRecorder(pub String);

impl RecorderKind {
    pub fn parse_list(names: &[String]) -> Result<Vec<RecorderKind>, UnknownRecorder> {
        let mut kinds = Vec::new();
        for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            let kind = match name {
                "log" => RecorderKind::Log,
                "pvcEvent" => RecorderKind::PvcEvent,
                "pvcAnnotation" => RecorderKind::PvcAnnotation,
                other => return Err(UnknownRecorder(other.to_owned())),
            };
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Ok(kinds)
    }
}

/// A volume's condition as last reported, and since when it has been so.
#[derive(Debug, Clone, PartialEq)]
pub struct Reported {
    pub abnormal: bool,
    pub message: String,
    pub since: String,
}

/// The annotation's `state` for a condition, in upstream's words (its readers compare them).
pub fn state_name(abnormal: bool) -> &'static str {
    if abnormal { "unhealthy" } else { "healthy" }
}

/// The `since` of an annotation value written earlier, if it says the same `state`: a restarted
/// sidecar carries on from it, as upstream's does, rather than start the condition's time again.
/// A value that is not such JSON gives none. `abnormal`, which this project's first releases
/// wrote, counts as `unhealthy`.
pub fn since_in_annotation(value: Option<&str>, state: &str) -> Option<String> {
    let earlier: serde_json::Value = serde_json::from_str(value?).ok()?;
    let earlier_state = match earlier.get("state")?.as_str()? {
        "abnormal" => "unhealthy",
        other => other,
    };
    if earlier_state != state {
        return None;
    }
    earlier.get("since")?.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// The handles of `driver`'s volumes in the Node's `status.volumesAttached`
/// (`kubernetes.io/csi/<driver>^<handle>`).
/// The Node is read as plain JSON: its full type is large and only this list is needed.
pub fn attached_handles(node: &DynamicObject, driver: &str) -> Vec<String> {
    let prefix = format!("kubernetes.io/csi/{driver}^");
    let attached = node.data["status"]["volumesAttached"].as_array();
    let mut handles: Vec<String> = attached
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str()?.strip_prefix(&prefix).map(str::to_owned))
        .collect();
    handles.sort();
    handles.dedup();
    handles
}

/// A volume published by the kubelet: its mount path and PV name.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub path: PathBuf,
    pub pv_name: String,
}

/// Scans `<kubelet>/pods/*/volumes/kubernetes.io~csi/*/vol_data.json` for `driver`'s volumes:
/// handle → where it is published. Unreadable entries are skipped.
pub fn published_volumes(kubelet_dir: &Path, driver: &str) -> HashMap<String, Published> {
    let mut found = HashMap::new();
    let Ok(pods) = std::fs::read_dir(kubelet_dir.join("pods")) else { return found };
    for pod in pods.flatten() {
        let Ok(volumes) = std::fs::read_dir(pod.path().join("volumes").join("kubernetes.io~csi")) else { continue };
        for volume in volumes.flatten() {
            let Ok(text) = std::fs::read_to_string(volume.path().join("vol_data.json")) else { continue };
            let Ok(data) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
            let field = |name: &str| data.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
            if field("driverName") != driver || field("volumeHandle").is_empty() {
                continue;
            }
            let pv_name = Some(field("specVolID"))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| volume.file_name().to_string_lossy().into_owned());
            found.insert(field("volumeHandle"), Published { path: volume.path().join("mount"), pv_name });
        }
    }
    found
}

/// The annotation's JSON value: upstream's four keys and the driver's `message`, which upstream's
/// readers ignore (they decode the four into a struct). [differs: condition-message]
pub fn annotation_value(reported: &Reported, last_checked: &str, node: &str) -> String {
    serde_json::json!({
        "state": state_name(reported.abnormal),
        "message": reported.message,
        "lastChecked": last_checked,
        "since": reported.since,
        "node": node,
    })
    .to_string()
}

/// What the reporter needs.
pub struct Reporter {
    pub client: kube::Client,
    pub driver: String,
    pub node_id: String,
    pub csi_address: String,
    pub kubelet_dir: PathBuf,
    pub staging_root: String,
    pub interval: Duration,
    pub recorders: Vec<RecorderKind>,
}

/// Why the volume conditions could not be checked this time.
#[derive(Debug, thiserror::Error)]
enum TickError {
    #[error("reading Node {node}: {source}")]
    ReadNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("{address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
}

impl Reporter {
    /// Runs until `stop`; every failure is logged and retried at the next tick.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        tracing::info!(interval = ?self.interval, csi = %self.csi_address, "volume-condition reporter started");
        let mut cache: HashMap<String, Reported> = HashMap::new();
        loop {
            if let Err(e) = self.tick(&mut cache).await {
                tracing::warn!(error = %e, "volume conditions not checked this time; retrying");
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    async fn tick(&self, cache: &mut HashMap<String, Reported>) -> Result<(), TickError> {
        let node = Api::<DynamicObject>::all_with(self.client.clone(), &ApiResource::erase::<Node>(&()))
            .get(&self.node_id)
            .await
            .map_err(|source| TickError::ReadNode { node: self.node_id.clone(), source })?;
        let node_uid = node.metadata.uid.clone().unwrap_or_default();
        let handles = attached_handles(&node, &self.driver);
        cache.retain(|handle, _| handles.contains(handle));
        if handles.is_empty() {
            return Ok(());
        }
        let channel = crate::connect::now(&self.csi_address)
            .await
            .map_err(|source| TickError::Connect { address: self.csi_address.clone(), source })?;
        let mut csi_node = csi::node_client::NodeClient::new(channel);
        let published = published_volumes(&self.kubelet_dir, &self.driver);
        let now = crate::registration::now_rfc3339();
        for handle in handles {
            let publish = published.get(&handle);
            let volume = crate::resolve::Volume {
                pv_name: publish.map(|p| p.pv_name.clone()).unwrap_or_default(),
                driver: self.driver.clone(),
                handle: handle.clone(),
                attributes: HashMap::new(),
                node_stage_secret: None,
                block: false,
                access_modes: vec![],
                claim: None,
            };
            let staging = crate::resolve::staging_path(&self.staging_root, &volume);
            let volume_path = publish.map(|p| p.path.display().to_string()).unwrap_or_else(|| staging.clone());
            let request =
                csi::NodeGetVolumeStatsRequest { volume_id: handle.clone(), volume_path, staging_target_path: staging };
            let condition = match csi_node.node_get_volume_stats(request).await {
                Ok(r) => r.into_inner().volume_condition,
                Err(status) => {
                    tracing::debug!(volume = %handle, error = %status.message(), "NodeGetVolumeStats failed");
                    continue;
                }
            };
            let Some(condition) = condition else {
                tracing::debug!(volume = %handle, "the driver reported no volume condition");
                continue;
            };
            let previous = cache.get(&handle);
            let first_seen = previous.is_none();
            let changed = previous.is_none_or(|p| p.abnormal != condition.abnormal || p.message != condition.message);
            let mut reported = Reported {
                abnormal: condition.abnormal,
                message: condition.message,
                since: match previous {
                    Some(p) if p.abnormal == condition.abnormal => p.since.clone(),
                    _ => now.clone(),
                },
            };
            self.record(&volume, (changed, first_seen), &mut reported, &now, &node_uid).await;
            cache.insert(handle, reported);
        }
        Ok(())
    }

    /// Sends one volume's condition to the recorders: changes to the log and events, the
    /// annotation on every tick (its `lastChecked` says the check still runs). A volume this
    /// process sees for the first time takes its `since` from the annotation, when that says the
    /// same state: the condition may be older than the process.
    async fn record(
        &self,
        volume: &crate::resolve::Volume,
        (changed, first_seen): (bool, bool),
        reported: &mut Reported,
        now: &str,
        node_uid: &str,
    ) {
        if changed && self.recorders.contains(&RecorderKind::Log) {
            if reported.abnormal {
                tracing::warn!(volume = %volume.handle, pv = %volume.pv_name, message = %reported.message, "volume condition abnormal");
            } else {
                tracing::info!(volume = %volume.handle, pv = %volume.pv_name, message = %reported.message, "volume condition healthy");
            }
        }
        let wants_pvc = (changed && self.recorders.contains(&RecorderKind::PvcEvent))
            || self.recorders.contains(&RecorderKind::PvcAnnotation);
        if !wants_pvc {
            return;
        }
        let Some((namespace, claim, claim_uid)) = self.claim_of(volume).await else { return };
        if changed && self.recorders.contains(&RecorderKind::PvcEvent) {
            let result = self.event(&namespace, &claim, claim_uid.as_deref(), reported, now).await;
            if let Err(e) = result {
                tracing::warn!(pvc = %format!("{namespace}/{claim}"), error = %e, "recording the volume condition event failed");
            }
        }
        if self.recorders.contains(&RecorderKind::PvcAnnotation) {
            let key = format!("{HEALTH_ANNOTATION}.{node_uid}");
            let pvcs =
                Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(self.client.clone(), &namespace);
            if first_seen {
                match pvcs.get_metadata(&claim).await {
                    Ok(pvc) => {
                        let earlier = pvc.metadata.annotations.as_ref().and_then(|a| a.get(&key)).map(String::as_str);
                        if let Some(since) = since_in_annotation(earlier, state_name(reported.abnormal)) {
                            reported.since = since;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(pvc = %format!("{namespace}/{claim}"), error = %e, "reading the earlier volume condition failed; it starts now")
                    }
                }
            }
            let patch =
                serde_json::json!({"metadata": {"annotations": {key: annotation_value(reported, now, &self.node_id)}}});
            // Metadata back, not the whole claim: no PVC deserialiser in the binary for it.
            if let Err(e) = pvcs.patch_metadata(&claim, &PatchParams::default(), &Patch::Merge(&patch)).await {
                tracing::warn!(pvc = %format!("{namespace}/{claim}"), error = %e, "annotating the volume condition failed");
            }
        }
    }

    /// The PVC (namespace, name, UID) bound to the volume's PV: by name when the kubelet named
    /// it, else by handle among the PVs.
    async fn claim_of(&self, volume: &crate::resolve::Volume) -> Option<(String, String, Option<String>)> {
        let pvs = Api::<crate::csi_pv::CsiPv>::all(self.client.clone());
        let pv = if volume.pv_name.is_empty() {
            let list = pvs.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == self.driver && c.volume_handle == volume.handle)
            })?
        } else {
            pvs.get(&volume.pv_name).await.ok()?
        };
        let claim = pv.spec?.claim_ref?;
        Some((claim.namespace?, claim.name?, claim.uid))
    }

    async fn event(
        &self,
        namespace: &str,
        claim: &str,
        claim_uid: Option<&str>,
        reported: &Reported,
        now: &str,
    ) -> Result<(), kube::Error> {
        let time = now.parse().ok().map(Time);
        let (type_, reason) = if reported.abnormal {
            ("Warning", "VolumeConditionAbnormal")
        } else {
            ("Normal", "VolumeConditionHealthy")
        };
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{claim}.")),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(namespace.to_owned()),
                name: Some(claim.to_owned()),
                uid: claim_uid.map(str::to_owned),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(reported.message.clone()),
            type_: Some(type_.into()),
            source: Some(EventSource { component: Some("CSI-Addons".into()), host: Some(self.node_id.clone()) }),
            reporting_component: Some("CSI-Addons".into()),
            reporting_instance: Some(self.node_id.clone()),
            first_timestamp: time.clone(),
            last_timestamp: time,
            count: Some(1),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_names_are_checked() {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            RecorderKind::parse_list(&names(&["log", "pvcEvent", "pvcAnnotation", "log"])).unwrap(),
            [RecorderKind::Log, RecorderKind::PvcEvent, RecorderKind::PvcAnnotation]
        );
        assert!(RecorderKind::parse_list(&names(&["log", "slack"])).unwrap_err().to_string().contains("\"slack\""));
    }

    #[test]
    fn only_this_drivers_attached_volumes_count() {
        let node: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n"},
            "status": {"volumesAttached": [
                {"name": "kubernetes.io/csi/rbd.csi.ceph.com^0001-abc", "devicePath": ""},
                {"name": "kubernetes.io/csi/other.example.com^x", "devicePath": ""},
                {"name": "kubernetes.io/csi/rbd.csi.ceph.com^0001-abc", "devicePath": ""}
            ]}
        }))
        .unwrap();
        assert_eq!(attached_handles(&node, "rbd.csi.ceph.com"), ["0001-abc"]);
    }

    #[test]
    fn vol_data_json_names_the_publish_path_and_pv() {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("pods/uid-1/volumes/kubernetes.io~csi/pv-1");
        std::fs::create_dir_all(&volume).unwrap();
        std::fs::write(
            volume.join("vol_data.json"),
            r#"{"driverName":"d.example.com","volumeHandle":"h-1","specVolID":"pv-1","volumeLifecycleMode":"Persistent"}"#,
        )
        .unwrap();
        let other = dir.path().join("pods/uid-2/volumes/kubernetes.io~csi/pv-2");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("vol_data.json"), r#"{"driverName":"other","volumeHandle":"h-2"}"#).unwrap();
        let found = published_volumes(dir.path(), "d.example.com");
        assert_eq!(found.len(), 1);
        assert_eq!(found["h-1"], Published { path: volume.join("mount"), pv_name: "pv-1".into() });
    }

    #[test]
    fn the_annotation_says_state_since_and_last_check() {
        let reported = Reported { abnormal: true, message: "I/O errors".into(), since: "2026-01-01T00:00:00Z".into() };
        let value: serde_json::Value =
            serde_json::from_str(&annotation_value(&reported, "2026-01-01T00:05:00Z", "node-1")).unwrap();
        assert_eq!(value["state"], "unhealthy");
        assert_eq!(value["since"], "2026-01-01T00:00:00Z");
        assert_eq!(value["lastChecked"], "2026-01-01T00:05:00Z");
        assert_eq!(value["node"], "node-1");
    }

    #[test]
    fn a_restarted_sidecar_keeps_since_only_for_the_same_state() {
        // As upstream writes it (no message), and as this project's first releases did.
        let upstream =
            r#"{"state":"unhealthy","lastChecked":"2026-01-01T00:05:00Z","since":"2026-01-01T00:00:00Z","node":"n"}"#;
        let first_release = r#"{"state":"abnormal","message":"I/O","since":"2025-12-01T00:00:00Z"}"#;
        assert_eq!(since_in_annotation(Some(upstream), "unhealthy").as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(since_in_annotation(Some(first_release), "unhealthy").as_deref(), Some("2025-12-01T00:00:00Z"));
        assert_eq!(since_in_annotation(Some(upstream), "healthy"), None, "another state starts again");
        for broken in [
            "",
            "not json",
            "[]",
            r#"{"state":"unhealthy"}"#,
            r#"{"state":1,"since":"x"}"#,
            r#"{"state":"unhealthy","since":""}"#,
        ] {
            assert_eq!(since_in_annotation(Some(broken), "unhealthy"), None, "{broken}");
        }
        assert_eq!(since_in_annotation(None, "healthy"), None);
    }
}
