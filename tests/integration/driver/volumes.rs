//! The reference driver's volumes: snapshots, clones, expansion, and what it does with hostile input.
use std::path::Path;

use api::proto::csi::v1 as csi;
use api::proto::{encryptionkeyrotation as ekr, reclaimspace};

use crate::harness::driver::{Harness, MIB, mount_capability, write_through_mount};

#[tokio::test]
async fn hostile_input_gets_clear_errors_and_writes_nothing_outside_the_state_dir() {
    let h = Harness::start().await;
    let listing = |dir: &Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    let outside = h.driver.dir.path().join("outside.txt");
    std::fs::write(&outside, "keep me").unwrap();
    let before = listing(h.driver.dir.path());

    let mut controller = csi::controller_client::ControllerClient::new(h.csi.clone());
    let create = |name: String, parameters: &[(&str, &str)]| csi::CreateVolumeRequest {
        name,
        capacity_range: Some(csi::CapacityRange { required_bytes: MIB, limit_bytes: 0 }),
        volume_capabilities: vec![mount_capability()],
        parameters: parameters.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..Default::default()
    };
    let code = |r: Result<tonic::Response<csi::CreateVolumeResponse>, tonic::Status>| r.map(|_| ()).unwrap_err().code();
    assert_eq!(code(controller.create_volume(create(String::new(), &[])).await), tonic::Code::InvalidArgument);
    assert_eq!(code(controller.create_volume(create("n".repeat(129), &[])).await), tonic::Code::InvalidArgument);
    assert_eq!(
        code(controller.create_volume(create("ok".into(), &[("replicas", "3")])).await),
        tonic::Code::InvalidArgument
    );
    let with_provisioner_keys = create(
        "named-by-provisioner".into(),
        &[("csi.storage.k8s.io/pvc/name", "data"), ("csi.storage.k8s.io/pvc/namespace", "ns")],
    );
    controller.create_volume(with_provisioner_keys).await.unwrap();
    controller.create_volume(create("../../escape".into(), &[])).await.unwrap(); // names never become paths

    for id in ["../outside.txt", "../../etc/passwd", "..", "a/b", ".state"] {
        controller
            .delete_volume(csi::DeleteVolumeRequest { volume_id: id.into(), ..Default::default() })
            .await
            .unwrap();
        let validate = csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            volume_capabilities: vec![mount_capability()],
            ..Default::default()
        };
        assert_eq!(
            controller.validate_volume_capabilities(validate).await.unwrap_err().code(),
            tonic::Code::NotFound,
            "{id}"
        );
        let mut node = csi::node_client::NodeClient::new(h.csi.clone());
        let stage = csi::NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: h.path("staging-hostile").display().to_string(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        };
        assert_eq!(node.node_stage_volume(stage).await.unwrap_err().code(), tonic::Code::NotFound, "{id}");
        let mut reclaim =
            reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient::new(h.addons.clone());
        let request = reclaimspace::ControllerReclaimSpaceRequest { volume_id: id.into(), ..Default::default() };
        assert_eq!(reclaim.controller_reclaim_space(request).await.unwrap_err().code(), tonic::Code::NotFound, "{id}");
        let mut rotation = ekr::encryption_key_rotation_controller_client::EncryptionKeyRotationControllerClient::new(
            h.addons.clone(),
        );
        let request = ekr::EncryptionKeyRotateRequest { volume_id: id.into(), ..Default::default() };
        assert_eq!(rotation.encryption_key_rotate(request).await.unwrap_err().code(), tonic::Code::NotFound, "{id}");
    }
    let mut node = csi::node_client::NodeClient::new(h.csi.clone());
    let relative = csi::NodeStageVolumeRequest {
        volume_id: "x".into(),
        staging_target_path: "relative/../path".into(),
        volume_capability: Some(mount_capability()),
        ..Default::default()
    };
    assert_eq!(node.node_stage_volume(relative).await.unwrap_err().code(), tonic::Code::InvalidArgument);

    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me");
    assert_eq!(listing(h.driver.dir.path()), before, "entries appeared or vanished next to the state dir");
}

