//! The reference driver, as a real process on a real Unix socket, against csi-sanity v5.4.0.
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::driver_process::{reference_driver, start_driver};
use crate::harness::support::test_peer;

/// Runs csi-sanity with `args` and returns its output and whether it succeeded.
fn csi_sanity(args: &[String]) -> (bool, String) {
    let out = Command::new(test_peer("CSI_SANITY", "csi-sanity.sh")).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn the_driver_passes_csi_sanity_with_filesystem_volumes() {
    passes_csi_sanity("mount");
}

#[test]
fn the_driver_passes_csi_sanity_with_raw_block_volumes() {
    if crate::harness::driver::skip_without_loop_devices("csi-sanity with raw block volumes") {
        return;
    }
    passes_csi_sanity("block");
}

/// Where loop devices are missing, filesystem volumes are plain directories, bind-mounted: the
/// same conformance suite, forced here so it runs on every machine.
#[test]
fn the_driver_passes_csi_sanity_with_directory_volumes() {
    passes_csi_sanity_with("mount", &["--filesystem-backend=directory"]);
}

fn passes_csi_sanity(access_type: &str) {
    passes_csi_sanity_with(access_type, &[]);
}

fn passes_csi_sanity_with(access_type: &str, driver_args: &[&str]) {
    let driver = start_driver(driver_args);
    let (ok, output) = csi_sanity(&[
        format!("--csi.endpoint={}", driver.endpoint),
        format!("--csi.mountdir={}", driver.dir.path().join("mnt").display()),
        format!("--csi.stagingdir={}", driver.dir.path().join("staging").display()),
        format!("--csi.testvolumeaccesstype={access_type}"),
    ]);
    let summary =
        output.lines().filter(|l| l.contains("Passed") && l.contains("Failed")).collect::<Vec<_>>().join("\n");
    assert!(ok, "csi-sanity failed:\n{output}");
    assert!(summary.contains("0 Failed"), "{summary}");
    eprintln!("csi-sanity ({access_type} {driver_args:?}): {summary}");
}

#[tokio::test]
async fn volumes_fences_groups_and_replications_survive_kill_9_of_the_driver() {
    use api::proto::csi::v1 as csi;
    use csi::controller_client::ControllerClient;

    let mut driver = start_driver(&[]);
    let capability = csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    };
    let mut client = ControllerClient::new(crate::harness::support::unix_channel(&driver.endpoint).await.unwrap());
    let mut created = Vec::new();
    for name in ["a", "b", "c"] {
        let request = csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 20, limit_bytes: 0 }),
            volume_capabilities: vec![capability.clone()],
            ..Default::default()
        };
        created.push(client.create_volume(request).await.unwrap().into_inner().volume.unwrap().volume_id);
    }
    created.sort();
    // Fence, group and replication state too.
    use api::proto::{fence, replication as repl, volumegroup as vg};
    let addons = crate::harness::support::unix_channel(&driver.addons_endpoint).await.unwrap();
    let cidr = fence::Cidr { cidr: "192.0.2.0/24".into() };
    let fence_request = fence::FenceClusterNetworkRequest { cidrs: vec![cidr.clone()], ..Default::default() };
    fence::fence_controller_client::FenceControllerClient::new(addons.clone())
        .fence_cluster_network(fence_request)
        .await
        .unwrap();
    let group =
        vg::CreateVolumeGroupRequest { name: "g".into(), volume_ids: vec![created[0].clone()], ..Default::default() };
    let group_id = vg::controller_client::ControllerClient::new(addons.clone())
        .create_volume_group(group)
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap()
        .volume_group_id;
    let source = repl::ReplicationSource {
        r#type: Some(repl::replication_source::Type::Volume(repl::replication_source::VolumeSource {
            volume_id: created[1].clone(),
        })),
    };
    let enable =
        repl::EnableVolumeReplicationRequest { replication_source: Some(source.clone()), ..Default::default() };
    repl::controller_client::ControllerClient::new(addons).enable_volume_replication(enable).await.unwrap();

    // SIGKILL: no shutdown path runs.
    driver.kill_and_restart();
    let state_dir = driver.dir.path().join("state");
    // The killed driver's socket file is still there until the new process replaces it: retry
    // until the new process answers.
    let listed = testenv::poll::until(Duration::from_secs(30), async || {
        let channel = crate::harness::support::unix_channel(&driver.endpoint).await.ok()?;
        ControllerClient::new(channel).list_volumes(csi::ListVolumesRequest::default()).await.ok()
    })
    .await
    .expect("the restarted driver never answered")
    .into_inner();
    let mut ids: Vec<String> = listed.entries.into_iter().map(|e| e.volume.unwrap().volume_id).collect();
    ids.sort();
    assert_eq!(ids, created);
    for id in &created {
        assert!(state_dir.join("volumes").join(format!("{id}.img")).exists(), "data of {id} lost");
    }
    let addons = crate::harness::support::unix_channel(&driver.addons_endpoint).await.unwrap();
    let fenced = fence::fence_controller_client::FenceControllerClient::new(addons.clone())
        .list_cluster_fence(fence::ListClusterFenceRequest::default())
        .await
        .unwrap()
        .into_inner()
        .cidrs;
    assert_eq!(fenced, vec![cidr], "fence lost");
    let get = vg::ControllerGetVolumeGroupRequest { volume_group_id: group_id, ..Default::default() };
    let members = vg::controller_client::ControllerClient::new(addons.clone())
        .controller_get_volume_group(get)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(members.volume_group.unwrap().volumes.len(), 1, "group lost");
    let info = repl::GetVolumeReplicationInfoRequest { replication_source: Some(source), ..Default::default() };
    let info = repl::controller_client::ControllerClient::new(addons)
        .get_volume_replication_info(info)
        .await
        .unwrap()
        .into_inner();
    assert!(info.last_sync_time.is_some(), "replication lost");
}

