//! Helpers for the reference-driver suites: a driver process with clients on both sockets.
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use api::proto::csi::v1 as csi;
use tonic::transport::Channel;

use crate::harness::driver_process::{DriverProcess, start_driver};
use crate::harness::support::unix_channel;

pub const MIB: i64 = 1 << 20;

/// Whether a test that needs loop devices (loop-backed filesystems, raw block volumes, fstrim)
/// must skip on this machine; it says why on stderr.
pub fn skip_without_loop_devices(test: &str) -> bool {
    match reference_driver::mounts::loop_unavailable_reason() {
        Some(why) => {
            eprintln!("{test}: skipped: loop devices are unusable here ({why})");
            true
        }
        None => false,
    }
}

pub fn mount_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

pub struct Harness {
    pub driver: DriverProcess,
    pub csi: Channel,
    pub addons: Channel,
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    pub async fn start_with(args: &[&str]) -> Self {
        let driver = start_driver(args);
        let csi = unix_channel(&driver.endpoint).await.unwrap();
        let addons = unix_channel(&driver.addons_endpoint).await.unwrap();
        Harness { driver, csi, addons }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.driver.dir.path().join(name)
    }

    pub fn backing_file(&self, id: &str) -> PathBuf {
        self.path("state").join("volumes").join(format!("{id}.img"))
    }

    pub async fn create(&self, name: &str, bytes: i64) -> String {
        let request = csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
            volume_capabilities: vec![mount_capability()],
            ..Default::default()
        };
        let mut controller = csi::controller_client::ControllerClient::new(self.csi.clone());
        controller.create_volume(request).await.unwrap().into_inner().volume.unwrap().volume_id
    }

    /// A snapshot of volume `id`.
    pub async fn snapshot(&self, id: &str, name: &str) -> csi::Snapshot {
        let request =
            csi::CreateSnapshotRequest { source_volume_id: id.into(), name: name.into(), ..Default::default() };
        let mut controller = csi::controller_client::ControllerClient::new(self.csi.clone());
        controller.create_snapshot(request).await.unwrap().into_inner().snapshot.unwrap()
    }

    /// Stages and publishes `id`; returns (staging, target).
    pub async fn mount(&self, id: &str) -> (PathBuf, PathBuf) {
        let staging = self.stage(id).await;
        let target = self.path(&format!("target-{id}"));
        self.publish(id, &staging, &target).await.unwrap();
        (staging, target)
    }

    pub async fn stage(&self, id: &str) -> PathBuf {
        let staging = self.path(&format!("staging-{id}"));
        let mut node = csi::node_client::NodeClient::new(self.csi.clone());
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await
        .unwrap();
        staging
    }

    pub async fn publish(&self, id: &str, staging: &Path, target: &Path) -> Result<(), tonic::Status> {
        let mut node = csi::node_client::NodeClient::new(self.csi.clone());
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await
        .map(|_| ())
    }

    pub async fn unmount(&self, id: &str, staging: &Path, target: &Path) {
        let mut node = csi::node_client::NodeClient::new(self.csi.clone());
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
    }
}

pub fn allocated(path: &Path) -> i64 {
    i64::try_from(std::fs::metadata(path).unwrap().blocks() * 512).unwrap()
}

/// Writes `bytes` of non-zero data into a file under `dir`, syncs, deletes it and syncs again: the
/// filesystem now has free blocks the backing file still holds.
pub fn write_and_delete(dir: &Path, bytes: usize) {
    let path = dir.join("scratch.bin");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk: Vec<u8> = (0..MIB as usize).map(|i| (i % 251 + 1) as u8).collect();
    for _ in 0..bytes / MIB as usize {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    std::fs::remove_file(&path).unwrap();
    std::process::Command::new("sync").status().unwrap();
}

/// Writes a file of `bytes` with a recognisable pattern through a real mount, then unmounts so the
/// backing file holds everything and nothing writes to it any more.
pub async fn write_through_mount(h: &Harness, id: &str, file: &str, bytes: usize) {
    let (staging, target) = h.mount(id).await;
    let mut f = std::fs::File::create(target.join(file)).unwrap();
    let chunk: Vec<u8> = (0..MIB as usize).map(|i| (i * 7 % 253) as u8).collect();
    for _ in 0..bytes / MIB as usize {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    h.unmount(id, &staging, &target).await;
}
