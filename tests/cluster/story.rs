//! `make demo`'s story in real Pods (`make demo-cluster` prints it; `make test-cluster` asserts it):
//! a workload writes, its space is reclaimed, its key rotated, its node fenced and unfenced, a volume
//! and a group of volumes replicated, and every sidecar Connected. Each step says what it measurably
//! changed and how long it took.
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use testenv::poll;

use crate::cluster::{self, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR};
use crate::driver_pods::{WORKLOADS, connected_nodes, csiaddons, volume_handle, workload_labelled};

const REPLICATION: (&str, &str) = ("replication.storage.openshift.io", "v1alpha1");
const NODE_CIDR: &str = "10.250.0.1/32";

pub fn replication_api(client: &Client, kind: &str, namespace: Option<&str>) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(REPLICATION.0, REPLICATION.1, kind);
    let lower = kind.to_lowercase();
    let plural = if lower.ends_with("class") { format!("{lower}es") } else { format!("{lower}s") };
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// Polls `name`'s status until `done` holds (or `limit` passes) and returns it.
async fn status_until(
    api: &Api<DynamicObject>,
    name: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Option<Value> {
    poll::until(limit, async || {
        let object = api.get(name).await.ok()?;
        let status = object.data.get("status")?.clone();
        done(&status).then_some(status)
    })
    .await
}

pub struct Step {
    pub name: &'static str,
    pub object: String,
    pub effect: String,
    pub took: Duration,
}

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster or make demo-cluster"]
async fn the_story_in_real_pods() {
    let client = cluster::client().await;
    // `make demo-cluster DRIVER=operator`: the driver operator's StorageClass.
    if let Ok(class) = std::env::var("STORY_STORAGE_CLASS") {
        *crate::driver_pods::STORAGE_CLASS.write().unwrap_or_else(std::sync::PoisonError::into_inner) = class.leak();
    }
    let steps = tell(&client).await;
    println!(
        "\nThe story in real Pods: {} steps, {:.0} s in all",
        steps.len(),
        steps.iter().map(|s| s.took.as_secs_f64()).sum::<f64>()
    );
}

/// Runs the story's steps once on a cluster with the manager and the driver installed (the objects
/// it makes have fixed names), printing each as it ends.
pub async fn tell(client: &Client) -> Vec<Step> {
    let client = client.clone();
    let mut steps: Vec<Step> = Vec::new();
    let mut step = |name: &'static str, object: &str, effect: String, started: Instant| {
        let done = Step { name, object: object.to_owned(), effect, took: started.elapsed() };
        println!("[{:>6.1}s] {:<26} {:<32} {}", done.took.as_secs_f64(), done.name, done.object, done.effect);
        steps.push(done);
    };

    let started = Instant::now();
    workload_labelled(&client, "story", None).await;
    step("Workload writes", "workloads/story", "a Pod wrote 16 MiB to its PVC and deleted it".into(), started);

    let started = Instant::now();
    let jobs = csiaddons(&client, "ReclaimSpaceJob", WORKLOADS);
    jobs.create(
        &PostParams::default(),
        &object(json!({
            "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "ReclaimSpaceJob",
            "metadata": {"name": "story-reclaim"}, "spec": {"target": {"persistentVolumeClaim": "story"}}
        })),
    )
    .await
    .unwrap();
    let status = status_until(&jobs, "story-reclaim", poll::MINUTE, |s| s["result"].is_string()).await;
    let status = status.expect("the ReclaimSpaceJob ends");
    assert_eq!(status["result"], "Succeeded", "{status}");
    let reclaimed: i64 = status["reclaimedSpace"].as_str().and_then(|s| s.parse().ok()).unwrap_or_default();
    assert!(reclaimed >= 16 << 20, "{status}");
    step("ReclaimSpaceJob", "workloads/story-reclaim", format!("{} MiB given back", reclaimed >> 20), started);

    let started = Instant::now();
    let rotations = csiaddons(&client, "EncryptionKeyRotationJob", WORKLOADS);
    rotations
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "EncryptionKeyRotationJob",
                "metadata": {"name": "story-rotate"}, "spec": {"target": {"persistentVolumeClaim": "story"}}
            })),
        )
        .await
        .unwrap();
    let status = status_until(&rotations, "story-rotate", poll::MINUTE, |s| s["result"].is_string()).await;
    let status = status.expect("the EncryptionKeyRotationJob ends");
    assert_eq!(status["result"], "Succeeded", "{status}");
    step("EncryptionKeyRotationJob", "workloads/story-rotate", "the volume's key replaced".into(), started);

    let started = Instant::now();
    let refused = fence_and_unfence(&client).await;
    step(
        "NetworkFence",
        "NetworkFence/story-node",
        format!("fenced {NODE_CIDR}: a new Pod's volume refused ({refused}); unfenced: it starts"),
        started,
    );

    let started = Instant::now();
    let effect = replicate_volume(&client).await;
    step("VolumeReplication", "workloads/story", effect, started);

    let started = Instant::now();
    let effect = replicate_group(&client).await;
    step("VolumeGroupReplication", "workloads/story-group", effect, started);

    let started = Instant::now();
    let connected = connected_nodes(&client).await;
    let pods = cluster::running_pods(&client, DRIVER_NAMESPACE, NODE_PLUGIN_SELECTOR).await;
    assert!(pods.iter().all(|p| connected.iter().any(|(_, e)| e.starts_with(&format!("pod://{}.", cluster::name(p))))));
    step(
        "CSIAddonsNodes",
        DRIVER_NAMESPACE,
        format!("{} Connected through pod:// endpoints", connected.len()),
        started,
    );
    steps
}

