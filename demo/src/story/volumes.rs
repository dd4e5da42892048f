//! Provisioning, reclaim space (attached and unattached), the StorageClass schedule annotation and
//! key rotation.
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::kubelet::write_and_delete;
use super::{MIB, Outcome, Story, Volume, mib};
use crate::stack::{DEMO_NAMESPACE, DRIVER};
use crate::{Error, Result};

pub const STORAGE_CLASS: &str = "demo-reference";
const PVCS: [&str; 5] = ["data-1", "data-2", "repl-1", "group-1", "group-2"];
pub const GROUP_LABEL: &str = "replication-group";
const VOLUME_BYTES: i64 = 256 * MIB;
const CSIADDONS: &str = "csiaddons.openshift.io/v1alpha1";

impl Story<'_> {
    /// The driver's backing file of `volume` (a loop-attached sparse file), when it has one.
    fn backing_file(&self, volume: &Volume) -> Option<PathBuf> {
        Some(self.stack.dir.join("state/volumes").join(format!("{}.img", volume.handle))).filter(|p| p.is_file())
    }

    /// Bytes the backing file occupies on the host.
    fn allocated(&self, volume: &Volume) -> Result<Option<i64>> {
        let Some(file) = self.backing_file(volume) else { return Ok(None) };
        let metadata = std::fs::metadata(&file).map_err(Error::io(format!("reading {}", file.display())))?;
        Ok(Some(i64::try_from(metadata.blocks().saturating_mul(512)).unwrap_or(i64::MAX)))
    }

    pub(super) async fn provision(&mut self) -> Result<Outcome> {
        let applier = &self.stack.applier;
        applier
            .apply(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": STORAGE_CLASS},
                "provisioner": DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
            }))
            .await?;
        for pvc in PVCS {
            let labels = if pvc.starts_with("group-") { json!({GROUP_LABEL: "demo"}) } else { json!({}) };
            applier
                .apply(json!({
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": pvc, "namespace": DEMO_NAMESPACE, "labels": labels},
                    "spec": {
                        "storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "256Mi"}},
                    },
                }))
                .await?;
        }
        let claims = self.api("v1", "PersistentVolumeClaim")?;
        let volumes = self.stack.applier.api("v1", "PersistentVolume", "")?;
        for pvc in PVCS {
            let what = format!("PVC {DEMO_NAMESPACE}/{pvc} to be Bound");
            let pv = self
                .stack
                .until(&what, 120, async || {
                    let claim = claims.get(pvc).await?;
                    let bound = claim.data.pointer("/status/phase") == Some(&json!("Bound"));
                    Ok(bound.then(|| claim.data["spec"]["volumeName"].as_str().unwrap_or_default().to_owned()))
                })
                .await?;
            let handle =
                volumes.get(&pv).await?.data["spec"]["csi"]["volumeHandle"].as_str().unwrap_or_default().to_owned();
            self.volumes.insert(pvc.to_owned(), Volume { pv, handle });
        }
        let effect = format!(
            "{} PVCs of {} Bound: csi-provisioner called CreateVolume, kube-controller-manager bound the PVs",
            PVCS.len(),
            mib(VOLUME_BYTES)
        );
        Ok(Outcome::new("Provision", "demo/data-1 … group-2", effect)
            .fact("bound", i64::try_from(PVCS.len()).unwrap_or(0)))
    }

    pub(super) async fn publish_and_write(&mut self) -> Result<Outcome> {
        let volume = self.volume("data-1")?.clone();
        let attachment = self.attach(&volume).await?;
        let mounted = self.stage_and_publish(&volume).await?;
        write_and_delete(&mounted.target, 128 * MIB)?;
        let held = self.allocated(&volume)?;
        self.mounted_data_1 = Some(mounted);
        let effect = format!(
            "VolumeAttachment {attachment} and NodeStage/NodePublish (what the attach-detach controller and the kubelet \
             would do); 128 MiB written and deleted: the backing file holds {}",
            held.map_or_else(|| "n/a (directory backend)".to_owned(), mib)
        );
        Ok(Outcome::new("Publish and write", "demo/data-1", effect).fact("held", held.unwrap_or(0)))
    }

    /// Creates a ReclaimSpaceJob on `pvc` and waits for it; returns (effect, allocated before, after).
    async fn reclaim(&self, job: &str, pvc: &str) -> Result<(String, Option<i64>, Option<i64>)> {
        let volume = self.volume(pvc)?.clone();
        let before = self.allocated(&volume)?;
        self.stack
            .applier
            .apply(json!({
                "apiVersion": CSIADDONS, "kind": "ReclaimSpaceJob",
                "metadata": {"name": job, "namespace": DEMO_NAMESPACE},
                "spec": {"target": {"persistentVolumeClaim": pvc}, "backOffLimit": 6, "retryDeadlineSeconds": 600},
            }))
            .await?;
        let status = self.finished(&self.api(CSIADDONS, "ReclaimSpaceJob")?, job).await?;
        let after = self.allocated(&volume)?;
        let reported = status["reclaimedSpace"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| status["reclaimedSpace"].to_string());
        let effect = match (before, after) {
            (Some(before), Some(after)) => format!(
                "allocated {} → {}, reclaimed {} (status.reclaimedSpace {reported})",
                mib(before),
                mib(after),
                mib(before - after)
            ),
            _ => format!("status.reclaimedSpace {reported} (directory backend: nothing to measure)"),
        };
        Ok((effect, before, after))
    }

    /// Waits for a job's `result`; a Failed job is an error carrying its message.
    async fn finished(&self, api: &kube::Api<kube::api::DynamicObject>, job: &str) -> Result<Value> {
        let what = format!("{job} to finish");
        let status = self.status_until(api, job, &what, 180, |s| s["result"].is_string()).await?;
        match status["result"].as_str() {
            Some("Succeeded") => Ok(status),
            _ => Err(Error::Manifest(format!("{job}: {} — {}", status["result"], status["message"]))),
        }
    }

    pub(super) async fn reclaim_attached(&mut self) -> Result<Outcome> {
        let (effect, before, after) = self.reclaim("reclaim-attached", "data-1").await?;
        if let (Some(mounted), Ok(volume)) = (self.mounted_data_1.take(), self.volume("data-1").cloned()) {
            self.unpublish_and_unstage(&volume, &mounted).await?;
        }
        let effect = format!("{effect}; node call (VolumeAttachment on demo-node), then controller call");
        Ok(Outcome::new("ReclaimSpaceJob (attached)", "demo/reclaim-attached", effect)
            .fact("before", before.unwrap_or(0))
            .fact("after", after.unwrap_or(0)))
    }

    pub(super) async fn reclaim_unattached(&mut self) -> Result<Outcome> {
        // Data written and deleted while a Pod had the volume, then the Pod went: no attachment left.
        let volume = self.volume("data-2")?.clone();
        let mounted = self.stage_and_publish(&volume).await?;
        write_and_delete(&mounted.target, 64 * MIB)?;
        self.unpublish_and_unstage(&volume, &mounted).await?;
        let (effect, before, after) = self.reclaim("reclaim-unattached", "data-2").await?;
        let effect = format!("{effect}; controller call only (no VolumeAttachment)");
        Ok(Outcome::new("ReclaimSpaceJob (unattached)", "demo/reclaim-unattached", effect)
            .fact("before", before.unwrap_or(0))
            .fact("after", after.unwrap_or(0)))
    }

    pub(super) async fn storage_class_schedule(&mut self) -> Result<Outcome> {
        let classes = self.stack.applier.api("storage.k8s.io/v1", "StorageClass", "")?;
        let annotate =
            json!({"metadata": {"annotations": {"reclaimspace.csiaddons.openshift.io/schedule": "@weekly"}}});
        classes.patch(STORAGE_CLASS, &PatchParams::default(), &Patch::Merge(&annotate)).await?;
        let cron_jobs = self.api(CSIADDONS, "ReclaimSpaceCronJob")?;
        let count = self
            .stack
            .until("a ReclaimSpaceCronJob per PVC of the StorageClass", 60, async || {
                let list = cron_jobs.list(&ListParams::default()).await?;
                Ok((list.items.len() == PVCS.len()).then_some(list.items.len()))
            })
            .await?;
        let effect = format!("annotated @weekly: {count} ReclaimSpaceCronJobs created, one per PVC of the class");
        Ok(Outcome::new("StorageClass schedule", format!("StorageClass/{STORAGE_CLASS}"), effect)
            .fact("cron_jobs", i64::try_from(count).unwrap_or(0)))
    }

    /// The driver's current key ID of `volume` (its state file).
    fn key_id(&self, volume: &Volume) -> Result<Option<String>> {
        let path = self.stack.dir.join("state/state.json");
        let text = std::fs::read(&path).map_err(Error::io(format!("reading {}", path.display())))?;
        let state: Value =
            serde_json::from_slice(&text).map_err(|e| Error::Manifest(format!("{}: {e}", path.display())))?;
        Ok(state["volumes"][&volume.handle]["key_id"].as_str().map(str::to_owned))
    }

    pub(super) async fn rotate_key(&mut self) -> Result<Outcome> {
        // Keys rotate on the node the volume is attached to: data-1's VolumeAttachment is still there.
        let volume = self.volume("data-1")?.clone();
        let before = self.key_id(&volume)?;
        self.stack
            .applier
            .apply(json!({
                "apiVersion": CSIADDONS, "kind": "EncryptionKeyRotationJob",
                "metadata": {"name": "rotate-data-1", "namespace": DEMO_NAMESPACE},
                "spec": {"target": {"persistentVolumeClaim": "data-1"}},
            }))
            .await?;
        self.finished(&self.api(CSIADDONS, "EncryptionKeyRotationJob")?, "rotate-data-1").await?;
        let after = self.key_id(&volume)?;
        if after.is_none() || after == before {
            return Err(Error::Manifest(format!("the driver's key ID did not change ({before:?} → {after:?})")));
        }
        let short = |k: &Option<String>| k.as_deref().map_or("none".to_owned(), |k| k.chars().take(12).collect());
        let effect =
            format!("the volume's key ID {} → {} (node call: data-1 is attached)", short(&before), short(&after));
        Ok(Outcome::new("EncryptionKeyRotationJob", "demo/rotate-data-1", effect).fact("rotated", 1))
    }
}
