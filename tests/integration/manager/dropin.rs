//! What a deployment written for upstream meets on day one, each against the real API server:
//! a stagger window of 0, Namespace-scheduled cron jobs across a manager restart, `enable: "false"`
//! from a Namespace or StorageClass over a PVC's "true", an attached volume whose node sidecar is
//! missing, and the volume-health cleanup at start.
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::manager::{Manager, Stage, attach, bound_pvc, job_result};
use crate::harness::sidecar::{Workload, http_get, sidecar_pod};
use crate::harness::support::create_job;
use crate::harness::support::unique;

const RECLAIM: &str = "reclaimspace.csiaddons.openshift.io";
const ROTATION: &str = "keyrotation.csiaddons.openshift.io";
const CONTROLLER_CAPABILITIES: [&str; 3] =
    ["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE", "encryption_key_rotation.ENCRYPTIONKEYROTATION"];

/// The UID of cron job `name` of `kind`, or None while it does not exist (or is going).
async fn cron_uid(stage: &Stage, kind: &str, name: &str) -> Option<String> {
    let cron = stage.api(kind).get_opt(name).await.unwrap()?;
    cron.metadata.deletion_timestamp.is_none().then(|| cron.metadata.uid.unwrap_or_default())
}

fn annotate(pairs: &[(&str, Option<&str>)]) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> =
        pairs.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    json!({"metadata": {"annotations": map}})
}

#[tokio::test]
async fn a_stagger_window_of_zero_is_accepted_from_the_flag_and_the_config_map() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "stagger-off").await.unwrap();
    let config = ConfigMap {
        metadata: ObjectMeta { name: Some("csi-addons-config".into()), ..Default::default() },
        data: Some(BTreeMap::from([("cronjob-stagger-window".to_owned(), "0".to_owned())])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), &namespace).create(&PostParams::default(), &config).await.unwrap();
    let mut manager = Manager::start(&namespace, cp.kubeconfig_path(), &["--cronjob-stagger-window=0"]);
    manager.eventually("/readyz 200", async |m| matches!(http_get(m.health, "/readyz").await, Some((200, _)))).await;
    assert!(manager.child.try_wait().unwrap().is_none(), "the manager exited:\n{}", manager.log());
    assert!(!manager.log().contains("cronjob-stagger-window"), "the value was refused:\n{}", manager.log());
}

