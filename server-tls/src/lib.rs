//! TLS for our servers (the sidecar's gRPC server, the manager's metrics): a certificate from
//! files (cert-manager or any mounted Secret), re-read when the files change (upstream's sidecar
//! takes none) [differs: tls-files], or a self-signed one made at start and renewed in time; and
//! Go's `--tls-min-version`, `--tls-cipher-suites` and `--tls-curve-preferences`.

#![forbid(unsafe_code)]

pub mod accept;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::aws_lc_rs::{self, kx_group};
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--tls-cert-file and --tls-key-file must be given together")]
    HalfPair,
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path} holds no PEM private key: {message}")]
    BadKey { path: String, message: String },
    #[error("the certificate and key cannot be used: {0}")]
    Unusable(String),
    #[error("making the self-signed certificate: {0}")]
    SelfSigned(String),
    #[error("--tls-min-version {0:?} is not one of VersionTLS12, VersionTLS13")]
    MinVersion(String),
    #[error("--tls-cipher-suites: {name:?} is not a supported TLS 1.2 cipher suite; supported: {supported}")]
    CipherSuite { name: String, supported: String },
    #[error(
        "--tls-cipher-suites names no TLS 1.2 cipher suite this build has ({supported}), and \
         --tls-min-version lets TLS 1.2 clients in: they could not connect. Add one of those, or set \
         --tls-min-version=VersionTLS13"
    )]
    NoTls12Suite { supported: String },
    #[error(
        "--tls-curve-preferences: {name:?} is not a supported curve; supported: X25519MLKEM768, SecP256r1MLKEM768, X25519, CurveP256, CurveP384"
    )]
    Curve { name: String },
    #[error("--tls-curve-preferences leaves no curve this build supports")]
    NoCurve,
}

/// Protocol settings from upstream's flags.
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    pub min_version: String,
    pub cipher_suites: Vec<String>,
    pub curves: Vec<String>,
}

/// Where the served certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// Made at start, as upstream does; the controller cannot verify it.
    SelfSigned,
}

impl CertSource {
    pub fn from_flags(cert: Option<&str>, key: Option<&str>) -> Result<Self, TlsError> {
        match (cert.filter(|c| !c.is_empty()), key.filter(|k| !k.is_empty())) {
            (Some(cert), Some(key)) => Ok(CertSource::Files { cert: cert.into(), key: key.into() }),
            (None, None) => Ok(CertSource::SelfSigned),
            _ => Err(TlsError::HalfPair),
        }
    }
}

