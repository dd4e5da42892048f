//! The manager's side of the sidecar protocol against the real sidecar process: its token on
//! every call, the sidecar verified against `--sidecar-ca-file`, upstream's unverified TLS as the
//! fallback for self-signed sidecars, and failures when the two sides disagree.
use api::proto::identity::{GetCapabilitiesRequest, identity_client::IdentityClient};
use operator::sidecars::client::Security;

use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{Serving, SidecarProcess, TestPki, Workload, manager_token, sidecar_pod};

const DRIVER: &str = "manager-client.csi-addons-rs.io";

async fn capabilities(security: &Security, port: u16) -> Result<Vec<String>, String> {
    let channel = security.connect(&format!("127.0.0.1:{port}"), DRIVER).await.map_err(|e| e.to_string())?;
    let answer = IdentityClient::new(channel)
        .get_capabilities(GetCapabilitiesRequest {})
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    Ok(api::capabilities::to_strings(&answer.into_inner().capabilities))
}

#[tokio::test]
async fn the_manager_verifies_the_sidecar_and_sends_its_token() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-client").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, true, false);
    let (token, identity) = manager_token(&client).await;
    let files = tempfile::tempdir().unwrap();
    let token_file = files.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let pki = TestPki::new();
    let ca_file = files.path().join("ca.crt");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    let allowed = vec![format!("--allowed-identities={identity}")];

    let pod = sidecar_pod(&client, &namespace, "node-m1", Workload::DaemonSet, "csi-plugin").await;
    let verified = SidecarProcess::start(&pod, "node-m1", &driver.endpoint(), Serving::Tls(&pki), &allowed);
    verified.wait_ready().await;
    let with_ca = Security::tls(&token_file, Some(ca_file.to_str().unwrap())).unwrap();
    let caps = capabilities(&with_ca, verified.port).await.unwrap();
    assert!(caps.contains(&"service.CONTROLLER_SERVICE".to_owned()), "{caps:?}");

    // Another CA: the sidecar is not trusted, nothing is sent.
    let stranger = TestPki::new();
    let stranger_ca = files.path().join("stranger.crt");
    std::fs::write(&stranger_ca, &stranger.ca_pem).unwrap();
    let untrusting = Security::tls(&token_file, Some(stranger_ca.to_str().unwrap())).unwrap();
    assert!(capabilities(&untrusting, verified.port).await.is_err());
    // Plain TCP against a TLS sidecar fails; so does a token of another identity.
    assert!(capabilities(&Security::plain(), verified.port).await.is_err());
    let other = cp.token(&client, &namespace, "not-the-manager").await.unwrap();
    let other_file = files.path().join("other-token");
    std::fs::write(&other_file, other).unwrap();
    let denied = capabilities(&Security::tls(&other_file, Some(ca_file.to_str().unwrap())).unwrap(), verified.port)
        .await
        .unwrap_err();
    assert!(denied.starts_with("PermissionDenied"), "{denied}");

    // Upstream's default sidecar (self-signed): reached without a CA, as upstream's manager does.
    let pod = sidecar_pod(&client, &namespace, "node-m2", Workload::DaemonSet, "csi-plugin-2").await;
    let self_signed = SidecarProcess::start(&pod, "node-m2", &driver.endpoint(), Serving::SelfSigned, &allowed);
    self_signed.wait_ready().await;
    let unverified = Security::tls(&token_file, None).unwrap();
    assert!(capabilities(&unverified, self_signed.port).await.is_ok());
    assert!(capabilities(&with_ca, self_signed.port).await.is_err(), "a self-signed certificate passed verification");
}

/// A pooled connection of `driver`'s sidecar in `pod`, kept open (these tests close nothing for
/// idleness).
fn pooled(
    (namespace, pod, node): (&str, &str, &str),
    driver: &str,
    endpoint: &str,
    channel: operator::sidecars::client::SidecarChannel,
) -> operator::sidecars::pool::Connection {
    let again = channel.clone();
    operator::sidecars::pool::Connection {
        namespace: namespace.to_owned(),
        name: format!("{node}-{namespace}"),
        driver: driver.to_owned(),
        node_id: node.to_owned(),
        pod: pod.to_owned(),
        endpoint: endpoint.to_owned(),
        capabilities: vec!["service.CONTROLLER_SERVICE".into(), "reclaim_space.ONLINE".into()],
        channel: operator::sidecars::idle_channel::IdleChannel::new(channel, move || Ok(again.clone())),
        trust_stamp: 0,
    }
}