/// Fences the node's address, shows a new Pod's volume refused with the driver's reason in the Pod's
/// events, unfences, and sees the Pod start. Returns the driver's reason.
async fn fence_and_unfence(client: &Client) -> String {
    let gvk = GroupVersionKind::gvk("csiaddons.openshift.io", "v1alpha1", "NetworkFence");
    let fences: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::from_gvk_with_plural(&gvk, "networkfences"));
    fences
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "NetworkFence",
                "metadata": {"name": "story-node"},
                "spec": {"networkFenceClassName": "reference-csi-fence", "cidrs": [NODE_CIDR], "fenceState": "Fenced"}
            })),
        )
        .await
        .unwrap();
    let fenced = status_until(&fences, "story-node", poll::MINUTE, |s| s["result"] == "Succeeded").await;
    assert!(fenced.is_some(), "the fence is in place");

    crate::driver_pods::start_workload(client, "story-fenced", None).await;
    let events: Api<Event> = Api::namespaced(client.clone(), WORKLOADS);
    let reason = poll::until(cluster::POD_START, async || {
        let list = events.list(&ListParams::default().fields("involvedObject.name=story-fenced")).await.ok()?;
        list.items.into_iter().filter_map(|e| e.message).find(|m| m.contains("fenced off the storage"))
    })
    .await
    .expect("the Pod's events carry the driver's refusal");
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOADS);
    assert!(
        !pods.get("story-fenced").await.map(|p| cluster::ready(&p)).unwrap_or(false),
        "a fenced node runs no new volume"
    );

    let unfence = json!({"spec": {"fenceState": "Unfenced"}});
    fences.patch("story-node", &PatchParams::default(), &Patch::Merge(&unfence)).await.unwrap();
    let started =
        poll::until(cluster::POD_START, async || pods.get("story-fenced").await.ok().filter(cluster::ready)).await;
    assert!(started.is_some(), "unfenced, the Pod starts");
    let _ = fences.delete("story-node", &DeleteParams::default()).await;
    reason.rsplit("desc = ").next().unwrap_or(&reason).to_owned()
}

async fn replicate_volume(client: &Client) -> String {
    let replications = replication_api(client, "VolumeReplication", Some(WORKLOADS));
    replications.create(&PostParams::default(), &object(json!({
        "apiVersion": "replication.storage.openshift.io/v1alpha1", "kind": "VolumeReplication",
        "metadata": {"name": "story"},
        "spec": {"volumeReplicationClass": "reference-csi-replication", "replicationState": "primary", "autoResync": false,
                 "dataSource": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "story"}}
    })))
    .await
    .unwrap();
    let primary = status_until(&replications, "story", 2 * poll::MINUTE, |s| {
        s["state"] == "Primary" && s["lastSyncTime"].is_string()
    })
    .await;
    let primary = primary.expect("the volume replicates as Primary with sync info");
    for (desired, observed) in [("secondary", "Secondary"), ("primary", "Primary")] {
        let patch = json!({"spec": {"replicationState": desired}});
        replications.patch("story", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        let reached = status_until(&replications, "story", 2 * poll::MINUTE, |s| s["state"] == observed).await;
        assert!(reached.is_some(), "the replication becomes {observed}");
    }
    let handle = volume_handle(client, &claim_volume(client, "story").await).await;
    format!(
        "volume {handle}: Primary (last sync {}) → Secondary → Primary",
        primary["lastSyncTime"].as_str().unwrap_or("?")
    )
}

async fn replicate_group(client: &Client) -> String {
    let classes = replication_api(client, "VolumeGroupReplicationClass", None);
    let created = classes
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "replication.storage.openshift.io/v1alpha1", "kind": "VolumeGroupReplicationClass",
                "metadata": {"name": "story-group"}, "spec": {"provisioner": crate::driver_pods::DRIVER}
            })),
        )
        .await;
    // Left by an earlier telling on this cluster: the same class.
    if let Err(e) = created {
        assert!(
            matches!(&e, kube::Error::Api(s) if s.code == 409),
            "creating VolumeGroupReplicationClass story-group: {e}"
        );
    }
    for member in ["story-group-1", "story-group-2"] {
        workload_labelled(client, member, Some(("replication-group", "story"))).await;
    }
    let groups = replication_api(client, "VolumeGroupReplication", Some(WORKLOADS));
    groups.create(&PostParams::default(), &object(json!({
        "apiVersion": "replication.storage.openshift.io/v1alpha1", "kind": "VolumeGroupReplication",
        "metadata": {"name": "story-group"},
        "spec": {"volumeGroupReplicationClassName": "story-group", "volumeReplicationClassName": "reference-csi-replication",
                 "replicationState": "primary", "source": {"selector": {"matchLabels": {"replication-group": "story"}}}}
    })))
    .await
    .unwrap();
    let status = status_until(&groups, "story-group", 2 * poll::MINUTE, |s| {
        s["state"] == "Primary" && s["persistentVolumeClaimsRefList"].as_array().is_some_and(|l| l.len() == 2)
    })
    .await
    .expect("the group of two PVCs replicates as Primary");
    let members: Vec<&str> = status["persistentVolumeClaimsRefList"]
        .as_array()
        .map(|l| l.iter().filter_map(|r| r["name"].as_str()).collect())
        .unwrap_or_default();
    format!("{} grouped and replicating as Primary", members.join(" and "))
}

async fn claim_volume(client: &Client, claim: &str) -> String {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), WORKLOADS);
    claims.get(claim).await.unwrap().spec.and_then(|s| s.volume_name).unwrap()
}