/// A Namespace schedules reclaim space for every PVC of a driver whose sidecars are not
/// connected when the manager starts: the managed cron jobs stay, neither deleted nor made again.
#[tokio::test]
async fn namespace_scheduled_cron_jobs_survive_a_manager_restart_while_the_sidecar_is_away() {
    let mut stage = Stage::new("ns-restart", &CONTROLLER_CAPABILITIES).await;
    let pod = sidecar_pod(&stage.client, &stage.namespace, "node-r", Workload::DaemonSet, "plugin").await;
    let mut sidecar = stage.sidecar_in(&pod, "node-r").await;
    let namespaces = Api::<Namespace>::all(stage.client.clone());
    let schedule = format!("{RECLAIM}/schedule");
    let patch = annotate(&[(&schedule, Some("@daily"))]);
    namespaces.patch(&stage.namespace, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let pvcs = ["data-0", "data-1", "data-2"];
    for pvc in pvcs {
        bound_pvc(&stage.client, &stage.namespace, pvc, &stage.driver_name, None, json!({})).await;
    }
    let mut uids = Vec::new();
    for pvc in pvcs {
        let name = format!("{pvc}-reclaimspace");
        stage.manager.eventually(&name, async |_| cron_uid(&stage, "ReclaimSpaceCronJob", &name).await.is_some()).await;
        uids.push(cron_uid(&stage, "ReclaimSpaceCronJob", &name).await.unwrap());
    }

    // The sidecar goes; a new manager starts and cannot reach it: the driver's offer is unknown.
    sidecar.kill();
    stage.restart_manager();
    stage
        .manager
        .eventually("the new manager retrying the sidecar", async |m| {
            m.metrics_text().await.contains("csi_addons_sidecar_connections{state=\"retrying\"} 1")
        })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (pvc, uid) in pvcs.iter().zip(&uids) {
        let now = cron_uid(&stage, "ReclaimSpaceCronJob", &format!("{pvc}-reclaimspace")).await;
        assert_eq!(now.as_ref(), Some(uid), "{pvc}'s cron job went while the sidecar was away");
    }
    // The sidecar comes back and connects: still the same cron jobs.
    let _sidecar = stage.sidecar_in(&pod, "node-r").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (pvc, uid) in pvcs.iter().zip(&uids) {
        let now = cron_uid(&stage, "ReclaimSpaceCronJob", &format!("{pvc}-reclaimspace")).await;
        assert_eq!(now.as_ref(), Some(uid), "{pvc}'s cron job was deleted or made again");
    }
    assert!(!stage.manager.log().contains("managed cron job deleted"), "{}", stage.manager.log());
}

/// In `pvc` mode, `enable: "false"` on any of the PVC, its Namespace or its StorageClass turns
/// the feature off, whatever a closer source says.
#[tokio::test]
async fn enable_false_on_a_namespace_or_a_class_wins_over_a_pvcs_true() {
    let stage = Stage::new("enable", &CONTROLLER_CAPABILITIES).await;
    let _sidecar = stage.sidecar("node-e").await;
    let (rs_schedule, rs_enable) = (format!("{RECLAIM}/schedule"), format!("{RECLAIM}/enable"));
    let kr_schedule = format!("{ROTATION}/schedule");
    let namespaces = Api::<Namespace>::all(stage.client.clone());
    let off = annotate(&[(&rs_enable, Some("false"))]);
    namespaces.patch(&stage.namespace, &PatchParams::default(), &Patch::Merge(&off)).await.unwrap();
    // The PVC asks for both; the key-rotation cron job shows the pass ran.
    let wants_both = json!({rs_schedule.clone(): "@daily", rs_enable.clone(): "true", kr_schedule.clone(): "@weekly"});
    bound_pvc(&stage.client, &stage.namespace, "a", &stage.driver_name, None, wants_both.clone()).await;
    let rotation =
        async |pvc: &str| cron_uid(&stage, "EncryptionKeyRotationCronJob", &format!("{pvc}-keyrotation")).await;
    stage.manager.eventually("a-keyrotation", async |_| rotation("a").await.is_some()).await;
    assert_eq!(cron_uid(&stage, "ReclaimSpaceCronJob", "a-reclaimspace").await, None, "the Namespace's false lost");
    // Without the Namespace's "false", the PVC's schedule counts.
    let on = annotate(&[(&rs_enable, None)]);
    namespaces.patch(&stage.namespace, &PatchParams::default(), &Patch::Merge(&on)).await.unwrap();
    stage
        .manager
        .eventually("a-reclaimspace", async |_| {
            cron_uid(&stage, "ReclaimSpaceCronJob", "a-reclaimspace").await.is_some()
        })
        .await;

    // A StorageClass's "false" likewise.
    let class = unique("no-reclaim");
    let object: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": class, "annotations": {rs_enable.clone(): "false"}},
        "provisioner": stage.driver_name,
    }))
    .unwrap();
    let classes = Api::<StorageClass>::all(stage.client.clone());
    classes.create(&PostParams::default(), &object).await.unwrap();
    bound_pvc(&stage.client, &stage.namespace, "b", &stage.driver_name, Some(&class), wants_both).await;
    stage.manager.eventually("b-keyrotation", async |_| rotation("b").await.is_some()).await;
    assert_eq!(cron_uid(&stage, "ReclaimSpaceCronJob", "b-reclaimspace").await, None, "the class's false lost");
    classes.delete(&class, &Default::default()).await.unwrap();
}

/// Reclaim space on an attached volume waits for the sidecar of its node (upstream: "node client
/// not found"), with the reason in the status, and fails with it at the deadline; it is never
/// done on the controller side alone.
#[tokio::test]
async fn an_attached_volume_waits_for_its_nodes_sidecar_then_fails_with_the_reason() {
    let capabilities = ["service.CONTROLLER_SERVICE", "reclaim_space.ONLINE", "reclaim_space.OFFLINE"];
    let stage = Stage::new("rsj-no-node", &capabilities).await;
    let _sidecar = stage.sidecar("node-with-sidecar").await;
    let pv = bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    attach(&stage.client, &pv, "node-without-sidecar", &stage.driver_name).await;
    let spec = json!({"target": {"persistentVolumeClaim": "data"}, "retryDeadlineSeconds": 12});
    create_job(&stage.client, &stage.namespace, "ReclaimSpaceJob", "waits", spec).await;
    let jobs = stage.api("ReclaimSpaceJob");
    stage
        .manager
        .eventually("the reason in the job's conditions while it retries", async |_| {
            let job = jobs.get("waits").await.unwrap();
            let conditions = job.data.pointer("/status/conditions").cloned().unwrap_or_default();
            job.data.pointer("/status/result").is_none() && conditions.to_string().contains("node client not found")
        })
        .await;
    let status = job_result(&stage.manager, &jobs, "waits").await;
    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains("node client not found") && message.contains("node-without-sidecar"), "{message}");
    assert_eq!(stage.driver.count("controller_reclaim_space"), 0, "reclaimed on the controller side alone");
}

