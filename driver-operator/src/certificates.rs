//! The CSI-Addons sidecars' certificates. The operator keeps a CA in a Secret of the driver's
//! namespace and issues one serving certificate for the driver's name from it, mounted into every
//! sidecar (which re-reads it when the kubelet updates the files). The CA's certificate goes on the
//! driver's CSIDriver (`api::driver::SIDECAR_CA_ANNOTATION`): that is how the CSI-Addons manager
//! learns to trust it, for this driver only.
//!
//! Both are renewed once a third of their life is left. A renewed CA stays paired with the one it
//! replaces in the published bundle until the old one expires, so sidecars still serving a
//! certificate of the old CA (the kubelet takes a minute or two to update Secret volumes) stay
//! trusted throughout.
use std::collections::BTreeMap;

use api::driver::DRIVER_NAME;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

use crate::names::{MANAGED_BY, SERVING_SECRET};

pub const CA_SECRET: &str = "reference-driver-sidecar-ca";
const CA_LIFE_SECONDS: i64 = 365 * 24 * 3600;
const SERVING_LIFE_SECONDS: i64 = 90 * 24 * 3600;
/// Annotations on the Secrets: when their certificate expires, which CA generation issued it.
const NOT_AFTER: &str = "driver.csi-addons-rs.io/not-after";
const GENERATION: &str = "driver.csi-addons-rs.io/ca-generation";
const PREVIOUS_NOT_AFTER: &str = "driver.csi-addons-rs.io/previous-not-after";
const PREVIOUS_CERT: &str = "previous.crt";

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("issuing a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("the time {0} is out of range")]
    Time(i64),
}

/// The CA as its Secret holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ca {
    pub cert: String,
    pub key: String,
    pub not_after: i64,
    pub generation: u64,
    /// The CA it replaced, trusted until it expires.
    pub previous: Option<(String, i64)>,
}

/// What the serving Secret says of its certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    pub not_after: i64,
    pub generation: u64,
}

/// What to write this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    pub ca: bool,
    pub serving: bool,
}

/// Whether the CA and the serving certificate must be (re)issued at `now` (seconds).
pub fn renewal(ca: Option<&Ca>, serving: Option<&Serving>, now: i64) -> Renewal {
    let ca_due = ca.is_none_or(|c| c.not_after - now < CA_LIFE_SECONDS / 3);
    let serving_due = ca_due
        || match (ca, serving) {
            (Some(ca), Some(s)) => s.generation != ca.generation || s.not_after - now < SERVING_LIFE_SECONDS / 3,
            _ => true,
        };
    Renewal { ca: ca_due, serving: serving_due }
}

/// The PEM bundle the manager trusts: the CA, and the one it replaced while that is valid.
pub fn bundle(ca: &Ca, now: i64) -> String {
    match &ca.previous {
        Some((previous, not_after)) if *not_after > now => format!("{}{previous}", ca.cert),
        _ => ca.cert.clone(),
    }
}

fn time(seconds: i64) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(seconds).map_err(|_| CertError::Time(seconds))
}

/// The CA's fixed parameters: a new CA keeps its predecessor's name, so either verifies.
fn ca_params(now: i64, not_after: i64) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, format!("{DRIVER_NAME} CSI-Addons sidecar CA"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = time(now - 300)?;
    params.not_after = time(not_after)?;
    Ok(params)
}

/// A new CA at `now`, replacing `old` (kept in the bundle until it expires).
pub fn new_ca(old: Option<&Ca>, now: i64) -> Result<Ca, CertError> {
    let key = KeyPair::generate()?;
    let not_after = now + CA_LIFE_SECONDS;
    let cert = ca_params(now, not_after)?.self_signed(&key)?;
    Ok(Ca {
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after,
        generation: old.map_or(1, |o| o.generation + 1),
        previous: old.filter(|o| o.not_after > now).map(|o| (o.cert.clone(), o.not_after)),
    })
}

/// A serving certificate for the driver's name from `ca`: (certificate, key) in PEM.
pub fn issue_serving(ca: &Ca, now: i64) -> Result<(String, String, Serving), CertError> {
    let ca_key = KeyPair::from_pem(&ca.key)?;
    let issuer = Issuer::new(ca_params(now, ca.not_after)?, ca_key);
    let key = KeyPair::generate()?;
    let not_after = (now + SERVING_LIFE_SECONDS).min(ca.not_after);
    let mut params = CertificateParams::new(vec![DRIVER_NAME.to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, DRIVER_NAME);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = time(now - 300)?;
    params.not_after = time(not_after)?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem(), Serving { not_after, generation: ca.generation }))
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

fn number<T: std::str::FromStr>(secret: &Secret, annotation: &str) -> Option<T> {
    secret.metadata.annotations.as_ref()?.get(annotation)?.parse().ok()
}

/// The CA a Secret holds; `None` when anything is missing or unreadable (a new CA is made).
pub fn read_ca(secret: &Secret) -> Option<Ca> {
    let previous = match (text(secret, PREVIOUS_CERT), number(secret, PREVIOUS_NOT_AFTER)) {
        (Some(cert), Some(not_after)) => Some((cert, not_after)),
        _ => None,
    };
    let ca = Ca {
        cert: text(secret, "tls.crt")?,
        key: text(secret, "tls.key")?,
        not_after: number(secret, NOT_AFTER)?,
        generation: number(secret, GENERATION)?,
        previous,
    };
    KeyPair::from_pem(&ca.key).ok().map(|_| ca)
}

