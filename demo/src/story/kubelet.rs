//! What the kubelet (and the attach-detach controller) would do for a Pod using a volume, done by
//! hand because no kubelet runs: the VolumeAttachment, NodeStageVolume and NodePublishVolume on the
//! node plugin, with the kubelet's own paths (the node sidecar finds the staging path the same way).
use std::path::PathBuf;

use api::proto::csi::v1 as csi;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{Mounted, Story, Volume};
use crate::Result;
use crate::stack::{DRIVER, NODE};

fn capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(csi::volume_capability::MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
    }
}

impl Story<'_> {
    /// `<staging root>/<driver>/<hex sha256(volume handle)>/globalmount`, as the kubelet stages.
    fn staging_path(&self, volume: &Volume) -> PathBuf {
        let digest: String = Sha256::digest(volume.handle.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        self.stack.staging_root().join(DRIVER).join(digest).join("globalmount")
    }

    fn target_path(&self, volume: &Volume) -> PathBuf {
        self.stack.dir.join("kubelet/pods/demo-app/volumes/kubernetes.io~csi").join(&volume.pv).join("mount")
    }

    /// NodeStageVolume then NodePublishVolume, as the kubelet does when a Pod starts.
    pub async fn stage_and_publish(&self, volume: &Volume) -> Result<Mounted> {
        let mounted = Mounted { staging: self.staging_path(volume), target: self.target_path(volume) };
        let mut node = csi::node_client::NodeClient::new(self.stack.node_csi.clone());
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: volume.handle.clone(),
            staging_target_path: mounted.staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await?;
        self.publish(volume, &mounted).await?;
        Ok(mounted)
    }

    pub async fn publish(&self, volume: &Volume, mounted: &Mounted) -> Result<(), tonic::Status> {
        let mut node = csi::node_client::NodeClient::new(self.stack.node_csi.clone());
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: volume.handle.clone(),
            staging_target_path: mounted.staging.display().to_string(),
            target_path: mounted.target.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await
        .map(|_| ())
    }

    pub async fn unpublish(&self, volume: &Volume, mounted: &Mounted) -> Result<()> {
        let mut node = csi::node_client::NodeClient::new(self.stack.node_csi.clone());
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: volume.handle.clone(),
            target_path: mounted.target.display().to_string(),
        })
        .await?;
        Ok(())
    }

    /// NodeUnpublishVolume then NodeUnstageVolume, as the kubelet does when the Pod goes.
    pub async fn unpublish_and_unstage(&self, volume: &Volume, mounted: &Mounted) -> Result<()> {
        self.unpublish(volume, mounted).await?;
        let mut node = csi::node_client::NodeClient::new(self.stack.node_csi.clone());
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: volume.handle.clone(),
            staging_target_path: mounted.staging.display().to_string(),
        })
        .await?;
        Ok(())
    }

    /// The VolumeAttachment the attach-detach controller creates (and the external-attacher marks
    /// attached) for a volume used on the node: the manager reads it to find the node to call.
    pub async fn attach(&self, volume: &Volume) -> Result<String> {
        let name = format!("csi-demo-{}", volume.pv);
        let attachments = self.stack.applier.api("storage.k8s.io/v1", "VolumeAttachment", "")?;
        let attachment = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": name},
            "spec": {"attacher": DRIVER, "nodeName": NODE, "source": {"persistentVolumeName": volume.pv}},
        }))
        .map_err(|e| crate::Error::Manifest(e.to_string()))?;
        attachments.create(&PostParams::default(), &attachment).await?;
        let attached = json!({"status": {"attached": true}});
        attachments.patch_status(&name, &PatchParams::default(), &Patch::Merge(&attached)).await?;
        Ok(name)
    }
}

/// Writes `bytes` of non-zero data into a file under `dir`, syncs, deletes it and syncs again: the
/// filesystem then has free blocks that the driver's backing file still holds.
pub fn write_and_delete(dir: &std::path::Path, bytes: i64) -> Result<()> {
    use std::io::Write;
    let path = dir.join("scratch.bin");
    let io = |what: &str| crate::Error::io(what.to_owned());
    let mut file = std::fs::File::create(&path).map_err(io(&format!("creating {}", path.display())))?;
    let chunk: Vec<u8> = (0..super::MIB).map(|i| u8::try_from(i % 251 + 1).unwrap_or(1)).collect();
    for _ in 0..bytes / super::MIB {
        file.write_all(&chunk).map_err(io("writing into the volume"))?;
    }
    file.sync_all().map_err(io("syncing the volume"))?;
    drop(file);
    std::fs::remove_file(&path).map_err(io("deleting the file"))?;
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    Ok(())
}
