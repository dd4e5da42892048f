//! The manager's side of the sidecar protocol against the real sidecar process: its token on
//! every call, the sidecar verified against `--sidecar-ca-file`, upstream's unverified TLS as the
//! fallback for self-signed sidecars, and failures when the two sides disagree.
use api::proto::identity::{GetCapabilitiesRequest, identity_client::IdentityClient};
use operator::sidecar_client::Security;

use crate::recording_driver::RecordingDriver;
use crate::sidecar_harness::{Serving, SidecarProcess, TestPki, Workload, manager_token, sidecar_pod};

const DRIVER: &str = "manager-client.csi-addons-rs.io";

async fn capabilities(security: &Security, port: u16) -> Result<Vec<String>, String> {
    let channel = security.connect(&format!("127.0.0.1:{port}")).await.map_err(|e| e.to_string())?;
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