#[tokio::test]
async fn volume_health_cleanup_runs_at_start_and_keeps_what_a_reporter_did_not_write() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "volume-health").await.unwrap();
    let key = |node: &str| format!("csiaddons.openshift.io/volumehealth.{node}");
    let value = |checked: k8s_openapi::jiff::Timestamp| {
        json!({"state": "healthy", "lastChecked": checked.to_string(), "since": checked.to_string(), "node": "n"})
            .to_string()
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let three_hours_ago = now - k8s_openapi::jiff::SignedDuration::from_hours(3);
    let annotations = json!({
        key("stale-node"): value(three_hours_ago),
        key("fresh-node"): value(now),
        key("someone-elses"): "not the reporter's JSON",
    });
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &namespace);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "watched", "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &claim).await.unwrap();
    // An interval of an hour: only the pass at start can remove anything within the test.
    let manager = Manager::start(&namespace, cp.kubeconfig_path(), &["--volume-health-cleanup-interval=1h"]);
    manager
        .eventually("the stale annotation removed", async |_| {
            let pvc = pvcs.get("watched").await.unwrap();
            !pvc.metadata.annotations.unwrap_or_default().contains_key(&key("stale-node"))
        })
        .await;
    let kept = pvcs.get("watched").await.unwrap().metadata.annotations.unwrap_or_default();
    assert!(kept.contains_key(&key("fresh-node")), "{kept:?}");
    assert_eq!(kept.get(&key("someone-elses")).map(String::as_str), Some("not the reporter's JSON"));
}

/// `--max-concurrent-reconciles` bounds every controller: with 1, the job controller and the
/// VolumeReplication controller each call the driver for one object at a time (three of each
/// are created at once), and every controller reports the setting.
#[tokio::test]
async fn max_concurrent_reconciles_bounds_every_controller() {
    let capabilities = ["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE", "volume_replication.VOLUME_REPLICATION"];
    let stage = Stage::with_flags("one-worker", &capabilities, &["--max-concurrent-reconciles=1"]).await;
    let _sidecar = stage.sidecar("node-w").await;
    for method in ["controller_reclaim_space", "promote_volume"] {
        stage.driver.delay(method, Duration::from_millis(1500));
    }
    let class = format!("{}-vrc", stage.namespace);
    let body = json!({
        "apiVersion": "replication.storage.openshift.io/v1alpha1", "kind": "VolumeReplicationClass",
        "metadata": {"name": class}, "spec": {"provisioner": stage.driver_name},
    });
    crate::harness::support::dynamic_api(&stage.client, "VolumeReplicationClass", "")
        .create(&PostParams::default(), &serde_json::from_value(body).unwrap())
        .await
        .unwrap();
    let replications = crate::harness::support::dynamic_api(&stage.client, "VolumeReplication", &stage.namespace);
    for i in 0..3 {
        let pvc = format!("data-{i}");
        bound_pvc(&stage.client, &stage.namespace, &pvc, &stage.driver_name, None, json!({})).await;
    }
    for i in 0..3 {
        let pvc = format!("data-{i}");
        create_job(
            &stage.client,
            &stage.namespace,
            "ReclaimSpaceJob",
            &pvc,
            json!({"target": {"persistentVolumeClaim": pvc}}),
        )
        .await;
        let vr = json!({
            "apiVersion": "replication.storage.openshift.io/v1alpha1", "kind": "VolumeReplication",
            "metadata": {"name": pvc},
            "spec": {"volumeReplicationClass": class, "replicationState": "primary",
                     "dataSource": {"kind": "PersistentVolumeClaim", "name": pvc}},
        });
        replications.create(&PostParams::default(), &serde_json::from_value(vr).unwrap()).await.unwrap();
    }
    let jobs = stage.api("ReclaimSpaceJob");
    for i in 0..3 {
        let status = job_result(&stage.manager, &jobs, &format!("data-{i}")).await;
        assert_eq!(status["result"], "Succeeded", "{status}");
    }
    stage
        .manager
        .eventually("three VolumeReplications Primary", async |_| {
            let list = replications.list(&Default::default()).await.unwrap().items;
            list.iter().filter(|v| v.data.pointer("/status/state") == Some(&json!("Primary"))).count() == 3
        })
        .await;
    assert_eq!(stage.driver.max_in_flight("controller_reclaim_space"), 1);
    assert_eq!(stage.driver.max_in_flight("promote_volume"), 1);
    let metrics = stage.manager.metrics_text().await;
    for controller in operator::manager::CONTROLLERS {
        let series = format!("controller_runtime_max_concurrent_reconciles{{controller=\"{controller}\"}} 1");
        assert!(metrics.contains(&series), "{series} missing:\n{metrics}");
    }
}

/// PVCs annotated before the manager starts get their cron jobs from its first list: each PVC of
/// that list is passed on as the watch delivers it, and the controller's cache holds it by then.
#[tokio::test]
async fn pvcs_annotated_before_the_manager_starts_get_their_cron_jobs() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "first-list").await.unwrap();
    let annotations = json!({format!("{RECLAIM}/schedule"): "@weekly"});
    let pvcs = ["data-0", "data-1", "data-2"];
    for pvc in pvcs {
        bound_pvc(&client, &namespace, pvc, "first-list.csi-addons-rs.io", None, annotations.clone()).await;
    }
    let manager = Manager::start(&namespace, cp.kubeconfig_path(), &[]);
    let crons = crate::harness::support::dynamic_api(&client, "ReclaimSpaceCronJob", &namespace);
    for pvc in pvcs {
        let name = format!("{pvc}-reclaimspace");
        manager.eventually(&name, async |_| crons.get_opt(&name).await.unwrap().is_some()).await;
    }
}
