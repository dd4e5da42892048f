//! Where the driver's workloads stand, from their status and their Pods', and what still keeps the
//! driver from being removed. Pure: the controller reads, this decides.
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::VolumeAttachment;

use crate::decide::Rollout;

/// Container waiting reasons that no wait cures: the rollout has failed until the spec, or the
/// image, changes.
const STUCK: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// The rollout of the controller StatefulSet and the node DaemonSet, given the driver's Pods.
pub fn rollout(controller: Option<&StatefulSet>, node: Option<&DaemonSet>, pods: &[Pod]) -> Rollout {
    if let Some(stuck) = pods.iter().find_map(stuck_container) {
        return Rollout::Failed(stuck);
    }
    let mut waiting = Vec::new();
    match controller {
        None => waiting.push("the controller StatefulSet is not created yet".to_owned()),
        Some(set) => {
            let generation = set.metadata.generation.unwrap_or_default();
            let status = set.status.clone().unwrap_or_default();
            let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let updated = status.updated_replicas.unwrap_or_default();
            let ready = status.ready_replicas.unwrap_or_default();
            let same_revision = status.current_revision == status.update_revision;
            if status.observed_generation.unwrap_or_default() < generation {
                waiting.push("the controller StatefulSet's change is not observed yet".to_owned());
            } else if updated < replicas || ready < replicas || !same_revision {
                waiting.push(format!("controller: {updated} of {replicas} Pods updated, {ready} ready"));
            }
        }
    }
    match node {
        None => waiting.push("the node DaemonSet is not created yet".to_owned()),
        Some(set) => {
            let generation = set.metadata.generation.unwrap_or_default();
            let status = set.status.clone().unwrap_or_default();
            let desired = status.desired_number_scheduled;
            let updated = status.updated_number_scheduled.unwrap_or_default();
            let available = status.number_available.unwrap_or_default();
            if status.observed_generation.unwrap_or_default() < generation {
                waiting.push("the node DaemonSet's change is not observed yet".to_owned());
            } else if desired == 0 {
                return Rollout::Failed(
                    "no node matches spec.nodePlacement: the node plugin runs nowhere, so no volume can be mounted"
                        .to_owned(),
                );
            } else if updated < desired || available < desired {
                waiting.push(format!("node: {updated} of {desired} Pods updated, {available} available"));
            }
        }
    }
    if waiting.is_empty() { Rollout::Done } else { Rollout::Waiting(waiting.join("; ")) }
}

/// `pod container: reason: message` for the first container of `pod` that waits for a reason no
/// wait cures.
fn stuck_container(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let mut containers =
        status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
    containers.find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref().filter(|r| STUCK.contains(r))?;
        let pod = pod.metadata.name.as_deref().unwrap_or_default();
        let message = waiting.message.as_deref().unwrap_or_default();
        Some(format!("Pod {pod} container {}: {reason}: {message}", c.name).trim_end_matches(": ").to_owned())
    })
}

/// What keeps the driver from going: volumes of `driver` still attached to a node. Its node
/// plugin must stay until their Pods are gone and the kubelet has unmounted them, and its
/// controller (csi-attacher) until they are detached. The PVs' names, sorted.
pub fn attached_volumes(attachments: &[VolumeAttachment], driver: &str) -> Vec<String> {
    let mut volumes: Vec<String> = attachments
        .iter()
        .filter(|a| a.spec.attacher == driver)
        .map(|a| {
            a.spec.source.persistent_volume_name.clone().unwrap_or_else(|| a.metadata.name.clone().unwrap_or_default())
        })
        .collect();
    volumes.sort();
    volumes.dedup();
    volumes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn stateful_set(generation: i64, observed: i64, updated: i32, ready: i32) -> StatefulSet {
        from(json!({
            "metadata": {"name": "c", "generation": generation},
            "spec": {"replicas": 1, "selector": {}, "serviceName": "c", "template": {}},
            "status": {"replicas": 1, "observedGeneration": observed, "updatedReplicas": updated,
                       "readyReplicas": ready, "currentRevision": "r1", "updateRevision": "r1"}
        }))
    }

    fn daemon_set(desired: i32, updated: i32, available: i32) -> DaemonSet {
        from(json!({
            "metadata": {"name": "n", "generation": 2},
            "spec": {"selector": {}, "template": {}},
            "status": {"observedGeneration": 2, "desiredNumberScheduled": desired, "updatedNumberScheduled": updated,
                       "numberAvailable": available, "currentNumberScheduled": desired, "numberMisscheduled": 0,
                       "numberReady": available}
        }))
    }

    #[test]
    fn ready_workloads_are_done_and_unready_ones_say_what_is_waited_for() {
        assert_eq!(rollout(Some(&stateful_set(3, 3, 1, 1)), Some(&daemon_set(2, 2, 2)), &[]), Rollout::Done);
        let Rollout::Waiting(why) = rollout(Some(&stateful_set(3, 2, 1, 1)), Some(&daemon_set(2, 2, 2)), &[]) else {
            panic!("waiting")
        };
        assert!(why.contains("not observed"), "{why}");
        let Rollout::Waiting(why) = rollout(Some(&stateful_set(3, 3, 1, 1)), Some(&daemon_set(2, 1, 1)), &[]) else {
            panic!("waiting")
        };
        assert_eq!(why, "node: 1 of 2 Pods updated, 1 available");
        let Rollout::Waiting(why) = rollout(None, None, &[]) else { panic!("waiting") };
        assert!(why.contains("StatefulSet") && why.contains("DaemonSet"), "{why}");
    }

    #[test]
    fn an_image_that_cannot_be_pulled_or_no_node_at_all_fails_the_rollout() {
        let pod: Pod = from(json!({
            "metadata": {"name": "reference-driver-node-x"},
            "status": {"containerStatuses": [{"name": "driver", "image": "bad", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"bad\""}}}]}
        }));
        let Rollout::Failed(why) = rollout(Some(&stateful_set(1, 1, 1, 1)), Some(&daemon_set(1, 0, 0)), &[pod]) else {
            panic!("failed")
        };
        assert_eq!(
            why,
            "Pod reference-driver-node-x container driver: ImagePullBackOff: Back-off pulling image \"bad\""
        );
        let Rollout::Failed(why) = rollout(Some(&stateful_set(1, 1, 1, 1)), Some(&daemon_set(0, 0, 0)), &[]) else {
            panic!("failed")
        };
        assert!(why.contains("nodePlacement"), "{why}");
    }

    #[test]
    fn only_this_drivers_attachments_hold_removal_back() {
        let attachment = |attacher: &str, pv: &str| -> VolumeAttachment {
            from(json!({"metadata": {"name": format!("csi-{pv}")},
                "spec": {"attacher": attacher, "nodeName": "n1", "source": {"persistentVolumeName": pv}}}))
        };
        let all = [
            attachment("reference.csi-addons-rs.io", "pv-b"),
            attachment("other.csi", "pv-x"),
            attachment("reference.csi-addons-rs.io", "pv-a"),
        ];
        assert_eq!(attached_volumes(&all, "reference.csi-addons-rs.io"), ["pv-a", "pv-b"]);
        assert!(attached_volumes(&all[1..2], "reference.csi-addons-rs.io").is_empty());
    }
}
