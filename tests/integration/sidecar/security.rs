//! Who may call the sidecar: tokens checked with the real TokenReview API, identities matched
//! against `--allowed-identities`, TLS with a mounted certificate (reloaded when it changes) or
//! upstream's self-signed one, plain TCP only with `--enable-auth=false`.
use std::time::Duration;

use api::proto::identity::{GetIdentityRequest, identity_client::IdentityClient};
use tonic::Code;

use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{
    Serving, SidecarProcess, TestPki, Workload, bearer, manager_token, plain_channel, sidecar_pod, tls_channel,
};

const DRIVER: &str = "security.csi-addons-rs.io";

#[tokio::test]
async fn only_the_allowed_identity_may_call() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-auth").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);
    let pod = sidecar_pod(&client, &namespace, "node-auth", Workload::DaemonSet, "csi-plugin").await;
    // The manager runs in its own namespace, not the sidecar's.
    let (manager, identity) = manager_token(&client).await;
    let pki = TestPki::new();
    let sidecar = SidecarProcess::start(
        &pod,
        "node-auth",
        &driver.endpoint(),
        Serving::Tls(&pki),
        &[format!("--allowed-identities={identity}")],
    );
    sidecar.wait_ready().await;
    let mut identity_client = IdentityClient::new(tls_channel(sidecar.port, &pki.ca_pem).await.unwrap());

    let answer = identity_client.get_identity(bearer(GetIdentityRequest {}, &manager)).await.unwrap().into_inner();
    assert_eq!(answer.name, DRIVER);

    let anonymous = identity_client.get_identity(GetIdentityRequest {}).await.unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated, "{anonymous:?}");
    let forged = identity_client.get_identity(bearer(GetIdentityRequest {}, "not-a-real-token")).await.unwrap_err();
    assert_eq!(forged.code(), Code::Unauthenticated, "{forged:?}");
    // A valid token, but of another ServiceAccount (one in the sidecar's own namespace).
    let other = cp.token(&client, &namespace, "some-app").await.unwrap();
    let denied = identity_client.get_identity(bearer(GetIdentityRequest {}, &other)).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains(&format!("system:serviceaccount:{namespace}:some-app")), "{denied:?}");
    // Asked again: refused again (from the cache), and logged once, without the token.
    let again = identity_client.get_identity(bearer(GetIdentityRequest {}, &other)).await.unwrap_err();
    assert_eq!(again.code(), Code::PermissionDenied);
    let log = sidecar.log();
    assert!(!log.contains(&other) && !log.contains(&manager), "a token reached the log");
    assert_eq!(
        log.matches(&format!("refused a call from system:serviceaccount:{namespace}:some-app")).count(),
        1,
        "{log}"
    );

    // The metrics count refusals by code.
    let (_, metrics) = sidecar.http("/metrics").await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("csi_addons_sidecar_rpcs_total{")
            && l.contains("PermissionDenied")
            && l.contains("/identity.Identity/GetIdentity")),
        "{metrics}"
    );
    let lint = crate::packaging::alerts::metric_lint(&metrics);
    assert!(lint.is_empty(), "promtool check metrics on the sidecar's /metrics:\n{lint}");
}

/// ODF installs the manager as `csi-addons-controller-manager` in `openshift-storage`: a sidecar
/// started without `--allowed-identities` admits that ServiceAccount in any namespace, and only it.
/// It also starts with upstream's curve names, including one this build lacks.
#[tokio::test]
async fn by_default_the_managers_service_account_of_any_namespace_may_call() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-default-auth").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);
    let pod = sidecar_pod(&client, &namespace, "node-default", Workload::DaemonSet, "csi-rbdplugin").await;
    let pki = TestPki::new();
    // Go's curve names, P-521 among them (not in this build: skipped with a warning).
    let curves = ["--tls-curve-preferences=CurveP521,X25519,CurveP256".to_owned()];
    let sidecar = SidecarProcess::start(&pod, "node-default", &driver.endpoint(), Serving::Tls(&pki), &curves);
    sidecar.wait_ready().await;
    let mut identity_client = IdentityClient::new(tls_channel(sidecar.port, &pki.ca_pem).await.unwrap());
    for home in ["openshift-storage", "csi-addons-system"] {
        let home = cp.namespace(&client, home).await.unwrap();
        let manager = cp.token(&client, &home, crate::harness::sidecar::MANAGER_SA).await.unwrap();
        let answer = identity_client.get_identity(bearer(GetIdentityRequest {}, &manager)).await;
        assert_eq!(answer.unwrap().into_inner().name, DRIVER, "the manager in {home} was refused");
        // Another ServiceAccount of the same namespace is not the manager.
        let other = cp.token(&client, &home, "default").await.unwrap();
        let denied = identity_client.get_identity(bearer(GetIdentityRequest {}, &other)).await.unwrap_err();
        assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    }
}

