//! Cron jobs and annotation scheduling end to end: children on schedule (`@every` so the test
//! fires every few seconds), Forbid and Replace, both history limits; managed cron jobs created,
//! updated and deleted from PVC, Namespace and StorageClass annotations in both precedence modes.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::manager::{Stage as ManagerStage, attach, bound_pvc, create_pv, set_phase};
use crate::harness::sidecar::SidecarProcess;
use crate::harness::support::unique;

const NODE: &str = "node-s";

/// The shared stage with one sidecar running, for a driver with controller-side reclaim and key
/// rotation.
struct Stage {
    base: ManagerStage,
    _sidecar: SidecarProcess,
}

impl std::ops::Deref for Stage {
    type Target = ManagerStage;

    fn deref(&self) -> &ManagerStage {
        &self.base
    }
}

impl Stage {
    async fn new(prefix: &str) -> Self {
        let capabilities =
            ["service.CONTROLLER_SERVICE", "reclaim_space.OFFLINE", "encryption_key_rotation.ENCRYPTIONKEYROTATION"];
        let base = ManagerStage::new(prefix, &capabilities).await;
        let sidecar = base.sidecar(NODE).await;
        Stage { base, _sidecar: sidecar }
    }

    async fn cron(&self, kind: &str, name: &str, spec: serde_json::Value) -> DynamicObject {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap();
        self.api(kind).create(&PostParams::default(), &object).await.unwrap()
    }

    /// The jobs of `kind` whose controller is `owner`.
    async fn children(&self, kind: &str, owner: &DynamicObject) -> Vec<DynamicObject> {
        let uid = owner.metadata.uid.clone();
        let list = self.api(kind).list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|j| j.metadata.owner_references.iter().flatten().any(|o| Some(&o.uid) == uid.as_ref()))
            .collect()
    }

    /// The schedule of cron job `name` of `kind`, or None while it does not exist.
    async fn schedule(&self, kind: &str, name: &str) -> Option<String> {
        let object = self.api(kind).get_opt(name).await.unwrap()?;
        object.data.pointer("/spec/schedule").and_then(|s| s.as_str()).map(str::to_owned)
    }

    async fn until_schedule(&self, kind: &str, name: &str, want: Option<&str>) {
        self.manager
            .eventually(&format!("{kind} {name} with schedule {want:?}"), async |_| {
                self.schedule(kind, name).await.as_deref() == want
            })
            .await;
    }
}

fn result(job: &DynamicObject) -> Option<&str> {
    job.data.pointer("/status/result").and_then(|r| r.as_str())
}

#[tokio::test]
async fn cron_jobs_start_children_on_schedule_and_keep_their_history_limits() {
    let stage = Stage::new("cron").await;
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    let cron = stage
        .cron(
            "ReclaimSpaceCronJob",
            "every2",
            json!({"schedule": "@every 2s", "successfulJobsHistoryLimit": 2, "failedJobsHistoryLimit": 1,
                   "jobTemplate": {"spec": {"target": {"persistentVolumeClaim": "data"}}}}),
        )
        .await;
    stage.manager.eventually("four runs", async |_| stage.driver.count("controller_reclaim_space") >= 4).await;
    stage
        .manager
        .eventually("two successful children kept", async |_| {
            let children = stage.children("ReclaimSpaceJob", &cron).await;
            children.iter().filter(|c| result(c) == Some("Succeeded")).count() == 2
                && children.iter().all(|c| result(c) != Some("Failed"))
        })
        .await;
    for child in stage.children("ReclaimSpaceJob", &cron).await {
        let name = child.metadata.name.clone().unwrap();
        let at = child.metadata.annotations.as_ref().unwrap()["csiaddons.openshift.io/scheduled-at"].clone();
        let unix: k8s_openapi::jiff::Timestamp = at.parse().unwrap();
        assert_eq!(name, format!("every2-{}", unix.as_second()), "the child is named after its run");
    }
    let status = stage.api("ReclaimSpaceCronJob").get("every2").await.unwrap().data["status"].clone();
    assert!(status["lastScheduleTime"].is_string() && status["lastSuccessfulTime"].is_string(), "{status}");
}

