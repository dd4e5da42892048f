//! The TLS side of the API server connection: whose certificate is trusted (the kubeconfig's CA,
//! the Pod's service-account CA re-read every minute so a rotated CA is picked up, or the
//! system's roots when no CA is named) and the client certificate when the user has one, or the
//! one an exec credential plugin returned last.
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use secrecy::ExposeSecret;

/// How often the in-cluster CA file is read again.
const CA_RELOAD: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} in the kubeconfig is not base64: {source}")]
    Base64 {
        what: &'static str,
        #[source]
        source: base64::DecodeError,
    },
    #[error("{what}: no PEM {expected} in it")]
    Pem { what: &'static str, expected: &'static str },
    #[error("the client certificate is given without its key, or the key without the certificate")]
    HalfIdentity,
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("the CA certificates: {0}")]
    Verifier(#[from] rustls::client::VerifierBuilderError),
}

/// The crypto provider every client configuration of the product names, here and in the crates
/// above (named, not installed as the process default, so no dependency's choice can change it):
/// aws-lc-rs, which offers the post-quantum hybrid X25519MLKEM768 first, then X25519, P-256 and
/// P-384, the order Go's TLS offers them in.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Installs [`crypto_provider`] as the process's default, for any dependency that asks rustls for
/// the default rather than naming a provider: each binary's `main` calls it first, so the whole
/// process speaks one provider's TLS.
pub fn install_crypto_provider() {
    // Refused only when a default is installed already, which leaves that one: nothing to do.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The client TLS configuration for `config` (no ALPN: the connector sets it). The kubeconfig's
/// own client certificate comes first; without one, a plugin's (`plugin`) is presented. (client-go
/// does not even run the plugin for a certificate when the kubeconfig has one.)
pub fn client_config(config: &kube::Config, plugin: Option<Arc<PluginIdentity>>) -> Result<ClientConfig, TlsError> {
    let verifier: Arc<dyn ServerCertVerifier> = if config.accept_invalid_certs {
        AnyServer::new()
    } else if let Some(path) = &config.root_cert_file {
        Arc::new(ReloadingCa::new(path.clone())?)
    } else if let Some(roots) = &config.root_cert {
        verifier_for(roots.iter().map(|der| CertificateDer::from(der.as_slice())).collect())?
    } else {
        // No CA named: the system's trust store, as client-go does.
        Arc::new(rustls_platform_verifier::Verifier::new(crypto_provider())?)
    };
    let builder = ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    Ok(match (identity(&config.auth_info)?, plugin) {
        (Some((chain, key)), _) => builder.with_client_auth_cert(chain, key)?,
        (None, Some(plugin)) => builder.with_client_cert_resolver(plugin),
        (None, None) => builder.with_no_client_auth(),
    })
}

/// The client certificate an exec credential plugin returned last: set before each request
/// that ran the plugin, read by the handshakes of connections opened after it. Its generation
/// counts the changes of certificate, so that the client opens new connections
/// (`connections.rs`).
#[derive(Debug, Default)]
pub struct PluginIdentity {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    generation: std::sync::atomic::AtomicU64,
}

impl PluginIdentity {
    /// How many times the certificate has changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Presents `certificate` (a PEM chain) with `key` (PEM) from now on.
    pub fn set(&self, certificate: &str, key: &str) -> Result<(), TlsError> {
        let chain = pem_certificates(certificate.as_bytes());
        if chain.is_empty() {
            return Err(TlsError::Pem { what: "the client certificate", expected: "CERTIFICATE" });
        }
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(|_| TlsError::Pem { what: "the client key", expected: "PRIVATE KEY" })?;
        let signing_key = crypto_provider().key_provider.load_private_key(key)?;
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        let changed = current.as_ref().is_none_or(|now| now.cert != chain);
        *current = Some(Arc::new(CertifiedKey::new(chain, signing_key)));
        if changed {
            self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        Ok(())
    }

    /// The certificate presented now, if the plugin has returned one.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl ResolvesClientCert for PluginIdentity {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.current()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn verifier_for(roots: Vec<CertificateDer<'_>>) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root)?;
    }
    Ok(WebPkiServerVerifier::builder_with_provider(Arc::new(store), crypto_provider()).build()?)
}

type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// The user's client certificate chain and key, from inline base64 data or from files.
fn identity(user: &kube::config::AuthInfo) -> Result<Option<Identity>, TlsError> {
    let certificate = data_or_file(
        "the client certificate",
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_deref(),
    )?;
    let key_data = user.client_key_data.as_ref().map(|key| key.expose_secret().to_owned());
    let key = data_or_file("the client key", key_data.as_deref(), user.client_key.as_deref())?;
    match (certificate, key) {
        (None, None) => Ok(None),
        (Some(certificate), Some(key)) => {
            let chain: Vec<_> = pem_certificates(&certificate);
            if chain.is_empty() {
                return Err(TlsError::Pem { what: "the client certificate", expected: "CERTIFICATE" });
            }
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|_| TlsError::Pem { what: "the client key", expected: "PRIVATE KEY" })?;
            Ok(Some((chain, key)))
        }
        _ => Err(TlsError::HalfIdentity),
    }
}

