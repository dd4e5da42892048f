//! How the manager talks to a sidecar: TLS that verifies the sidecar against its driver's CA
//! (`driver_trust`), else against `--sidecar-ca-file` (upstream never verifies a sidecar)
//! [differs: sidecar-ca-file], else not at all (upstream's unverified TLS, so our manager can
//! drive upstream's self-signed sidecars; said once per driver); plain TCP with
//! `--enable-auth=false`; and the manager's ServiceAccount token on every call, re-read from its
//! file as the kubelet rotates it.
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use api::driver::SIDECAR_CA_ANNOTATION;
use rustls::ClientConfig;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::sync::watch;

use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};

/// Projected tokens are replaced well before they expire; re-reading once a minute follows them.
const TOKEN_REREAD: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a sidecar could not be reached or the client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} holds no PEM certificate")]
    NoCertificate(String),
    #[error("the sidecar CA cannot be used: {0}")]
    BadCa(String),
    #[error("the sidecars of driver {driver} are not called: {why}")]
    Untrusted { driver: String, why: String },
    #[error("endpoint {endpoint:?}: {why}")]
    Endpoint { endpoint: String, why: String },
    #[error("connecting to sidecar {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// The manager's bearer token, from a file, cached briefly. Never logged.
pub struct TokenFile {
    path: PathBuf,
    cached: Mutex<Option<(String, Instant)>>,
}

impl TokenFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        TokenFile { path: path.into(), cached: Mutex::new(None) }
    }

    pub fn token(&self) -> Result<String, ClientError> {
        let mut cached = self.cached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((token, read_at)) = cached.as_ref()
            && read_at.elapsed() < TOKEN_REREAD
        {
            return Ok(token.clone());
        }
        let token = std::fs::read_to_string(&self.path)
            .map_err(|source| ClientError::Read { path: self.path.display().to_string(), source })?
            .trim()
            .to_owned();
        *cached = Some((token.clone(), Instant::now()));
        Ok(token)
    }
}

/// Adds `authorization: Bearer <token>` to every call; a token that cannot be read fails the
/// call as UNAUTHENTICATED with the reason.
#[derive(Clone)]
pub struct BearerToken(Option<Arc<TokenFile>>);

impl BearerToken {
    /// No token (plain TCP towards sidecars with auth off).
    pub fn none() -> Self {
        BearerToken(None)
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(file) = &self.0 else { return Ok(request) };
        let token = file.token().map_err(|e| tonic::Status::unauthenticated(e.to_string()))?;
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::unauthenticated("the token file holds characters a header cannot carry"))?;
        request.metadata_mut().insert("authorization", value);
        Ok(request)
    }
}

/// A connection to one sidecar, with the token interceptor.
pub type SidecarChannel = InterceptedService<Channel, BearerToken>;