/// A channel to a port that answers nothing (lazy: the pool never dials on lookup).
fn dead_channel() -> operator::sidecars::client::SidecarChannel {
    let dead = tonic::transport::Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
    tonic::service::interceptor::InterceptedService::new(dead, operator::sidecars::client::BearerToken::none())
}

/// The pool finds a driver's leader through its Lease even when another namespace holds a
/// sidecar of the same driver that is unreachable and has no Lease, and node lookups ignore it.
#[tokio::test]
async fn the_pool_finds_the_leader_past_a_broken_sidecar() {
    use operator::sidecars::pool::{Pool, parse_endpoint, resolve};

    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-pool").await.unwrap();
    let elsewhere = cp.namespace(&client, "manager-pool-other").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, true, false);
    let pod = sidecar_pod(&client, &namespace, "node-p1", Workload::DaemonSet, "csi-plugin").await;
    let sidecar = SidecarProcess::start(&pod, "node-p1", &driver.endpoint(), Serving::Plain, &[]);
    sidecar.wait_ready().await;
    sidecar.wait_leader(true).await;

    let security = Security::plain();
    let address = resolve(&client, &parse_endpoint(&format!("127.0.0.1:{}", sidecar.port)).unwrap()).await.unwrap();
    let pool = Pool::default();
    pool.put(pooled((&elsewhere, "dead-pod", "node-p2"), DRIVER, &address, dead_channel()));
    let live = security.connect(&address, DRIVER).await.unwrap();
    pool.put(pooled((&namespace, &pod.name, "node-p1"), DRIVER, &address, live));

    let leader = pool.leader(&client, DRIVER).await.unwrap();
    assert_eq!((leader.namespace.as_str(), leader.pod.as_str()), (namespace.as_str(), pod.name.as_str()));
    let node = pool.on_node(DRIVER, "node-p1", "reclaim_space.ONLINE").unwrap();
    assert_eq!(node.pod, pod.name);
    let missing = pool.on_node(DRIVER, "node-p1", "reclaim_space.OFFLINE").unwrap_err().to_string();
    assert!(missing.contains("reclaim_space.OFFLINE") && missing.contains("node-p1"), "{missing}");
    let none = pool.leader(&client, "other.driver").await.unwrap_err().to_string();
    assert!(none.contains("no sidecar of driver other.driver"), "{none}");
}

