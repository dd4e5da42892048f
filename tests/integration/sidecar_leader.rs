//! Sidecars of one controller driver elect one Lease holder, which alone serves controller
//! operations; the other takes over when the holder stops. And a driver restart is survived.
use std::time::Duration;

use api::proto::identity::{ProbeRequest, identity_client::IdentityClient};
use api::proto::internal as pb;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tonic::Code;

use crate::driver_sanity::start_driver;
use crate::recording_driver::RecordingDriver;
use crate::sidecar_harness::{Serving, SidecarProcess, Workload, plain_channel, sidecar_pod};

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
