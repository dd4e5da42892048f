//! The sidecars' TLS as the manager meets it: each sidecar's certificate verified against the CA
//! on the driver's CSIDriver, refused against a foreign one, and the manager saying it verifies
//! the driver's sidecars with that CA. Shared by the hand install's suite and the driver operator's.
use std::sync::Arc;

use api::driver::{DRIVER_NAME, SIDECAR_CA_ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Client;
use kube::api::Api;
use testenv::poll;

use crate::cluster;

/// The CA on the CSIDriver verifies every sidecar's certificate for the driver's name, a CA of
/// somebody else's does not, and the manager says it verifies this driver's sidecars with it.
pub async fn check_verified_tls(client: &Client, pods: &[Pod], manager_namespace: &str) -> String {
    let csi_driver = Api::<CSIDriver>::all(client.clone()).get(DRIVER_NAME).await.unwrap();
    let ca = csi_driver.metadata.annotations.unwrap_or_default().remove(SIDECAR_CA_ANNOTATION);
    let ca = ca.expect("the operator, or the hand install's certificates Job, puts the sidecars' CA on the CSIDriver");
    let foreign = foreign_ca();
    for pod in pods {
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a running Pod has an IP");
        let address = format!("{ip}:9070");
        if let Err(why) = handshake(&address, ca.as_bytes()).await {
            panic!("the sidecar of {} fails verification against the driver's CA: {why}", cluster::name(pod));
        }
        let refused = handshake(&address, foreign.as_bytes()).await;
        assert!(refused.is_err(), "the sidecar of {} passed verification against a foreign CA", cluster::name(pod));
    }
    let manager = cluster::ready_leading_manager(client, manager_namespace).await;
    let said = poll::until(poll::MINUTE, async || {
        let log = cluster::logs(client, manager_namespace, &manager, "manager").await;
        log.lines()
            .find(|l| l.contains("verified against the CA on its CSIDriver") && l.contains(DRIVER_NAME))
            .map(str::to_owned)
    })
    .await;
    assert!(said.is_some(), "the manager {manager} verifies {DRIVER_NAME}'s sidecars against its CSIDriver's CA");
    format!("{} sidecars verified against the driver's CA and refused by a foreign one", pods.len())
}

fn foreign_ca() -> String {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

/// A TLS handshake with the sidecar at `address`, verified against `ca` for the driver's name (as
/// the manager verifies it).
async fn handshake(address: &str, ca: &[u8]) -> Result<(), String> {
    let config = operator::sidecars::client::verifying_config(ca, "test CA").map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(address).await.map_err(|e| format!("{address}: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from(DRIVER_NAME.to_owned()).map_err(|e| e.to_string())?;
    connector.connect(name, tcp).await.map(drop).map_err(|e| format!("{address}: {e}"))
}
