//! Per-driver trust. A CSI driver's `CSIDriver` object may carry, in the annotation
//! `csi-addons-rs.io/sidecar-ca`, the CA bundle (PEM) that signs its CSI-Addons sidecars'
//! certificates. The manager then verifies those sidecars against that bundle alone, with the
//! driver's name as the server name (a sidecar's Pod IP is not known when its certificate is
//! issued). Drivers without it keep `--sidecar-ca-file`, or upstream's unverified TLS, with a
//! warning when it is used. This works whoever manages the manager's Deployment (OLM reverts edits
//! to it): nothing of the manager's changes, and it needs no access to Secrets.
//! [differs: driver-ca]
use std::collections::HashSet;
use std::sync::Arc;

use api::driver::SIDECAR_CA_ANNOTATION;
use futures::StreamExt;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use crate::sidecars::client::DriverTrust;

fn annotation(driver: &CSIDriver) -> Option<&str> {
    driver.annotations().get(SIDECAR_CA_ANNOTATION).map(String::as_str)
}

fn apply(trust: &DriverTrust, driver: &CSIDriver) {
    let name = driver.name_any();
    let before = trust.stamp(&name);
    let outcome = trust.set(&name, annotation(driver));
    if trust.stamp(&name) == before {
        return; // the same bundle as before: said already
    }
    match outcome {
        Ok(()) if trust.config(&name).is_some() => {
            tracing::info!(driver = %name, "sidecars of this driver are verified against the CA on its CSIDriver");
        }
        Ok(()) => {}
        Err(e) => tracing::warn!(
            driver = %name, error = %e,
            "the CA on this CSIDriver cannot be used: its sidecars are not called until it is fixed"
        ),
    }
}

/// Follows the CSIDrivers into `trust` until `stop`. Without permission to list them (upstream's
/// RBAC, when this manager replaces upstream's), trust stays empty and that is said once.
pub async fn follow(client: kube::Client, trust: Arc<DriverTrust>, mut stop: watch::Receiver<bool>) {
    let mut events =
        watcher::watcher(Api::<CSIDriver>::all(client), watcher::Config::default()).default_backoff().boxed();
    let mut listing: Option<HashSet<String>> = None;
    let mut forbidden_said = false;
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = stop.wait_for(|s| *s) => return,
        };
        match event {
            None => return,
            Some(Ok(Event::Init)) => listing = Some(HashSet::new()),
            Some(Ok(Event::InitApply(driver))) => {
                apply(&trust, &driver);
                if let Some(seen) = listing.as_mut() {
                    seen.insert(driver.name_any());
                }
            }
            Some(Ok(Event::InitDone)) => {
                // Drivers deleted while the watch was down lose their trust.
                if let Some(seen) = listing.take() {
                    for gone in trust.drivers().into_iter().filter(|d| !seen.contains(d)) {
                        let _ = trust.set(&gone, None);
                    }
                }
                trust.mark_synced();
            }
            Some(Ok(Event::Apply(driver))) => apply(&trust, &driver),
            Some(Ok(Event::Delete(driver))) => {
                let _ = trust.set(&driver.name_any(), None);
            }
            Some(Err(e)) => {
                let forbidden = matches!(&e, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 403)
                    || matches!(&e, watcher::Error::WatchFailed(kube::Error::Api(s)) if s.code == 403);
                if forbidden {
                    if !forbidden_said {
                        tracing::warn!(error = %e, "cannot read CSIDrivers: no per-driver sidecar CA is used");
                        forbidden_said = true;
                    }
                    trust.mark_synced();
                } else {
                    tracing::debug!(error = %e, "watching CSIDrivers; retrying");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn a_driver_is_trusted_by_its_own_bundle_and_a_bad_one_fails_closed() {
        let trust = DriverTrust::new();
        assert!(trust.verifier("a.csi").is_none());
        let ca = ca_pem();
        trust.set("a.csi", Some(&ca)).unwrap();
        assert!(trust.config("a.csi").is_some());
        assert!(trust.config("b.csi").is_none(), "trust is per driver");
        let stamp = trust.stamp("a.csi");
        trust.set("a.csi", Some(&ca)).unwrap();
        assert_eq!(
            trust.stamp("a.csi"),
            stamp,
            "the same bundle again changes nothing: no connection is dialled again"
        );
        let err = trust.set("a.csi", Some("not a certificate")).unwrap_err().to_string();
        assert!(err.contains("CSIDriver a.csi"), "{err}");
        assert!(trust.stamp("a.csi") > stamp, "a changed bundle has connections dialled again");
        assert_eq!(trust.stamp("b.csi"), 0, "other drivers' connections are kept");
        assert!(trust.config("a.csi").is_none());
        let refused = trust.verifier("a.csi").expect("a broken bundle is kept, not forgotten");
        assert!(refused.is_err(), "its sidecars are refused rather than reached unverified");
        trust.set("a.csi", None).unwrap();
        assert!(trust.verifier("a.csi").is_none(), "an annotation removed: upstream's behaviour again");
        assert!(trust.first_unverified("b.csi") && !trust.first_unverified("b.csi"), "warned once");
    }
}