/// A client configuration that verifies servers against the certificates of `pem` (from
/// `source`, named in errors).
pub fn verifying_config(pem: &[u8], source: &str) -> Result<rustls::ClientConfig, ClientError> {
    let provider = cluster_client::tls::crypto_provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::BadCa(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = cluster_client::tls::pem_certificates(pem);
    if certs.is_empty() {
        return Err(ClientError::NoCertificate(source.to_owned()));
    }
    for cert in certs {
        roots.add(cert).map_err(|e| ClientError::BadCa(format!("{source}: {e}")))?;
    }
    let mut config = builder.with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// One driver's trust: the bundle its CSIDriver names, and what came of it.
struct Trusted {
    bundle: String,
    /// The verifier, or why the bundle cannot be used. A broken bundle fails closed: the
    /// driver's sidecars are not called at all, rather than called unverified.
    verifier: Result<Arc<ClientConfig>, String>,
}

/// Per-driver trust (followed from the CSIDrivers by `driver_trust`): the drivers' verifiers,
/// by driver name.
pub struct DriverTrust {
    verifiers: RwLock<HashMap<String, Trusted>>,
    /// Counts the changes of each driver's trust: a connection dialled under another count is
    /// dialled again, so one made unverified (or under an old CA) is not kept once a CA appears.
    stamps: Mutex<HashMap<String, u64>>,
    /// Counts every change, for those who wait for one.
    changed: watch::Sender<u64>,
    warned: Mutex<HashSet<String>>,
    synced: watch::Sender<bool>,
}

impl DriverTrust {
    pub fn new() -> Arc<Self> {
        Arc::new(DriverTrust {
            verifiers: RwLock::default(),
            stamps: Mutex::default(),
            changed: watch::channel(0).0,
            warned: Mutex::default(),
            synced: watch::channel(false).0,
        })
    }

    /// The TLS configuration that verifies `driver`'s sidecars, if its CSIDriver names a usable CA.
    pub fn config(&self, driver: &str) -> Option<Arc<ClientConfig>> {
        self.verifier(driver).and_then(Result::ok)
    }

    /// `driver`'s verifier: `None` when its CSIDriver names no CA, an error when the CA it names
    /// cannot be used.
    pub fn verifier(&self, driver: &str) -> Option<Result<Arc<ClientConfig>, String>> {
        self.verifiers.read().unwrap_or_else(PoisonError::into_inner).get(driver).map(|t| t.verifier.clone())
    }

    /// The count of `driver`'s trust changes so far (see `stamps`).
    pub fn stamp(&self, driver: &str) -> u64 {
        self.stamps.lock().unwrap_or_else(PoisonError::into_inner).get(driver).copied().unwrap_or(0)
    }

    /// One item per trust change from now on (the sidecars' connections are then checked again).
    pub fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        futures::stream::unfold(self.changed.subscribe(), |mut seen| async move {
            seen.changed().await.ok()?;
            Some(((), seen))
        })
    }

    /// Sets `driver`'s CA bundle (`None` removes it). A bundle without a usable certificate is an
    /// error, and is kept as such: the driver's sidecars are then refused, not reached unverified.
    pub fn set(&self, driver: &str, bundle: Option<&str>) -> Result<(), ClientError> {
        let mut verifiers = self.verifiers.write().unwrap_or_else(PoisonError::into_inner);
        let current = verifiers.get(driver).map(|t| t.bundle.as_str());
        if current == bundle {
            let broken = verifiers.get(driver).and_then(|t| t.verifier.as_ref().err());
            return broken
                .map_or(Ok(()), |why| Err(ClientError::Untrusted { driver: driver.to_owned(), why: why.clone() }));
        }
        *self.stamps.lock().unwrap_or_else(PoisonError::into_inner).entry(driver.to_owned()).or_default() += 1;
        self.changed.send_modify(|n| *n += 1);
        let Some(pem) = bundle else {
            verifiers.remove(driver);
            return Ok(());
        };
        // The error goes to the caller as it is; its words are kept for the refusals to come.
        let verifier = verifying_config(pem.as_bytes(), &format!("CSIDriver {driver}")).map(Arc::new);
        let kept = verifier.as_ref().map(Arc::clone).map_err(ToString::to_string);
        verifiers.insert(driver.to_owned(), Trusted { bundle: pem.to_owned(), verifier: kept });
        verifier.map(drop)
    }

    /// True the first time it is asked for `driver`: whether to warn that its sidecars are not
    /// verified.
    pub fn first_unverified(&self, driver: &str) -> bool {
        self.warned.lock().unwrap_or_else(PoisonError::into_inner).insert(driver.to_owned())
    }

    /// The drivers trusted now.
    pub fn drivers(&self) -> Vec<String> {
        self.verifiers.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// Every CSIDriver has been read (or reading them is forbidden).
    pub fn mark_synced(&self) {
        self.synced.send_replace(true);
    }

    /// Returns once every CSIDriver has been read (or reading them is forbidden): sidecars are
    /// dialled only then, so none of a driver with a CA is reached unverified at start.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.subscribe();
        let _ = synced.wait_for(|s| *s).await;
    }
}

/// How the manager secures its calls to sidecars.
#[derive(Clone)]
pub struct Security {
    /// `None`: plain TCP and no token (`--enable-auth=false`).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Whether `tls` verifies (a `--sidecar-ca-file` was given).
    verified: bool,
    token: BearerToken,
    trust: Arc<DriverTrust>,
}

impl Security {
    /// `--enable-auth=false`.
    pub fn plain() -> Self {
        Security { tls: None, verified: false, token: BearerToken::none(), trust: DriverTrust::new() }
    }

    /// The per-driver CAs this manager verifies sidecars with.
    pub fn trust(&self) -> Arc<DriverTrust> {
        self.trust.clone()
    }

    /// TLS and the token in `token_file`; the sidecar verified against `ca_file`, or, without one,
    /// not verified (upstream's behaviour; logged once by the caller).
    pub fn tls(token_file: impl Into<PathBuf>, ca_file: Option<&str>) -> Result<Self, ClientError> {
        let config = match ca_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|source| ClientError::Read { path: path.to_owned(), source })?;
                verifying_config(&pem, path)?
            }
            None => {
                let provider = cluster_client::tls::crypto_provider();
                let mut config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| ClientError::BadCa(e.to_string()))?
                    .dangerous()
                    .with_custom_certificate_verifier(cluster_client::tls::AnyServer::new())
                    .with_no_client_auth();
                config.alpn_protocols = vec![b"h2".to_vec()];
                config
            }
        };
        Ok(Security {
            tls: Some(Arc::new(config)),
            verified: ca_file.is_some(),
            token: BearerToken(Some(Arc::new(TokenFile::new(token_file)))),
            trust: DriverTrust::new(),
        })
    }

    /// Connects to `address` (`host:port`, IPv6 in brackets), a sidecar of `driver`.
    pub async fn connect(&self, address: &str, driver: &str) -> Result<SidecarChannel, ClientError> {
        let (endpoint, tls) = self.dialer(address, driver)?;
        let connected = match tls {
            None => endpoint.connect().await,
            Some(tls) => endpoint.connect_with_connector(tls.connector()).await,
        };
        let channel = connected.map_err(|source| ClientError::Connect { endpoint: address.to_owned(), source })?;
        Ok(InterceptedService::new(channel, self.token.clone()))
    }

    /// As [`Security::connect`], but connects at the first call (a connection closed for
    /// idleness, opened again), with the driver's trust as it is now.
    pub fn connect_lazy(&self, address: &str, driver: &str) -> Result<SidecarChannel, ClientError> {
        let (endpoint, tls) = self.dialer(address, driver)?;
        let channel = match tls {
            None => endpoint.connect_lazy(),
            Some(tls) => endpoint.connect_with_connector_lazy(tls.connector()),
        };
        Ok(InterceptedService::new(channel, self.token.clone()))
    }

    /// The endpoint of `address`, and how to wrap its TCP in TLS (`None`: plain TCP).
    fn dialer(&self, address: &str, driver: &str) -> Result<(Endpoint, Option<TlsTarget>), ClientError> {
        let bad = |why: &str| ClientError::Endpoint { endpoint: address.to_owned(), why: why.to_owned() };
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| bad(&e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT);
        let Some(default) = &self.tls else { return Ok((endpoint, None)) };
        let (config, name) = match self.trust.verifier(driver) {
            Some(Err(why)) => {
                return Err(ClientError::Untrusted {
                    driver: driver.to_owned(),
                    why: format!(
                        "the CA bundle in its CSIDriver's annotation {SIDECAR_CA_ANNOTATION} cannot be used: {why}"
                    ),
                });
            }
            // The driver's own CA, and its name as the server name.
            Some(Ok(config)) => {
                let name = ServerName::try_from(driver.to_owned()).map_err(|e| bad(&e.to_string()))?;
                (config, name)
            }
            None => {
                if !self.verified && self.trust.first_unverified(driver) {
                    tracing::warn!(
                        %driver,
                        "the sidecars of this driver are not verified: its CSIDriver names no CA \
                         (annotation {}) and no --sidecar-ca-file is given (upstream's self-signed mode)",
                        SIDECAR_CA_ANNOTATION
                    );
                }
                let host = address.rsplit_once(':').map(|(h, _)| h).ok_or_else(|| bad("no port"))?;
                let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
                (default.clone(), ServerName::try_from(host).map_err(|e| bad(&e.to_string()))?)
            }
        };
        Ok((endpoint, Some(TlsTarget { config, name, address: address.to_owned() })))
    }
}

type TlsIo = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// Where TLS goes: the client configuration, the name to verify, the address to dial.
struct TlsTarget {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    address: String,
}

impl TlsTarget {
    /// A connector that dials TCP and speaks TLS over it.
    fn connector(
        self,
    ) -> impl tower::Service<Uri, Response = TlsIo, Error = std::io::Error, Future: Send> + Clone + Send {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        let (name, target) = (self.name, self.address);
        tower::service_fn(move |_: Uri| {
            let (connector, name, target) = (connector.clone(), name.clone(), target.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(&target).await?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        })
    }
}

/// A request to a sidecar that gives up after `timeout` (the deadline travels to the sidecar too).
pub fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_reread_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc\n").unwrap();
        let file = TokenFile::new(&path);
        assert_eq!(file.token().unwrap(), "abc");
        let missing = TokenFile::new(dir.path().join("nope")).token().unwrap_err().to_string();
        assert!(missing.contains("nope"), "{missing}");
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "not a certificate").unwrap();
        let err = Security::tls("/token", Some(path.to_str().unwrap())).err().unwrap().to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        assert!(Security::tls("/token", None).is_ok());
    }
}