#[tokio::test]
async fn snapshots_restore_and_clones_carry_the_data() {
    if crate::harness::driver::skip_without_loop_devices("snapshots_restore_and_clones_carry_the_data") {
        return;
    }
    let h = Harness::start().await;
    let id = h.create("snapshotted", 32 * MIB).await;
    write_through_mount(&h, &id, "data.bin", 4 * MIB as usize).await;
    let at_snapshot = std::fs::read(h.backing_file(&id)).unwrap();

    let mut controller = csi::controller_client::ControllerClient::new(h.csi.clone());
    let snapshot = h.snapshot(&id, "snap-1").await;
    assert!(snapshot.ready_to_use);
    // The volume changes after the snapshot; the snapshot must not.
    write_through_mount(&h, &id, "later.bin", 2 * MIB as usize).await;

    let from = |source: csi::volume_content_source::Type, name: &str| csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 32 * MIB, limit_bytes: 0 }),
        volume_capabilities: vec![mount_capability()],
        volume_content_source: Some(csi::VolumeContentSource { r#type: Some(source) }),
        ..Default::default()
    };
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let restored = controller
        .create_volume(from(Type::Snapshot(SnapshotSource { snapshot_id: snapshot.snapshot_id.clone() }), "restored"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(
        std::fs::read(h.backing_file(&restored.volume_id)).unwrap() == at_snapshot,
        "the restored volume differs from the snapshot"
    );
    assert!(restored.content_source.is_some());

    let clone = controller
        .create_volume(from(Type::Volume(VolumeSource { volume_id: id.clone() }), "clone"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(
        std::fs::read(h.backing_file(&clone.volume_id)).unwrap() == std::fs::read(h.backing_file(&id)).unwrap(),
        "the clone differs"
    );

    let missing = controller
        .create_volume(from(Type::Snapshot(SnapshotSource { snapshot_id: "missing".into() }), "from-missing"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let other_source = controller
        .create_volume(from(Type::Volume(VolumeSource { volume_id: id.clone() }), "restored"))
        .await
        .unwrap_err();
    assert_eq!(other_source.code(), tonic::Code::AlreadyExists, "same name, other source");
}

#[tokio::test]
async fn an_expanded_volume_has_the_larger_filesystem_once_staged_again() {
    if crate::harness::driver::skip_without_loop_devices(
        "an_expanded_volume_has_the_larger_filesystem_once_staged_again",
    ) {
        return;
    }
    let h = Harness::start().await;
    let id = h.create("growing", 32 * MIB).await;
    let (staging, target) = h.mount(&id).await;
    let size = |path: &Path| {
        let (blocks, fragment) = statfs(path);
        blocks * fragment
    };
    let before = size(&target);
    assert!(before < 32 * MIB as u64, "{before}");
    h.unmount(&id, &staging, &target).await;

    let mut controller = csi::controller_client::ControllerClient::new(h.csi.clone());
    let expand = csi::ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 96 * MIB, limit_bytes: 0 }),
        ..Default::default()
    };
    let expanded = controller.controller_expand_volume(expand.clone()).await.unwrap().into_inner();
    assert_eq!(expanded.capacity_bytes, 96 * MIB);
    assert!(expanded.node_expansion_required);
    assert_eq!(std::fs::metadata(h.backing_file(&id)).unwrap().len(), 96 * MIB as u64);
    // Asking again changes nothing.
    assert_eq!(controller.controller_expand_volume(expand).await.unwrap().into_inner().capacity_bytes, 96 * MIB);

    let (staging, target) = h.mount(&id).await;
    let after = size(&target);
    assert!(after > 80 * MIB as u64, "the filesystem did not grow: {before} -> {after}");
    h.unmount(&id, &staging, &target).await;
}

/// (block count, fragment size) of the filesystem at `path`, from `stat -f`.
fn statfs(path: &Path) -> (u64, u64) {
    let out = std::process::Command::new("stat").args(["-f", "-c", "%b %S"]).arg(path).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut parts = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

/// Machines without loop devices keep filesystem volumes as directories: data written through
/// the published path lands in the volume, snapshots and clones copy the tree, reclaim space has
/// nothing to release (pre = post), and nothing needs a loop device.
#[tokio::test]
async fn directory_volumes_hold_data_through_publish_snapshot_and_reclaim() {
    let h = Harness::start_with(&["--filesystem-backend=directory"]).await;
    let id = h.create("directory-volume", 16 * MIB).await;
    assert!(h.backing_file(&id).is_dir(), "a directory volume was not made");
    let (staging, target) = h.mount(&id).await;
    std::fs::create_dir_all(target.join("sub")).unwrap();
    std::fs::write(target.join("sub/hello.txt"), b"hello").unwrap();
    assert_eq!(std::fs::read(h.backing_file(&id).join("sub/hello.txt")).unwrap(), b"hello");

    let mut controller = csi::controller_client::ControllerClient::new(h.csi.clone());
    let snapshot = h.snapshot(&id, "dir-snap").await;
    std::fs::write(target.join("sub/hello.txt"), b"changed").unwrap();
    use csi::volume_content_source::{SnapshotSource, Type};
    let restored = controller
        .create_volume(csi::CreateVolumeRequest {
            name: "dir-restored".into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 16 * MIB, limit_bytes: 0 }),
            volume_capabilities: vec![mount_capability()],
            volume_content_source: Some(csi::VolumeContentSource {
                r#type: Some(Type::Snapshot(SnapshotSource { snapshot_id: snapshot.snapshot_id })),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(std::fs::read(h.backing_file(&restored.volume_id).join("sub/hello.txt")).unwrap(), b"hello");

    let mut node = csi::node_client::NodeClient::new(h.csi.clone());
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.volume_condition.map(|c| c.abnormal), Some(false));

    let reclaimed = reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient::new(h.addons.clone())
        .node_reclaim_space(reclaimspace::NodeReclaimSpaceRequest {
            volume_id: id.clone(),
            volume_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (pre, post) = (reclaimed.pre_usage.unwrap().usage_bytes, reclaimed.post_usage.unwrap().usage_bytes);
    assert_eq!(pre, post, "a directory volume has nothing to release");
    assert!(post > 0);

    h.unmount(&id, &staging, &target).await;
    controller.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.unwrap();
    assert!(!h.backing_file(&id).exists(), "the directory was not removed");
}

/// The identity endpoint the driver operator asks: over TCP, CSI Identity alone, with the storage
/// profiles served here in GetPluginInfo's manifest; a StorageClass's `profile` parameter must
/// name one of them and fit the volume mode. None while the state directory cannot be written.
#[tokio::test]
async fn the_identity_endpoint_lists_the_profiles_a_class_can_ask_for() {
    let port = crate::harness::sidecar::free_port();
    let address = format!("--identity-address=127.0.0.1:{port}");
    let h = Harness::start_with(&[address.as_str(), "--filesystem-backend=directory"]).await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap().connect().await.unwrap();
    let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
    let info = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.manifest.get("profiles").map(String::as_str), Some("directory"));
    let mut controller = csi::controller_client::ControllerClient::new(channel);
    let refused = controller.list_volumes(csi::ListVolumesRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "only Identity is served over TCP");

    let request = |profile: &str| csi::CreateVolumeRequest {
        name: format!("vol-{profile}"),
        volume_capabilities: vec![mount_capability()],
        parameters: [("profile".to_owned(), profile.to_owned())].into(),
        ..Default::default()
    };
    let mut controller = csi::controller_client::ControllerClient::new(h.csi.clone());
    let wrong = controller.create_volume(request("block")).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::InvalidArgument);
    assert!(wrong.message().contains("directories"), "{}", wrong.message());
    controller.create_volume(request("directory")).await.unwrap();

    // The backend goes away (its directory turns read-only, as a failing disk's does): no
    // profile is served; it comes back with the directory.
    let state = h.path("state");
    let mount = |args: &[&std::ffi::OsStr]| {
        let status = std::process::Command::new("mount").args(args).status().unwrap();
        assert!(status.success(), "mount {args:?}");
    };
    mount(&["--bind".as_ref(), state.as_os_str(), state.as_os_str()]);
    mount(&["-o".as_ref(), "remount,bind,ro".as_ref(), state.as_os_str()]);
    let gone = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
    let status = std::process::Command::new("umount").arg(&state).status().unwrap();
    assert!(status.success());
    assert_eq!(gone.manifest.get("profiles").map(String::as_str), Some(""), "a read-only backend serves nothing");
    let back = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(back.manifest.get("profiles").map(String::as_str), Some("directory"));
}