#[tokio::test]
async fn forbid_waits_for_the_running_job_and_replace_replaces_it() {
    let stage = Stage::new("cron-policy").await;
    // The PVC does not exist: each child keeps retrying (Active) for minutes.
    let cron = stage
        .cron(
            "ReclaimSpaceCronJob",
            "stuck",
            json!({"schedule": "@every 1s", "concurrencyPolicy": "Forbid",
                   "jobTemplate": {"spec": {"target": {"persistentVolumeClaim": "not-there"}}}}),
        )
        .await;
    stage
        .manager
        .eventually("a first child", async |_| !stage.children("ReclaimSpaceJob", &cron).await.is_empty())
        .await;
    let first = stage.children("ReclaimSpaceJob", &cron).await[0].metadata.name.clone().unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let children = stage.children("ReclaimSpaceJob", &cron).await;
    assert_eq!(
        children.len(),
        1,
        "Forbid started another run: {:?}",
        children.iter().map(|c| &c.metadata.name).collect::<Vec<_>>()
    );

    let patch = json!({"spec": {"concurrencyPolicy": "Replace"}});
    stage.api("ReclaimSpaceCronJob").patch("stuck", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    stage
        .manager
        .eventually("the running child replaced", async |_| {
            let children = stage.children("ReclaimSpaceJob", &cron).await;
            let live: Vec<_> = children.iter().filter(|c| c.metadata.deletion_timestamp.is_none()).collect();
            !live.is_empty() && live.iter().all(|c| c.metadata.name.as_deref() != Some(first.as_str()))
        })
        .await;
}

#[tokio::test]
async fn failed_children_beyond_the_limit_are_pruned_for_key_rotation_too() {
    let stage = Stage::new("cron-failed").await;
    let pv = bound_pvc(&stage.client, &stage.namespace, "keyed", &stage.driver_name, None, json!({})).await;
    attach(&stage.client, &pv, NODE, &stage.driver_name).await;
    stage.driver.fail("encryption_key_rotate", tonic::Status::unimplemented("no KMS"));
    let cron = stage
        .cron(
            "EncryptionKeyRotationCronJob",
            "rotate",
            json!({"schedule": "@every 1s", "failedJobsHistoryLimit": 1,
                   "jobTemplate": {"spec": {"target": {"persistentVolumeClaim": "keyed"}}}}),
        )
        .await;
    stage.manager.eventually("three failed runs", async |_| stage.driver.count("encryption_key_rotate") >= 3).await;
    stage
        .manager
        .eventually("one failed child kept", async |_| {
            let children = stage.children("EncryptionKeyRotationJob", &cron).await;
            children.iter().filter(|c| result(c) == Some("Failed")).count() == 1
        })
        .await;
}

#[tokio::test]
async fn annotations_on_pvcs_namespaces_and_storage_classes_manage_cron_jobs() {
    let stage = Stage::new("annotations").await;
    const RS: &str = "ReclaimSpaceCronJob";
    const KR: &str = "EncryptionKeyRotationCronJob";
    let class_name = unique("weekly-class");
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": class_name, "annotations": {"reclaimspace.csiaddons.openshift.io/schedule": "@weekly"}},
        "provisioner": stage.driver_name,
    }))
    .unwrap();
    let classes = Api::<StorageClass>::all(stage.client.clone());
    classes.create(&PostParams::default(), &class).await.unwrap();

    // The StorageClass's schedule, then the PVC's own one over it.
    bound_pvc(&stage.client, &stage.namespace, "a", &stage.driver_name, Some(&class_name), json!({})).await;
    stage.until_schedule(RS, "a-reclaimspace", Some("@weekly")).await;
    let child = stage.api(RS).get("a-reclaimspace").await.unwrap();
    assert_eq!(child.metadata.annotations.as_ref().unwrap()["csiaddons.openshift.io/state"], "managed");
    assert_eq!(child.metadata.owner_references.as_ref().unwrap()[0].kind, "PersistentVolumeClaim");
    let pvcs =
        Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(stage.client.clone(), &stage.namespace);
    let annotate = |key: &str, value: Option<&str>| json!({"metadata": {"annotations": {key: value}}});
    pvcs.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(&annotate("reclaimspace.csiaddons.openshift.io/schedule", Some("@daily"))),
    )
    .await
    .unwrap();
    stage.until_schedule(RS, "a-reclaimspace", Some("@daily")).await;
    // A managed cron job deleted by hand comes back.
    let first_uid = stage.api(RS).get("a-reclaimspace").await.unwrap().metadata.uid;
    stage.api(RS).delete("a-reclaimspace", &Default::default()).await.unwrap();
    stage
        .manager
        .eventually("a-reclaimspace made again", async |_| {
            let again = stage.api(RS).get_opt("a-reclaimspace").await.unwrap();
            again.is_some_and(|c| c.metadata.uid != first_uid && c.metadata.deletion_timestamp.is_none())
        })
        .await;
    stage.until_schedule(RS, "a-reclaimspace", Some("@daily")).await;

    // A Namespace annotation applies without a restart; enable=false on the PVC switches it off.
    let namespaces = Api::<Namespace>::all(stage.client.clone());
    namespaces
        .patch(
            &stage.namespace,
            &PatchParams::default(),
            &Patch::Merge(&annotate("keyrotation.csiaddons.openshift.io/schedule", Some("@monthly"))),
        )
        .await
        .unwrap();
    stage.until_schedule(KR, "a-keyrotation", Some("@monthly")).await;
    pvcs.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(&annotate("keyrotation.csiaddons.openshift.io/enable", Some("false"))),
    )
    .await
    .unwrap();
    stage.until_schedule(KR, "a-keyrotation", None).await;

    // An hourly-annotated PVC naming a PV that does not exist yet.
    let pending_claim = async |name: &str, pv: &str| {
        let claim = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {"reclaimspace.csiaddons.openshift.io/schedule": "@hourly"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "storageClassName": "", "volumeName": pv},
        }))
        .unwrap();
        let created: k8s_openapi::api::core::v1::PersistentVolumeClaim =
            pvcs.create(&PostParams::default(), &claim).await.unwrap();
        created
    };

    // Annotated while Pending: picked up when it binds.
    let pv = unique("late-pv");
    let claim = pending_claim("late", &pv).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(stage.schedule(RS, "late-reclaimspace").await, None, "a Pending PVC got a cron job");
    create_pv(&stage.client, &pv, &stage.driver_name, &stage.namespace, "late", claim.metadata.uid.as_deref()).await;
    set_phase(&stage.client, &stage.namespace, "late", &pv, "Bound").await;
    stage.until_schedule(RS, "late-reclaimspace", Some("@hourly")).await;

    // Bound before its PV is seen (the manager reads drivers from its watch of PVs, not by a GET
    // per PVC): the PV, once it comes, brings the PVC back.
    let early_pv = unique("early-pv");
    let claim = pending_claim("early", &early_pv).await;
    let bound = json!({"status": {"phase": "Bound"}});
    pvcs.patch_status("early", &PatchParams::default(), &Patch::Merge(&bound)).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(stage.schedule(RS, "early-reclaimspace").await, None, "a cron job without a known driver");
    create_pv(&stage.client, &early_pv, &stage.driver_name, &stage.namespace, "early", claim.metadata.uid.as_deref())
        .await;
    stage.until_schedule(RS, "early-reclaimspace", Some("@hourly")).await;

    // A cron job that is not `managed` is left alone.
    bound_pvc(&stage.client, &stage.namespace, "b", &stage.driver_name, Some(&class_name), json!({})).await;
    stage.until_schedule(RS, "b-reclaimspace", Some("@weekly")).await;
    let patch = json!({"metadata": {"annotations": {"csiaddons.openshift.io/state": "unmanaged"}}, "spec": {"schedule": "@yearly"}});
    stage.api(RS).patch("b-reclaimspace", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();

    // schedule-precedence=storageclass, live: only the class counts.
    let config = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some("csi-addons-config".into()), ..Default::default() },
        data: Some(BTreeMap::from([("schedule-precedence".to_owned(), "storageclass".to_owned())])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(stage.client.clone(), &stage.namespace)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    stage.until_schedule(RS, "a-reclaimspace", Some("@weekly")).await;
    stage.until_schedule(RS, "late-reclaimspace", None).await;
    classes
        .patch(
            &class_name,
            &PatchParams::default(),
            &Patch::Merge(&annotate("reclaimspace.csiaddons.openshift.io/schedule", None)),
        )
        .await
        .unwrap();
    stage.until_schedule(RS, "a-reclaimspace", None).await;
    assert_eq!(
        stage.schedule(RS, "b-reclaimspace").await.as_deref(),
        Some("@yearly"),
        "an unmanaged cron job was changed"
    );
    classes.delete(&class_name, &Default::default()).await.unwrap();
}

/// Replace with nothing running starts each run as usual (and deletes nothing).
#[tokio::test]
async fn replace_with_nothing_running_starts_each_run() {
    let stage = Stage::new("cron-replace").await;
    bound_pvc(&stage.client, &stage.namespace, "data", &stage.driver_name, None, json!({})).await;
    let cron = stage
        .cron(
            "ReclaimSpaceCronJob",
            "replace",
            json!({"schedule": "@every 2s", "concurrencyPolicy": "Replace", "successfulJobsHistoryLimit": 5,
                   "jobTemplate": {"spec": {"target": {"persistentVolumeClaim": "data"}}}}),
        )
        .await;
    stage
        .manager
        .eventually("three successful runs", async |_| {
            let children = stage.children("ReclaimSpaceJob", &cron).await;
            children.iter().filter(|c| result(c) == Some("Succeeded")).count() >= 3
        })
        .await;
    // Each run reached the driver once: none was cut short by a replacement.
    let children = stage.children("ReclaimSpaceJob", &cron).await;
    assert!(children.iter().all(|c| result(c) != Some("Failed")), "a run failed");
    assert!(stage.driver.count("controller_reclaim_space") >= 3);
}