fn data_or_file(what: &'static str, data: Option<&str>, file: Option<&str>) -> Result<Option<Vec<u8>>, TlsError> {
    if let Some(data) = data.filter(|d| !d.is_empty()) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|source| TlsError::Base64 { what, source })?;
        return Ok(Some(bytes));
    }
    match file.filter(|f| !f.is_empty()) {
        Some(path) => {
            std::fs::read(path).map(Some).map_err(|source| TlsError::Read { what, path: path.into(), source })
        }
        None => Ok(None),
    }
}

fn read_roots(path: &Path) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::Read { what: "the CA", path: path.into(), source })?;
    let roots = pem_certificates(&pem);
    if roots.is_empty() {
        return Err(TlsError::Pem { what: "the CA", expected: "CERTIFICATE" });
    }
    verifier_for(roots)
}

/// Trusts the CAs of a file read again once a minute (the service-account CA can rotate while
/// the process runs); a file that cannot be read keeps the roots read last.
#[derive(Debug)]
struct ReloadingCa {
    path: PathBuf,
    current: RwLock<(Arc<WebPkiServerVerifier>, Instant)>,
}

impl ReloadingCa {
    fn new(path: PathBuf) -> Result<Self, TlsError> {
        let verifier = read_roots(&path)?;
        Ok(ReloadingCa { path, current: RwLock::new((verifier, Instant::now())) })
    }

    fn verifier(&self) -> Arc<WebPkiServerVerifier> {
        let (verifier, read_at) = self.current.read().map(|g| g.clone()).unwrap_or_else(|e| e.into_inner().clone());
        if read_at.elapsed() < CA_RELOAD {
            return verifier;
        }
        let fresh = match read_roots(&self.path) {
            Ok(fresh) => fresh,
            Err(error) => {
                tracing::warn!(%error, "the API server's CA could not be read again; the roots read before stay");
                verifier
            }
        };
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = (Arc::clone(&fresh), Instant::now());
        fresh
    }
}

impl ServerCertVerifier for ReloadingCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier().verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.verifier().supported_verify_schemes()
    }
}

/// The PEM certificates in `pem` (anything else in it is skipped).
pub fn pem_certificates(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect()
}

/// Accepts any server certificate: `insecure-skip-tls-verify: true`, and the manager's upstream
/// fallback for sidecars with a self-signed certificate. The handshake's signatures are still
/// checked, so the peer at least holds the key of the certificate it shows.
#[derive(Debug)]
pub struct AnyServer(rustls::crypto::WebPkiSupportedAlgorithms);

impl AnyServer {
    pub fn new() -> Arc<Self> {
        Arc::new(AnyServer(crypto_provider().signature_verification_algorithms))
    }
}

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["plugin".to_owned()]).unwrap().self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_new_plugin_certificate_counts_as_a_change_and_the_same_one_does_not() {
        let identity = PluginIdentity::default();
        assert!(identity.current().is_none() && identity.generation() == 0);
        let (first, first_key) = pair();
        identity.set(&first, &first_key).unwrap();
        identity.set(&first, &first_key).unwrap();
        assert_eq!(identity.generation(), 1, "the same certificate again is no change");
        let (second, second_key) = pair();
        identity.set(&second, &second_key).unwrap();
        assert_eq!(identity.generation(), 2);
        let presented = identity.resolve(&[], &[SignatureScheme::ECDSA_NISTP256_SHA256]).unwrap();
        assert_eq!(presented.cert, pem_certificates(second.as_bytes()));
        assert!(identity.set("not PEM", &second_key).is_err());
        assert_eq!(identity.generation(), 2, "a refused certificate changes nothing");
    }
}