/// A driver process in `mode` on a shared state directory, with its own sockets.
fn start_on_state(dir: &std::path::Path, name: &str, args: &[&str]) -> (Child, String, String) {
    let endpoint = format!("unix://{}", dir.join(format!("{name}.sock")).display());
    let addons = format!("unix://{}", dir.join(format!("{name}-addons.sock")).display());
    let child = Command::new(reference_driver())
        .args(["--endpoint", &endpoint, "--addons-endpoint", &addons, "--node-id", "node-1", "--state-dir"])
        .arg(dir.join("state"))
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dir.join(format!("{name}-addons.sock")).exists() {
        assert!(Instant::now() < deadline, "{name} did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, endpoint, addons)
}

#[tokio::test]
async fn controller_and_node_processes_share_one_state_without_losing_writes() {
    use api::proto::csi::v1 as csi;
    use api::proto::fence;
    let dir = tempfile::tempdir().unwrap();
    let (mut controller, controller_csi, controller_addons) =
        start_on_state(dir.path(), "controller", &["--mode", "controller"]);
    let (mut node, node_csi, _) = start_on_state(dir.path(), "node", &["--mode", "node", "--node-ip", "198.51.100.7"]);

    let capability = csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    };
    let create = csi::CreateVolumeRequest {
        name: "shared".into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 16 << 20, limit_bytes: 0 }),
        volume_capabilities: vec![capability.clone()],
        ..Default::default()
    };
    let channel = crate::harness::support::unix_channel(&controller_csi).await.unwrap();
    let id = csi::controller_client::ControllerClient::new(channel)
        .create_volume(create)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;

    // The controller fences after the node registered itself: both writes must stand.
    let addons = crate::harness::support::unix_channel(&controller_addons).await.unwrap();
    let mut fences = fence::fence_controller_client::FenceControllerClient::new(addons);
    let request = fence::FenceClusterNetworkRequest {
        cidrs: vec![fence::Cidr { cidr: "198.51.100.0/24".into() }],
        ..Default::default()
    };
    fences.fence_cluster_network(request).await.unwrap();
    let clients =
        fences.get_fence_clients(fence::GetFenceClientsRequest::default()).await.unwrap().into_inner().clients;
    assert_eq!(
        clients.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["node-1"],
        "the node's registration was lost"
    );

    // The node process sees the controller's volume and its fence.
    let mut node_client =
        csi::node_client::NodeClient::new(crate::harness::support::unix_channel(&node_csi).await.unwrap());
    let staging = dir.path().join("staging");
    let stage = csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability.clone()),
        ..Default::default()
    };
    node_client.node_stage_volume(stage).await.unwrap();
    let publish = csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: dir.path().join("target").display().to_string(),
        volume_capability: Some(capability),
        ..Default::default()
    };
    let refused = node_client.node_publish_volume(publish).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    let unstage = csi::NodeUnstageVolumeRequest { volume_id: id, staging_target_path: staging.display().to_string() };
    node_client.node_unstage_volume(unstage).await.unwrap();

    for child in [&mut controller, &mut node] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[tokio::test]
async fn failed_calls_are_logged_without_secrets_and_sigterm_removes_the_sockets() {
    use api::proto::csi::v1 as csi;
    const SENTINEL: &str = "s3cr3t-that-must-not-be-logged";
    let mut driver = start_driver(&[]);
    let mut node =
        csi::node_client::NodeClient::new(crate::harness::support::unix_channel(&driver.endpoint).await.unwrap());
    let stage = csi::NodeStageVolumeRequest {
        volume_id: "no-such-volume".into(),
        staging_target_path: driver.dir.path().join("staging").display().to_string(),
        volume_capability: Some(csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode { mode: 1 }),
            access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
        }),
        secrets: [("token".to_owned(), SENTINEL.to_owned())].into_iter().collect(),
        ..Default::default()
    };
    assert_eq!(node.node_stage_volume(stage).await.unwrap_err().code(), tonic::Code::NotFound);

    // The client stays connected: shutdown must not wait for it beyond the grace period.
    let pid = driver.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = driver.child.wait().unwrap();
    drop(node);
    assert!(status.success(), "the driver did not exit cleanly: {status}");
    for endpoint in [&driver.endpoint, &driver.addons_endpoint] {
        let socket = std::path::Path::new(endpoint.strip_prefix("unix://").unwrap());
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
    let log = std::fs::read_to_string(driver.dir.path().join("driver.log")).unwrap();
    let failures: Vec<&str> = log.lines().filter(|l| l.contains("call failed")).collect();
    assert_eq!(failures.len(), 1, "{log}");
    assert!(failures[0].contains("/csi.v1.Node/NodeStageVolume") && failures[0].contains("NotFound"), "{log}");
    assert!(!log.contains(SENTINEL), "a secret reached the log:\n{log}");
}