/// What the serving Secret says; `None` when anything is missing (a new one is issued).
pub fn read_serving(secret: &Secret) -> Option<Serving> {
    text(secret, "tls.crt")?;
    text(secret, "tls.key")?;
    Some(Serving { not_after: number(secret, NOT_AFTER)?, generation: number(secret, GENERATION)? })
}

fn secret(
    name: &str,
    namespace: &str,
    type_: &str,
    data: Vec<(&str, String)>,
    annotations: Vec<(&str, String)>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())])),
            annotations: Some(annotations.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()),
            ..Default::default()
        },
        type_: Some(type_.to_owned()),
        data: Some(data.into_iter().map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes()))).collect()),
        ..Default::default()
    }
}

/// The CA's Secret.
pub fn ca_secret(ca: &Ca, namespace: &str) -> Secret {
    let mut data = vec![("tls.crt", ca.cert.clone()), ("tls.key", ca.key.clone())];
    let mut annotations = vec![(NOT_AFTER, ca.not_after.to_string()), (GENERATION, ca.generation.to_string())];
    if let Some((cert, not_after)) = &ca.previous {
        data.push((PREVIOUS_CERT, cert.clone()));
        annotations.push((PREVIOUS_NOT_AFTER, not_after.to_string()));
    }
    secret(CA_SECRET, namespace, "Opaque", data, annotations)
}

/// The serving certificate's Secret, as the sidecars mount it.
pub fn serving_secret(cert: String, key: String, serving: Serving, namespace: &str) -> Secret {
    let annotations = vec![(NOT_AFTER, serving.not_after.to_string()), (GENERATION, serving.generation.to_string())];
    secret(SERVING_SECRET, namespace, "kubernetes.io/tls", vec![("tls.crt", cert), ("tls.key", key)], annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 24 * 3600;

    #[test]
    fn certificates_are_renewed_with_a_third_of_their_life_left() {
        let now = 1_800_000_000;
        assert_eq!(renewal(None, None, now), Renewal { ca: true, serving: true });
        let ca = new_ca(None, now).unwrap();
        let (_, _, serving) = issue_serving(&ca, now).unwrap();
        assert_eq!(renewal(Some(&ca), Some(&serving), now + DAY), Renewal { ca: false, serving: false });
        assert_eq!(renewal(Some(&ca), Some(&serving), now + 61 * DAY), Renewal { ca: false, serving: true });
        assert_eq!(renewal(Some(&ca), Some(&serving), now + 250 * DAY), Renewal { ca: true, serving: true });
        let older = Serving { generation: ca.generation + 1, ..serving };
        assert!(renewal(Some(&ca), Some(&older), now).serving, "issued by another CA");
    }

    #[test]
    fn a_renewed_ca_keeps_the_old_one_in_the_bundle_until_it_expires() {
        let now = 1_800_000_000;
        let first = new_ca(None, now).unwrap();
        assert_eq!(bundle(&first, now), first.cert);
        let second = new_ca(Some(&first), now + 250 * DAY).unwrap();
        assert_eq!(second.generation, 2);
        assert_eq!(bundle(&second, now + 250 * DAY), format!("{}{}", second.cert, first.cert));
        assert_eq!(bundle(&second, first.not_after + 1), second.cert, "an expired CA leaves the bundle");
    }

    #[test]
    fn secrets_round_trip_and_a_broken_one_reads_as_missing() {
        let now = 1_800_000_000;
        let ca = new_ca(Some(&new_ca(None, now).unwrap()), now + DAY).unwrap();
        let stored = ca_secret(&ca, "drivers");
        assert_eq!(read_ca(&stored), Some(ca.clone()));
        let (cert, key, serving) = issue_serving(&ca, now + DAY).unwrap();
        assert_eq!(read_serving(&serving_secret(cert, key, serving, "drivers")), Some(serving));
        let mut broken = stored;
        broken.data.as_mut().unwrap().insert("tls.key".into(), ByteString(b"garbage".to_vec()));
        assert_eq!(read_ca(&broken), None);
    }

    #[test]
    fn the_serving_certificate_verifies_under_the_driver_name_against_the_bundle() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let now = 1_800_000_000;
        let old = new_ca(None, now).unwrap();
        // Served by a sidecar until the kubelet updates its files after the CA's renewal.
        let (old_cert, _, _) = issue_serving(&old, now + 240 * DAY).unwrap();
        let ca = new_ca(Some(&old), now + 250 * DAY).unwrap();
        let (cert, _, _) = issue_serving(&ca, now + 250 * DAY).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for der in rustls_pki_certs(&bundle(&ca, now + 250 * DAY)) {
            roots.add(der).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            cluster_client::tls::crypto_provider(),
        )
        .build()
        .unwrap();
        let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(u64::try_from(now + 251 * DAY).unwrap()));
        let name = ServerName::try_from(DRIVER_NAME).unwrap();
        for leaf in [cert, old_cert] {
            let der: CertificateDer<'static> = rustls_pki_certs(&leaf).remove(0);
            verifier.verify_server_cert(&der, &[], &name, &[], at).unwrap();
        }
    }

    fn rustls_pki_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()).map(Result::unwrap).collect()
    }
}