/// The server configuration; certificate files are checked for changes at most once a second.
pub fn server_config(source: &CertSource, settings: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let versions: &[&rustls::SupportedProtocolVersion] = match settings.min_version.as_str() {
        "" | "VersionTLS12" | "1.2" | "TLS12" => &[&rustls::version::TLS13, &rustls::version::TLS12],
        "VersionTLS13" | "1.3" | "TLS13" => &[&rustls::version::TLS13],
        other => return Err(TlsError::MinVersion(other.to_owned())),
    };
    let provider = Arc::new(provider(settings, versions.len() == 1)?);
    let resolver: Arc<dyn ResolvesServerCert> = match source {
        CertSource::Files { cert, key } => Arc::new(ReloadingCert::load(cert, key, provider.clone())?),
        CertSource::SelfSigned => Arc::new(SelfSignedCert::new(provider.clone())?),
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Unusable(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The names Go's `tls.CipherSuites()` gives beside the TLS 1.2 suites this build has: the TLS 1.3
/// suites, which a list cannot turn off in Go either, and the ECDHE suites with CBC, which rustls
/// does not implement. A command line written for upstream may name any of them.
const TLS13_SUITES: [&str; 3] = ["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"];
const CBC_SUITES: [&str; 4] = [
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
];

/// The crypto provider `settings` leave. `tls13_only`: TLS 1.2 is off, so a list without a TLS 1.2
/// suite this build has still leaves a working server.
fn provider(settings: &TlsSettings, tls13_only: bool) -> Result<CryptoProvider, TlsError> {
    let mut provider = aws_lc_rs::default_provider();
    let listed: Vec<&str> = settings.cipher_suites.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
    if !settings.cipher_suites.is_empty() {
        // As in Go, the list chooses among TLS 1.2 suites; TLS 1.3 suites are always on.
        let tls12 = |s: &rustls::SupportedCipherSuite| s.version() == &rustls::version::TLS12;
        let name = |s: &rustls::SupportedCipherSuite| format!("{:?}", s.suite());
        let supported = || provider.cipher_suites.iter().filter(|s| tls12(s)).map(name).collect::<Vec<_>>().join(", ");
        let mut chosen: Vec<_> = provider.cipher_suites.iter().filter(|s| !tls12(s)).copied().collect();
        let mut tls12_chosen = false;
        for wanted in listed {
            if TLS13_SUITES.contains(&wanted) {
                continue;
            }
            if CBC_SUITES.contains(&wanted) {
                tracing::warn!(suite = wanted, "CBC cipher suites are not available in this build; skipped");
                continue;
            }
            // Go's older names of the ChaCha20 suites lack the `_SHA256`.
            let wanted_norm = wanted.trim_end_matches("_SHA256");
            let found = provider.cipher_suites.iter().filter(|s| tls12(s)).find(|s| {
                let n = name(s);
                n == wanted || n.trim_end_matches("_SHA256") == wanted_norm
            });
            let Some(suite) = found else {
                return Err(TlsError::CipherSuite { name: wanted.to_owned(), supported: supported() });
            };
            if !chosen.iter().any(|c| c.suite() == suite.suite()) {
                chosen.push(*suite);
            }
            tls12_chosen = true;
        }
        if !tls12_chosen && !tls13_only {
            return Err(TlsError::NoTls12Suite { supported: supported() });
        }
        provider.cipher_suites = chosen;
    }
    if !settings.curves.is_empty() {
        let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        for curve in &settings.curves {
            match curve.trim() {
                // Go's names (`tls.CurveID`'s), and the IANA and OpenSSL ones.
                "X25519MLKEM768" => groups.push(kx_group::X25519MLKEM768),
                "SecP256r1MLKEM768" | "SECP256R1MLKEM768" => groups.push(kx_group::SECP256R1MLKEM768),
                "X25519" => groups.push(kx_group::X25519),
                "CurveP256" | "P256" | "secp256r1" => groups.push(kx_group::SECP256R1),
                "CurveP384" | "P384" | "secp384r1" => groups.push(kx_group::SECP384R1),
                // Names Go accepts for groups rustls lacks (P-521, and the hybrid on P-384): skipped
                // with a warning, so a command line written for upstream's sidecar still starts.
                // [differs: tls-curves]
                absent @ ("CurveP521" | "P521" | "secp521r1" | "SecP384r1MLKEM1024" | "SECP384R1MLKEM1024") => {
                    tracing::warn!(curve = absent, "this key exchange group is not available in this build; skipped");
                }
                other => return Err(TlsError::Curve { name: other.to_owned() }),
            }
        }
        if groups.is_empty() {
            return Err(TlsError::NoCurve);
        }
        provider.kx_groups = groups;
    }
    Ok(provider)
}

/// Validity of the self-signed certificate, and how often a new one is made (upstream's lasts a
/// year and is never renewed: a sidecar running longer stops being reachable).
/// [differs: self-signed-cert]
const SELF_SIGNED_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
const SELF_SIGNED_RENEWAL: Duration = Duration::from_secs(30 * 24 * 3600);

/// An ECDSA P-256 self-signed certificate (smaller and faster to make than upstream's RSA-2048).
fn self_signed() -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let err = |e: rcgen::Error| TlsError::SelfSigned(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(err)?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).map_err(err)?;
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "k8s-addons-sidecar-server");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(300);
    params.not_after = now + SELF_SIGNED_VALIDITY;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(&key).map_err(err)?;
    Ok((cert.pem().into_bytes(), key.serialize_pem().into_bytes()))
}

fn certified_key(cert_pem: &[u8], key_pem: &[u8], provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    certified_key_named(cert_pem, key_pem, provider, "certificate", "key")
}

fn certified_key_named(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
    cert_name: &str,
    key_name: &str,
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem).filter_map(Result::ok).collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: cert_name.to_owned() });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::BadKey { path: key_name.to_owned(), message: e.to_string() })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Unusable(e.to_string()))
}

/// The self-signed certificate, made again well before it expires.
struct SelfSignedCert {
    provider: Arc<CryptoProvider>,
    current: Mutex<(Arc<CertifiedKey>, Instant)>,
}

impl SelfSignedCert {
    fn new(provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let key = Self::make(&provider)?;
        Ok(SelfSignedCert { provider, current: Mutex::new((key, Instant::now())) })
    }

    fn make(provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, TlsError> {
        let (cert, key) = self_signed()?;
        Ok(Arc::new(certified_key(&cert, &key, provider)?))
    }
}

impl std::fmt::Debug for SelfSignedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SelfSignedCert")
    }
}

impl ResolvesServerCert for SelfSignedCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.1.elapsed() >= SELF_SIGNED_RENEWAL {
            match Self::make(&self.provider) {
                Ok(key) => *current = (key, Instant::now()),
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the self-signed certificate failed; keeping the old one")
                }
            }
        }
        Some(current.0.clone())
    }
}

/// A certificate read from files and read again when either file's modification time changes
/// (a Secret update rewrites the mounted files). A broken update keeps the last good pair.
struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Mutex<Loaded>,
}

struct Loaded {
    key: Arc<CertifiedKey>,
    stamp: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert").field("cert", &self.cert).field("key", &self.key).finish()
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.display().to_string(), source })
}

impl ReloadingCert {
    fn load(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let stamp = (modified(cert), modified(key));
        let loaded = Self::read_pair(cert, key, &provider)?;
        Ok(ReloadingCert {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            current: Mutex::new(Loaded { key: Arc::new(loaded), stamp, checked: Instant::now() }),
        })
    }

