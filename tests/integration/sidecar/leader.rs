//! Sidecars of one controller driver elect one Lease holder, which alone serves controller
//! operations that change something (reads and node calls are served by all); the other takes
//! over when the holder stops. And a driver restart is survived.
use std::time::Duration;

use api::proto::identity::{ProbeRequest, identity_client::IdentityClient};
use api::proto::internal as pb;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tonic::Code;

use crate::harness::driver_process::start_driver;
use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{Serving, SidecarProcess, Workload, plain_channel, sidecar_pod};

const DRIVER: &str = "Leader.CSI-Addons-RS.io";

async fn reclaim(sidecar: &SidecarProcess, pv_name: &str) -> Result<(), tonic::Status> {
    let channel = plain_channel(sidecar.port).await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    pb::reclaim_space_client::ReclaimSpaceClient::new(channel)
        .controller_reclaim_space(pb::ReclaimSpaceRequest { pv_name: pv_name.into() })
        .await
        .map(|_| ())
}

async fn holder(api: &Api<Lease>, name: &str) -> Option<String> {
    api.get_opt(name).await.unwrap()?.spec?.holder_identity
}

/// A sidecar that does not hold the Lease serves what upstream serves on every replica: reads
/// (fence clients, replication info) and the calls the manager sends to a node's sidecar (node
/// reclaim space, key rotation). It refuses calls that change the driver's state.
async fn standby_serves_reads_and_node_calls_and_refuses_changes(standby: &SidecarProcess, lease: &str) {
    let channel = plain_channel(standby.port).await.unwrap();
    let clients = pb::network_fence_client::NetworkFenceClient::new(channel.clone())
        .get_fence_clients(pb::FenceClientsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(clients.clients[0].id, "client-1");
    let mut replication = pb::replication_client::ReplicationClient::new(channel.clone());
    let volume = |id: &str| pb::ReplicationSource {
        r#type: Some(pb::replication_source::Type::Volume(pb::replication_source::VolumeSource {
            volume_id: id.into(),
        })),
    };
    let info = pb::GetVolumeReplicationInfoRequest { replication_source: Some(volume("v-1")), ..Default::default() };
    assert_eq!(replication.get_volume_replication_info(info).await.unwrap().into_inner().last_sync_bytes, 4096);
    // A missing PV is the caller's error: the call got past any leadership check.
    let rotate = pb::encryption_key_rotation_client::EncryptionKeyRotationClient::new(channel.clone())
        .encryption_key_rotate(pb::EncryptionKeyRotateRequest { pv_name: "no-such-pv".into() })
        .await
        .unwrap_err();
    assert_eq!(rotate.code(), Code::InvalidArgument, "{rotate:?}");
    let node_reclaim = pb::reclaim_space_client::ReclaimSpaceClient::new(channel.clone())
        .node_reclaim_space(pb::ReclaimSpaceRequest { pv_name: "no-such-pv".into() })
        .await
        .unwrap_err();
    assert_eq!(node_reclaim.code(), Code::InvalidArgument, "{node_reclaim:?}");
    // Changes are the holder's alone.
    let fence = pb::NetworkFenceRequest { cidrs: vec!["10.0.0.1/32".into()], ..Default::default() };
    let refused = pb::network_fence_client::NetworkFenceClient::new(channel.clone())
        .fence_cluster_network(fence)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let promote = pb::PromoteVolumeRequest { replication_source: Some(volume("v-1")), ..Default::default() };
    let refused = replication.promote_volume(promote).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains(lease), "{refused:?}");
}