/// A Lease's holder is remembered while it surely holds the Lease: lookups at once read it once,
/// and another holder written into the Lease is not seen until the remembered one answers
/// UNAVAILABLE, as the real sidecar does when it does not hold its Lease. An expired Lease's
/// holder is read at every lookup.
#[tokio::test]
async fn the_pool_remembers_a_lease_holder_until_it_answers_unavailable() {
    use api::proto::internal::{ReclaimSpaceRequest, reclaim_space_client::ReclaimSpaceClient};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::{Timestamp, ToSpan};
    use kube::api::{Api, GetParams, Patch, PatchParams};
    use operator::sidecars::pool::Pool;

    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-holders").await.unwrap();
    let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
    let lease = |driver: &str, holder: &str, renewed: Timestamp| {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": api::lease::driver_lease_name(driver)},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 3600, "renewTime": MicroTime(renewed)},
        })
    };
    // Writes the Lease, and waits until the API server's watch cache (where the pool reads)
    // has it.
    let hold = async |driver: &str, holder: &str, renewed: Timestamp| {
        let name = api::lease::driver_lease_name(driver);
        let apply = PatchParams::apply("holders-test").force();
        leases.patch(&name, &apply, &Patch::Apply(lease(driver, holder, renewed))).await.unwrap();
        let cached = async || {
            let read = leases.get_with(&name, &GetParams::any()).await.ok()?;
            (read.spec?.holder_identity.as_deref() == Some(holder)).then_some(())
        };
        assert!(testenv::poll::until(std::time::Duration::from_secs(30), cached).await.is_some());
    };
    // Replica A holds the Lease for an hour, so the real sidecar below stands by: it answers
    // changes UNAVAILABLE. The pool knows it as replica A.
    hold(DRIVER, "replica-a", Timestamp::now()).await;
    let driver = RecordingDriver::start(DRIVER, true, false);
    let pod = sidecar_pod(&client, &namespace, "node-h1", Workload::Deployment, "csi-controller").await;
    let sidecar = SidecarProcess::start(&pod, "node-h1", &driver.endpoint(), Serving::Plain, &[]);
    sidecar.wait_ready().await;
    sidecar.wait_leader(false).await;
    let address = format!("127.0.0.1:{}", sidecar.port);
    let standing_by = Security::plain().connect(&address, DRIVER).await.unwrap();
    let pool = Pool::default();
    pool.put(pooled((&namespace, "replica-a", "node-h1"), DRIVER, &address, standing_by));
    pool.put(pooled((&namespace, "replica-b", "node-h2"), DRIVER, &address, dead_channel()));

    // Twenty lookups at once, none remembered yet: one read of the Lease between them.
    let gets = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = gets.clone();
    let observer: cluster_client::observe::Observer = std::sync::Arc::new(move |attempt| {
        if attempt.method == http::Method::GET {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let options = cluster_client::Options { in_flight: None, observer: Some(observer) };
    let counting = cluster_client::client_for(cp.config().await.unwrap(), options).unwrap();
    let lookups = futures::future::join_all((0..20).map(|_| pool.leader(&counting, DRIVER))).await;
    assert!(lookups.iter().all(|l| l.as_ref().is_ok_and(|l| l.pod == "replica-a")));
    assert_eq!(gets.load(std::sync::atomic::Ordering::Relaxed), 1, "GETs of the Lease for 20 lookups");
    let leader = pool.leader(&client, DRIVER).await.unwrap();
    assert_eq!(leader.pod, "replica-a");
    hold(DRIVER, "replica-b", Timestamp::now()).await;
    assert_eq!(pool.leader(&client, DRIVER).await.unwrap().pod, "replica-a", "the holder was not remembered");
    let refused = ReclaimSpaceClient::new(leader.channel.clone())
        .controller_reclaim_space(ReclaimSpaceRequest { pv_name: "pv-1".into() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(pool.leader(&client, DRIVER).await.unwrap().pod, "replica-b", "read again after UNAVAILABLE");

    // Renewed two hours ago: expired, so each lookup reads the Lease. Nothing runs this driver.
    let expired = "expired.csi-addons-rs.io";
    let long_ago = Timestamp::now() - 2.hours();
    hold(expired, "replica-c", long_ago).await;
    pool.put(pooled((&namespace, "replica-c", "node-h3"), expired, &address, dead_channel()));
    pool.put(pooled((&namespace, "replica-d", "node-h4"), expired, &address, dead_channel()));
    assert_eq!(pool.leader(&client, expired).await.unwrap().pod, "replica-c");
    hold(expired, "replica-d", long_ago).await;
    assert_eq!(pool.leader(&client, expired).await.unwrap().pod, "replica-d");
}

/// Per-driver trust: a driver whose CSIDriver names a CA has its sidecars verified against that
/// CA alone, under the driver's name, even where the manager otherwise verifies nothing; a
/// sidecar with a certificate from another CA, or a self-signed one, is refused. Other drivers
/// keep the fallback. The manager follows the annotation on the real CSIDriver object.
#[tokio::test]
async fn a_driver_with_a_ca_on_its_csidriver_has_its_sidecars_verified_by_it_alone() {
    use k8s_openapi::api::storage::v1::CSIDriver;
    use kube::api::{Api, DeleteParams, PostParams};

    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-trust").await.unwrap();
    let trusted_driver = crate::harness::support::unique("trusted").replace('-', ".") + ".csi";
    let recording = RecordingDriver::start(&trusted_driver, true, false);
    let (token, identity) = manager_token(&client).await;
    let files = tempfile::tempdir().unwrap();
    let token_file = files.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let allowed = vec![format!("--allowed-identities={identity}")];
    let own = TestPki::for_names(&[&trusted_driver]);
    let stranger = TestPki::for_names(&[&trusted_driver]);

    // The manager's view of the CSIDrivers, followed from the API server.
    let security = Security::tls(&token_file, None).unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let following = tokio::spawn(operator::sidecars::driver_trust::follow(client.clone(), security.trust(), stop));
    security.trust().wait_synced().await;
    let csi_drivers: Api<CSIDriver> = Api::all(client.clone());
    let object: CSIDriver = serde_json::from_value(serde_json::json!({
        "metadata": {"name": trusted_driver, "annotations": {api::driver::SIDECAR_CA_ANNOTATION: own.ca_pem}},
        "spec": {}
    }))
    .unwrap();
    csi_drivers.create(&PostParams::default(), &object).await.unwrap();
    let trusted = testenv::poll::until(testenv::poll::MINUTE, async || security.trust().config(&trusted_driver)).await;
    assert!(trusted.is_some(), "the CA on the CSIDriver was not picked up");

    let start = |node: &'static str, pod_name: &'static str, serving| {
        let (client, namespace, endpoint, allowed) =
            (client.clone(), namespace.clone(), recording.endpoint(), allowed.clone());
        async move {
            let pod = sidecar_pod(&client, &namespace, node, Workload::DaemonSet, pod_name).await;
            let sidecar = SidecarProcess::start(&pod, node, &endpoint, serving, &allowed);
            sidecar.wait_ready().await;
            sidecar
        }
    };
    let verified = start("node-t1", "csi-plugin-t1", Serving::Tls(&own)).await;
    let on = |port: u16| format!("127.0.0.1:{port}");
    let connect = async |port: u16, driver: &str| -> Result<Vec<String>, String> {
        let channel = security.connect(&on(port), driver).await.map_err(|e| e.to_string())?;
        let answer = IdentityClient::new(channel)
            .get_capabilities(GetCapabilitiesRequest {})
            .await
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
        Ok(api::capabilities::to_strings(&answer.into_inner().capabilities))
    };
    assert!(connect(verified.port, &trusted_driver).await.is_ok(), "the driver's own sidecar is refused");
    let impostor = start("node-t2", "csi-plugin-t2", Serving::Tls(&stranger)).await;
    let refused = connect(impostor.port, &trusted_driver).await.unwrap_err();
    assert!(refused.contains("connecting to sidecar"), "{refused}");
    let self_signed = start("node-t3", "csi-plugin-t3", Serving::SelfSigned).await;
    assert!(connect(self_signed.port, &trusted_driver).await.is_err(), "a self-signed sidecar passed as the driver's");
    // Another driver without a CA: upstream's unverified fallback still reaches it.
    assert!(connect(self_signed.port, DRIVER).await.is_ok());

    // A broken bundle fails closed: the driver's sidecars are refused, not reached unverified.
    let broken = serde_json::json!({"metadata": {"annotations": {api::driver::SIDECAR_CA_ANNOTATION: "not a PEM"}}});
    csi_drivers
        .patch(&trusted_driver, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(broken))
        .await
        .unwrap();
    let refused =
        testenv::poll::until(testenv::poll::MINUTE, async || security.trust().verifier(&trusted_driver)?.err()).await;
    assert!(refused.is_some(), "the broken bundle was not taken as such");
    let refused = connect(self_signed.port, &trusted_driver).await.unwrap_err();
    assert!(refused.contains("are not called") && refused.contains("cannot be used"), "{refused}");
    assert!(connect(verified.port, &trusted_driver).await.is_err(), "the old CA is kept after a broken update");

    // The CSIDriver goes: so does the trust.
    csi_drivers.delete(&trusted_driver, &DeleteParams::default()).await.unwrap();
    let gone = testenv::poll::until(testenv::poll::MINUTE, async || {
        security.trust().config(&trusted_driver).is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the trust outlived its CSIDriver");
    stop_tx.send_replace(true);
    following.await.unwrap();
}
