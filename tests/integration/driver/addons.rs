//! The reference driver's CSI-Addons services, each shown by its effect on the machine.
use api::proto::csi::v1 as csi;
use api::proto::{encryptionkeyrotation as ekr, fence, identity, reclaimspace, replication as repl, volumegroup as vg};
use tonic::transport::Channel;

use crate::harness::driver::{Harness, MIB, allocated, mount_capability, write_and_delete, write_through_mount};

#[tokio::test]
async fn node_reclaim_space_gives_freed_blocks_back_to_the_host() {
    if crate::harness::driver::skip_without_loop_devices("node_reclaim_space_gives_freed_blocks_back_to_the_host") {
        return;
    }
    let h = Harness::start().await;
    let id = h.create("reclaim-online", 128 * MIB).await;
    let (staging, target) = h.mount(&id).await;
    write_and_delete(&target, 32 * MIB as usize);
    let before = allocated(&h.backing_file(&id));
    assert!(before >= 32 * MIB, "the written data is allocated in the backing file: {before}");

    let mut node = reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient::new(h.addons.clone());
    // As upstream's sidecar calls it: no volume_path, only a staging path.
    let response = node
        .node_reclaim_space(reclaimspace::NodeReclaimSpaceRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (pre, post) = (response.pre_usage.unwrap().usage_bytes, response.post_usage.unwrap().usage_bytes);
    let after = allocated(&h.backing_file(&id));
    assert_eq!(post, after, "post_usage is what the backing file now holds");
    assert!(pre - post >= 30 * MIB, "reclaimed only {} bytes (pre {pre}, post {post})", pre - post);
    h.unmount(&id, &staging, &target).await;
}

#[tokio::test]
async fn controller_reclaim_space_trims_an_unmounted_volume() {
    if crate::harness::driver::skip_without_loop_devices("controller_reclaim_space_trims_an_unmounted_volume") {
        return;
    }
    let h = Harness::start().await;
    let id = h.create("reclaim-offline", 128 * MIB).await;
    let (staging, target) = h.mount(&id).await;
    write_and_delete(&target, 32 * MIB as usize);
    h.unmount(&id, &staging, &target).await;

    let mut controller =
        reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient::new(h.addons.clone());
    let response = controller
        .controller_reclaim_space(reclaimspace::ControllerReclaimSpaceRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (pre, post) = (response.pre_usage.unwrap().usage_bytes, response.post_usage.unwrap().usage_bytes);
    assert_eq!(post, allocated(&h.backing_file(&id)));
    assert!(pre - post >= 30 * MIB, "reclaimed only {} bytes (pre {pre}, post {post})", pre - post);
    // The private mount is gone and the loop device detached.
    let losetup = std::process::Command::new("losetup").args(["-j"]).arg(h.backing_file(&id)).output().unwrap();
    assert!(losetup.stdout.is_empty(), "{}", String::from_utf8_lossy(&losetup.stdout));

    let missing = controller
        .controller_reclaim_space(reclaimspace::ControllerReclaimSpaceRequest {
            volume_id: "no-such-volume".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn key_rotation_replaces_the_volumes_key_id() {
    let h = Harness::start().await;
    let id = h.create("keys", 16 * MIB).await;
    let key_id = || {
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(h.path("state").join("state.json")).unwrap()).unwrap();
        state["volumes"][&id]["key_id"].as_str().map(str::to_owned)
    };
    let mut rotation =
        ekr::encryption_key_rotation_controller_client::EncryptionKeyRotationControllerClient::new(h.addons.clone());
    let rotate =
        |volume_id: &str| ekr::EncryptionKeyRotateRequest { volume_id: volume_id.into(), ..Default::default() };
    rotation.encryption_key_rotate(rotate(&id)).await.unwrap();
    let first = key_id().expect("a key id after the first rotation");
    rotation.encryption_key_rotate(rotate(&id)).await.unwrap();
    let second = key_id().unwrap();
    assert_ne!(first, second);
    assert_eq!(rotation.encryption_key_rotate(rotate("unknown")).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(rotation.encryption_key_rotate(rotate("")).await.unwrap_err().code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn addons_identity_reports_what_the_driver_serves() {
    let h = Harness::start().await;
    let mut client = identity::identity_client::IdentityClient::new(h.addons.clone());
    assert_eq!(
        client.get_identity(identity::GetIdentityRequest {}).await.unwrap().into_inner().name,
        "reference.csi-addons-rs.io"
    );
    let caps = client.get_capabilities(identity::GetCapabilitiesRequest {}).await.unwrap().into_inner().capabilities;
    let rendered: Vec<String> = caps.iter().map(|c| format!("{:?}", c.r#type)).collect();
    for wanted in [
        "ControllerService",
        "NodeService",
        "Offline",
        "Online",
        "Encryptionkeyrotation",
        "NetworkFence { r#type: NetworkFence }",
        "GetClientsToFence",
        "VolumeReplication { r#type: VolumeReplication }",
        "GetReplicationDestinationInfo",
        "VolumeGroup { r#type: VolumeGroup }",
        "LimitVolumeToOneVolumeGroup",
    ] {
        assert!(rendered.iter().any(|r| r.contains(wanted)), "{wanted} missing from {rendered:?}");
    }
}

#[tokio::test]
async fn a_fenced_node_cannot_publish_until_unfenced() {
    if crate::harness::driver::skip_without_loop_devices("a_fenced_node_cannot_publish_until_unfenced") {
        return;
    }
    let h = Harness::start_with(&["--node-ip", "10.1.2.3"]).await;
    let mut fences = fence::fence_controller_client::FenceControllerClient::new(h.addons.clone());
    let clients =
        fences.get_fence_clients(fence::GetFenceClientsRequest::default()).await.unwrap().into_inner().clients;
    assert_eq!(clients.len(), 1);
    assert_eq!(clients[0].id, "node-1");
    assert_eq!(clients[0].addresses[0].cidr, "10.1.2.3/32");

    let id = h.create("fenced", 16 * MIB).await;
    let staging = h.stage(&id).await;
    let target = h.path("fenced-target");
    let cidrs = |list: &[&str]| list.iter().map(|c| fence::Cidr { cidr: (*c).into() }).collect::<Vec<_>>();
    let fence_request = fence::FenceClusterNetworkRequest { cidrs: cidrs(&["10.1.2.0/24"]), ..Default::default() };
    fences.fence_cluster_network(fence_request.clone()).await.unwrap();
    fences.fence_cluster_network(fence_request).await.unwrap(); // idempotent
    let listed = fences.list_cluster_fence(fence::ListClusterFenceRequest::default()).await.unwrap().into_inner().cidrs;
    assert_eq!(listed, cidrs(&["10.1.2.0/24"]));

    let refused = h.publish(&id, &staging, &target).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("10.1.2.0/24"), "{}", refused.message());

    let unfence = fence::UnfenceClusterNetworkRequest { cidrs: cidrs(&["10.1.2.0/24"]), ..Default::default() };
    fences.unfence_cluster_network(unfence).await.unwrap();
    h.publish(&id, &staging, &target).await.unwrap();
    h.unmount(&id, &staging, &target).await;

    for bad in [vec![], cidrs(&["10.1.2.0/33"]), cidrs(&["not-an-address"])] {
        let request = fence::FenceClusterNetworkRequest { cidrs: bad.clone(), ..Default::default() };
        let err = fences.fence_cluster_network(request).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}");
    }
}

#[tokio::test]
async fn volume_group_membership_changes_and_its_rules() {
    let h = Harness::start().await;
    let (a, b, c) = (h.create("g-a", MIB).await, h.create("g-b", MIB).await, h.create("g-c", MIB).await);
    let mut groups = vg::controller_client::ControllerClient::new(h.addons.clone());
    let members = |group: &vg::VolumeGroup| {
        let mut ids: Vec<String> = group.volumes.iter().map(|v| v.volume_id.clone()).collect();
        ids.sort();
        ids
    };
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    let create = |name: &str, ids: Vec<String>| vg::CreateVolumeGroupRequest {
        name: name.into(),
        volume_ids: ids,
        ..Default::default()
    };

    let group = groups
        .create_volume_group(create("group-1", vec![a.clone(), b.clone()]))
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    assert_eq!(members(&group), sorted(vec![a.clone(), b.clone()]));
    let again = groups
        .create_volume_group(create("group-1", vec![a.clone(), b.clone()]))
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    assert_eq!(again.volume_group_id, group.volume_group_id, "create is idempotent");
    let clash = groups.create_volume_group(create("group-1", vec![a.clone()])).await.unwrap_err();
    assert_eq!(clash.code(), tonic::Code::AlreadyExists);
    let taken = groups.create_volume_group(create("group-2", vec![b.clone()])).await.unwrap_err();
    assert_eq!(taken.code(), tonic::Code::FailedPrecondition, "a volume is in one group at most");

    let mut controller = csi::controller_client::ControllerClient::new(h.csi.clone());
    let in_group = controller
        .delete_volume(csi::DeleteVolumeRequest { volume_id: a.clone(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(in_group.code(), tonic::Code::FailedPrecondition);

    let modify = |ids: Vec<String>| vg::ModifyVolumeGroupMembershipRequest {
        volume_group_id: group.volume_group_id.clone(),
        volume_ids: ids,
        ..Default::default()
    };
    let modified = groups
        .modify_volume_group_membership(modify(vec![b.clone(), c.clone()]))
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    assert_eq!(members(&modified), sorted(vec![b.clone(), c.clone()]));
    let got = groups
        .controller_get_volume_group(vg::ControllerGetVolumeGroupRequest {
            volume_group_id: group.volume_group_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    assert_eq!(members(&got), sorted(vec![b.clone(), c.clone()]));
    // a left the group, so it can be deleted now.
    controller.delete_volume(csi::DeleteVolumeRequest { volume_id: a.clone(), ..Default::default() }).await.unwrap();

    let delete =
        || vg::DeleteVolumeGroupRequest { volume_group_id: group.volume_group_id.clone(), ..Default::default() };
    assert_eq!(groups.delete_volume_group(delete()).await.unwrap_err().code(), tonic::Code::FailedPrecondition);
    groups.modify_volume_group_membership(modify(vec![])).await.unwrap();
    groups.delete_volume_group(delete()).await.unwrap();
    groups.delete_volume_group(delete()).await.unwrap(); // idempotent
    let gone = groups
        .controller_get_volume_group(vg::ControllerGetVolumeGroupRequest {
            volume_group_id: group.volume_group_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    let missing_volume =
        groups.create_volume_group(create("group-3", vec!["no-such-volume".into()])).await.unwrap_err();
    assert_eq!(missing_volume.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn replication_copies_volume_data_to_the_second_site() {
    if crate::harness::driver::skip_without_loop_devices("replication_copies_volume_data_to_the_second_site") {
        return;
    }
    let h = Harness::start().await;
    let id = h.create("replicated", 64 * MIB).await;
    write_through_mount(&h, &id, "first.bin", 8 * MIB as usize).await;

    let mut client = repl::controller_client::ControllerClient::new(h.addons.clone());
    let source = || {
        Some(repl::ReplicationSource {
            r#type: Some(repl::replication_source::Type::Volume(repl::replication_source::VolumeSource {
                volume_id: id.clone(),
            })),
        })
    };
    let parameters = std::collections::HashMap::from([("schedulingInterval".to_owned(), "1s".to_owned())]);
    let enable = repl::EnableVolumeReplicationRequest {
        parameters: parameters.clone(),
        replication_source: source(),
        ..Default::default()
    };
    client.enable_volume_replication(enable.clone()).await.unwrap();
    client.enable_volume_replication(enable).await.unwrap(); // idempotent

    let destination = client
        .get_replication_destination_info(repl::GetReplicationDestinationInfoRequest {
            replication_source: source(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .replication_destination
        .unwrap();
    let Some(repl::replication_destination::Type::Volume(dest)) = destination.r#type else { panic!("{destination:?}") };
    let replica = h.path("state").join("site-b").join("volumes").join(format!("{}.img", dest.volume_id));
    assert!(
        std::fs::read(h.backing_file(&id)).unwrap() == std::fs::read(&replica).unwrap(),
        "the replica differs from the volume"
    );

    let info = |client: &mut repl::controller_client::ControllerClient<Channel>| {
        let request = repl::GetVolumeReplicationInfoRequest { replication_source: source(), ..Default::default() };
        let mut client = client.clone();
        async move { client.get_volume_replication_info(request).await.map(tonic::Response::into_inner) }
    };
    let first = info(&mut client).await.unwrap();
    assert!(first.last_sync_bytes >= 8 * MIB, "{first:?}");
    assert_eq!(first.status, repl::get_volume_replication_info_response::Status::Healthy as i32);

    // New data is picked up by the schedule (every second here).
    write_through_mount(&h, &id, "second.bin", 4 * MIB as usize).await;
    let written = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let mut last = None;
    let synced = testenv::poll::until(std::time::Duration::from_secs(20), async || {
        let now = info(&mut client).await.unwrap();
        let synced = now.last_sync_time.as_ref().unwrap().seconds > written;
        last = Some(now);
        synced.then(|| last.clone())
    })
    .await
    .flatten();
    let synced = synced.unwrap_or_else(|| panic!("no sync after the second write: {last:?}"));
    assert!(synced.last_sync_bytes >= 12 * MIB, "{synced:?}");
    assert!(
        std::fs::read(h.backing_file(&id)).unwrap() == std::fs::read(&replica).unwrap(),
        "the replica missed the second write"
    );

    let resync = || repl::ResyncVolumeRequest { replication_source: source(), ..Default::default() };
    assert_eq!(
        client.resync_volume(resync()).await.unwrap_err().code(),
        tonic::Code::FailedPrecondition,
        "a primary does not resync"
    );
    client
        .demote_volume(repl::DemoteVolumeRequest { replication_source: source(), ..Default::default() })
        .await
        .unwrap();
    assert!(client.resync_volume(resync()).await.unwrap().into_inner().ready);
    client
        .promote_volume(repl::PromoteVolumeRequest { replication_source: source(), ..Default::default() })
        .await
        .unwrap();

    client
        .disable_volume_replication(repl::DisableVolumeReplicationRequest {
            replication_source: source(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!replica.exists(), "disabling removes the replica");
    assert_eq!(info(&mut client).await.unwrap_err().code(), tonic::Code::FailedPrecondition);
    let promote =
        client.promote_volume(repl::PromoteVolumeRequest { replication_source: source(), ..Default::default() }).await;
    assert_eq!(promote.unwrap_err().code(), tonic::Code::FailedPrecondition);

    let bad_interval = repl::EnableVolumeReplicationRequest {
        parameters: std::collections::HashMap::from([("schedulingInterval".to_owned(), "soon".to_owned())]),
        replication_source: source(),
        ..Default::default()
    };
    assert_eq!(client.enable_volume_replication(bad_interval).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let unknown = repl::EnableVolumeReplicationRequest {
        replication_source: Some(repl::ReplicationSource {
            r#type: Some(repl::replication_source::Type::Volume(repl::replication_source::VolumeSource {
                volume_id: "nope".into(),
            })),
        }),
        ..Default::default()
    };
    assert_eq!(client.enable_volume_replication(unknown).await.unwrap_err().code(), tonic::Code::NotFound);
}