    fn read_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
        certified_key_named(
            &read(cert)?,
            &read(key)?,
            provider,
            &cert.display().to_string(),
            &key.display().to_string(),
        )
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.checked.elapsed() >= Duration::from_secs(1) {
            current.checked = Instant::now();
            let stamp = (modified(&self.cert), modified(&self.key));
            if stamp != current.stamp {
                match Self::read_pair(&self.cert, &self.key, &self.provider) {
                    Ok(key) => {
                        tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                        current.key = Arc::new(key);
                        current.stamp = stamp;
                    }
                    // Half-written update: keep serving the old pair and try again next time.
                    Err(e) => tracing::warn!(error = %e, "certificate files changed but cannot be used yet"),
                }
            }
        }
        Some(current.key.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rest of Go's `tls.CipherSuites()`: the TLS 1.2 suites with GCM or ChaCha20.
    const GO_GCM_AND_CHACHA: [&str; 6] = [
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ];

    fn settings() -> TlsSettings {
        TlsSettings { min_version: "VersionTLS12".into(), ..Default::default() }
    }

    #[test]
    fn self_signed_config_builds() {
        assert!(server_config(&CertSource::SelfSigned, &settings()).is_ok());
    }

    #[test]
    fn named_but_missing_files_are_a_clear_error() {
        let source = CertSource::Files { cert: "/nonexistent/tls.crt".into(), key: "/nonexistent/tls.key".into() };
        let err = server_config(&source, &settings()).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/tls.crt"), "{err}");
        assert!(matches!(CertSource::from_flags(Some("a"), None), Err(TlsError::HalfPair)));
    }

    #[test]
    fn protocol_flags_are_checked() {
        let with = |f: fn(&mut TlsSettings)| {
            let mut s = settings();
            f(&mut s);
            server_config(&CertSource::SelfSigned, &s).map(|_| ()).map_err(|e| e.to_string())
        };
        assert!(with(|s| s.min_version = "VersionTLS13".into()).is_ok());
        assert!(with(|s| s.min_version = "VersionSSL30".into()).unwrap_err().contains("VersionTLS12"));
        assert!(with(|s| s.cipher_suites = vec!["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()]).is_ok());
        assert!(with(|s| s.cipher_suites = vec!["TLS_RSA_WITH_RC4_128_SHA".into()]).unwrap_err().contains("RC4"));
        // Every name Go's tls.CipherSuites() gives starts a server whose TLS 1.2 has a suite; the
        // TLS 1.3 names change nothing, and the CBC ones are skipped.
        assert!(
            with(|s| s.cipher_suites = [&TLS13_SUITES[..], &CBC_SUITES[..], &GO_GCM_AND_CHACHA[..]]
                .concat()
                .iter()
                .map(|n| (*n).to_owned())
                .collect())
            .is_ok()
        );
        // A list of CBC or TLS 1.3 suites alone leaves TLS 1.2 nothing: refused while TLS 1.2 is
        // allowed, saying what to do; fine when the minimum is TLS 1.3.
        let cbc_only = |s: &mut TlsSettings| s.cipher_suites = vec!["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA".into()];
        let refused = with(cbc_only).unwrap_err();
        assert!(refused.contains("no TLS 1.2 cipher suite") && refused.contains("VersionTLS13"), "{refused}");
        assert!(with(|s| s.cipher_suites = vec!["TLS_AES_128_GCM_SHA256".into()]).is_err());
        assert!(
            with(|s| {
                s.min_version = "VersionTLS13".into();
                s.cipher_suites = vec!["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA".into(), "TLS_AES_256_GCM_SHA384".into()];
            })
            .is_ok()
        );
        assert!(with(|s| s.curves = vec!["X25519MLKEM768".into(), "CurveP256".into()]).is_ok());
        assert!(with(|s| s.curves = vec!["CurveP999".into()]).unwrap_err().contains("CurveP999"));
        // Go's names of groups rustls lacks are accepted and skipped; alone they leave no curve.
        assert!(with(|s| s.curves = vec!["CurveP521".into(), "CurveP384".into()]).is_ok());
        assert!(with(|s| s.curves = vec!["CurveP521".into()]).unwrap_err().contains("no curve"));
        assert!(with(|s| s.curves = vec!["SecP384r1MLKEM1024".into()]).unwrap_err().contains("no curve"));
    }

    /// The key exchange groups a provider offers, by their IANA names.
    fn group_names(provider: &CryptoProvider) -> Vec<String> {
        provider.kx_groups.iter().map(|g| format!("{:?}", g.name())).collect()
    }

    #[test]
    fn post_quantum_key_exchange_is_offered_first_as_in_go() {
        // Go 1.24's default order: X25519MLKEM768, X25519, P-256, P-384 (and P-521, absent here).
        let default = provider(&settings(), false).unwrap();
        assert_eq!(group_names(&default), ["X25519MLKEM768", "X25519", "secp256r1", "secp384r1"]);
        // Upstream's names pick the hybrids, in the order given.
        let mut named = settings();
        named.curves = ["SecP256r1MLKEM768", "X25519MLKEM768", "CurveP384"].map(String::from).to_vec();
        assert_eq!(
            group_names(&provider(&named, false).unwrap()),
            ["secp256r1MLKEM768", "X25519MLKEM768", "secp384r1"]
        );
    }
}