#[tokio::test]
async fn one_sidecar_holds_the_lease_and_the_other_takes_over() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-lease").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, true, false);
    let pod_a = sidecar_pod(&client, &namespace, "node-1", Workload::Deployment, "csi-controller").await;
    let pod_b = sidecar_pod(&client, &namespace, "node-2", Workload::Deployment, "csi-controller-b").await;
    let mut first = SidecarProcess::start(&pod_a, "node-1", &driver.endpoint(), Serving::Plain, &[]);
    first.wait_ready().await;
    first.wait_leader(true).await;
    let second = SidecarProcess::start(&pod_b, "node-2", &driver.endpoint(), Serving::Plain, &[]);
    second.wait_ready().await;

    // The Lease upstream's controller looks up: normalized driver name + "-csi-addons", held by
    // the normalized Pod name.
    let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
    let lease = "leader-csi-addons-rs-io-csi-addons";
    assert_eq!(holder(&leases, lease).await.as_deref(), Some(pod_a.name.as_str()));
    // The second keeps competing but does not serve controller operations (a missing PV is
    // INVALID_ARGUMENT from the holder, UNAVAILABLE from the other).
    tokio::time::sleep(Duration::from_secs(2)).await;
    second.wait_leader(false).await;
    let refused = reclaim(&second, "no-such-pv").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains(lease), "{refused:?}");
    assert_eq!(reclaim(&first, "no-such-pv").await.unwrap_err().code(), Code::InvalidArgument);
    standby_serves_reads_and_node_calls_and_refuses_changes(&second, lease).await;

    // The holder stops (SIGTERM): it releases the Lease and the other takes over.
    assert!(first.terminate().success(), "log:\n{}", first.log());
    second.wait_leader(true).await;
    assert_eq!(holder(&leases, lease).await.as_deref(), Some(pod_b.name.as_str()));
    assert_eq!(reclaim(&second, "no-such-pv").await.unwrap_err().code(), Code::InvalidArgument);
}

#[tokio::test]
async fn the_sidecar_reconnects_after_a_driver_restart_without_restarting() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-restart").await.unwrap();
    let mut driver = start_driver(&[]);
    let pod = sidecar_pod(&client, &namespace, "node-1", Workload::DaemonSet, "csi-plugin").await;
    let mut sidecar = SidecarProcess::start(&pod, "node-1", &driver.addons_endpoint, Serving::Plain, &[]);
    sidecar.wait_ready().await;

    driver.kill();
    sidecar
        .wait_for(
            "/readyz to report the driver lost",
            async |s| matches!(s.http("/readyz").await, Some((503, body)) if body.contains("driver")),
        )
        .await;
    driver.kill_and_restart();
    sidecar.wait_ready().await;
    assert!(sidecar.exited().is_none(), "the sidecar exited");
    let channel = plain_channel(sidecar.port).await.unwrap();
    let probe = IdentityClient::new(channel).probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
}

#[tokio::test]
async fn with_exit_on_driver_loss_the_sidecar_exits_as_upstream_does() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-restart").await.unwrap();
    let mut driver = start_driver(&[]);
    let pod = sidecar_pod(&client, &namespace, "node-1", Workload::DaemonSet, "csi-plugin").await;
    let mut sidecar = SidecarProcess::start(
        &pod,
        "node-1",
        &driver.addons_endpoint,
        Serving::Plain,
        &["--exit-on-driver-loss".to_owned()],
    );
    sidecar.wait_ready().await;
    driver.kill();
    let status = sidecar.wait_exit().await;
    assert!(!status.success());
    assert!(sidecar.log().contains("--exit-on-driver-loss"), "{}", sidecar.log());
}

/// Another replica takes the Lease (its holder written over ours): the sidecar stops serving
/// changes but keeps running and serving reads, and takes the Lease back once it expires.
/// Upstream's sidecar exits instead.
#[tokio::test]
async fn a_sidecar_that_loses_its_lease_stays_up_and_leads_again_later() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::{Patch, PatchParams};

    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-lease-lost").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, true, false);
    let pod = sidecar_pod(&client, &namespace, "node-1", Workload::Deployment, "csi-controller").await;
    let mut sidecar = SidecarProcess::start(&pod, "node-1", &driver.endpoint(), Serving::Plain, &[]);
    sidecar.wait_leader(true).await;

    let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
    let lease = api::lease::driver_lease_name(DRIVER);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let taken = serde_json::json!({"spec": {
        "holderIdentity": "another-replica", "leaseDurationSeconds": 6, "acquireTime": now, "renewTime": now,
    }});
    leases.patch(&lease, &PatchParams::default(), &Patch::Merge(&taken)).await.unwrap();
    sidecar.wait_leader(false).await;
    assert!(sidecar.exited().is_none(), "the sidecar exited on losing its Lease:\n{}", sidecar.log());
    let channel = plain_channel(sidecar.port).await.unwrap();
    let probe = IdentityClient::new(channel).probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    assert_eq!(reclaim(&sidecar, "no-such-pv").await.unwrap_err().code(), Code::Unavailable);
    // Nobody renews the other holder's Lease: it expires, and the sidecar leads again.
    sidecar.wait_leader(true).await;
    assert_eq!(holder(&leases, &lease).await.as_deref(), Some(pod.name.as_str()));
    assert!(sidecar.exited().is_none());
}