#[tokio::test]
async fn tls_is_required_verified_and_reloaded() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-tls").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);
    let pod = sidecar_pod(&client, &namespace, "node-tls", Workload::DaemonSet, "csi-plugin").await;
    let (manager, identity) = manager_token(&client).await;
    let pki = TestPki::new();
    let sidecar = SidecarProcess::start(
        &pod,
        "node-tls",
        &driver.endpoint(),
        Serving::Tls(&pki),
        &[format!("--allowed-identities={identity}")],
    );
    sidecar.wait_ready().await;

    // Plain TCP against the TLS port fails.
    let plain = match plain_channel(sidecar.port).await {
        Ok(channel) => {
            IdentityClient::new(channel).get_identity(bearer(GetIdentityRequest {}, &manager)).await.map(|_| ())
        }
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
    };
    assert!(plain.is_err(), "plain TCP was served");
    // A client that does not trust the CA cannot connect.
    let stranger = TestPki::new();
    assert!(
        tls_channel(sidecar.port, &stranger.ca_pem).await.is_err(),
        "a certificate from an untrusted CA was accepted"
    );

    // cert-manager renews the Secret: new connections get the new certificate.
    let renewed = TestPki::new();
    std::fs::copy(&renewed.key, &pki.key).unwrap();
    std::fs::copy(&renewed.cert, &pki.cert).unwrap();
    let reloaded = testenv::poll::until(Duration::from_secs(10), async || {
        let channel = tls_channel(sidecar.port, &renewed.ca_pem).await.ok()?;
        IdentityClient::new(channel).get_identity(bearer(GetIdentityRequest {}, &manager)).await.ok()
    })
    .await;
    assert!(reloaded.is_some(), "the renewed certificate was not served; sidecar log:\n{}", sidecar.log());
    assert!(tls_channel(sidecar.port, &pki.ca_pem).await.is_err(), "the old certificate is still served");
}

#[tokio::test]
async fn upstream_defaults_self_signed_tls_and_plain_tcp_without_auth() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-tls").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);

    // Auth on without certificate files: a self-signed certificate, and one warning saying so.
    let pod = sidecar_pod(&client, &namespace, "node-ss", Workload::DaemonSet, "csi-plugin").await;
    let self_signed = SidecarProcess::start(&pod, "node-ss", &driver.endpoint(), Serving::SelfSigned, &[]);
    self_signed.wait_ready().await;
    assert_eq!(self_signed.log().matches("self-signed certificate").count(), 1, "{}", self_signed.log());
    assert!(tls_channel(self_signed.port, &TestPki::new().ca_pem).await.is_err());

    // --enable-auth=false: plain TCP, no token needed.
    let pod = sidecar_pod(&client, &namespace, "node-plain", Workload::DaemonSet, "csi-plugin2").await;
    let plain = SidecarProcess::start(&pod, "node-plain", &driver.endpoint(), Serving::Plain, &[]);
    plain.wait_ready().await;
    let answer = IdentityClient::new(plain_channel(plain.port).await.unwrap())
        .get_identity(GetIdentityRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.name, DRIVER);
}

#[tokio::test]
async fn named_but_missing_certificate_files_stop_the_start_with_a_clear_error() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-tls").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, false, false);
    let pod = sidecar_pod(&client, &namespace, "node-bad", Workload::DaemonSet, "csi-plugin").await;
    let pki = TestPki::new();
    std::fs::remove_file(&pki.cert).unwrap();
    let mut sidecar = SidecarProcess::start(&pod, "node-bad", &driver.endpoint(), Serving::Tls(&pki), &[]);
    let status = sidecar.wait_exit().await;
    assert!(!status.success());
    let log = sidecar.log();
    assert!(log.contains(&pki.cert.display().to_string()), "the error does not name the file: {log}");
}
