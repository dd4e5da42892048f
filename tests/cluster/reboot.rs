//! The node rebooted (`hack/cluster.sh reboot`): every process of it killed as at a power cut, its
//! mounts and loop devices gone, then its services started as at boot. Nothing of the product is
//! installed again by hand: the kubelet brings every Pod back, and a workload's volume is mounted
//! again through the driver, with what was written to it before the reboot.
use std::time::Instant;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use testenv::poll;

use crate::cluster;

/// The workload's name, and its claim's.
const WORKLOAD: &str = "mounted";

/// What the workload's container does at each start: says what an earlier start wrote to its
/// volume, then writes its own mark.
const MARKS: &str = "if [ -f /data/boots ]; then echo \"found $(wc -l < /data/boots) earlier start(s)\"; fi; \
                     date +%s >> /data/boots && sync && echo marked && exec sleep 3600";

/// A Pod with a volume of `class` in `namespace`, once it has marked its volume.
async fn start_workload(client: &Client, namespace: &str, class: &str) -> Api<Pod> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let claim = json!({
        "metadata": {"name": WORKLOAD},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "16Mi"}}}
    });
    claims.create(&PostParams::default(), &serde_json::from_value(claim).unwrap()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = json!({
        "metadata": {"name": WORKLOAD},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36.0", "command": ["/bin/sh", "-c", MARKS],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
          "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": WORKLOAD}}]}
    });
    pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
    let marked = poll::until(cluster::POD_START, async || {
        pods.logs(WORKLOAD, &Default::default()).await.ok().filter(|log| log.contains("marked"))
    })
    .await;
    assert!(marked.is_some(), "the workload starts with its volume mounted and marks it");
    pods
}

/// Reboots the node while a workload with a mounted volume of `class` runs in `namespace`; asserts
/// that the workload comes back by itself and finds its mark on the volume.
pub async fn reboot_node(client: &Client, namespace: &str, class: &str) {
    let pods = start_workload(client, namespace, class).await;
    let rebooted = Instant::now();
    tokio::task::spawn_blocking(|| cluster::hack_script("cluster.sh", &["reboot"])).await.unwrap();
    println!(
        "node reboot: the node's services ran again {:.1} s after the power cut",
        rebooted.elapsed().as_secs_f64()
    );
    let back = poll::until(2 * cluster::POD_START, async || {
        let pod = pods.get(WORKLOAD).await.ok().filter(cluster::ready)?;
        let restarted = cluster::container_restarts(std::slice::from_ref(&pod)) > 0;
        let log = pods.logs(WORKLOAD, &Default::default()).await.ok()?;
        (restarted && log.contains("marked")).then_some(log)
    })
    .await;
    let log = back.expect("the kubelet starts the workload again, its volume mounted");
    assert!(log.contains("found 1 earlier start(s)"), "the volume holds what was written before the reboot: {log}");
    println!(
        "node reboot: the workload ran again {:.1} s after the power cut and found its volume's data",
        rebooted.elapsed().as_secs_f64()
    );
    let _ = pods.delete(WORKLOAD, &DeleteParams::default()).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let _ = claims.delete(WORKLOAD, &DeleteParams::default()).await;
}
