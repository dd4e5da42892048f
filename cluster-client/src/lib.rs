//! The Kubernetes API client of the manager and the sidecar.
//!
//! kube's own stack speaks HTTP/1.1: a TLS connection (with its buffers) per request in flight
//! and one per watch, some thirty for the manager. This one offers HTTP/2 as client-go does, so
//! every watch and request shares one connection, kept alive by pings; the API server picks the
//! protocol (ALPN), and a plain-HTTP URL stays HTTP/1.1.
//!
//! Configuration, credentials and TLS are read here too (`kubeconfig`, `auth`, `tls`) rather than
//! by kube's loaders, whose YAML, JSONPath and regex engines are some 0.9 MB of code that stays
//! mapped, in every Pod, for the process's life. kube still resolves contexts and merges files.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::limit::ConcurrencyLimitLayer;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

pub mod auth;
mod connect;
mod connections;
pub mod election;
pub mod kubeconfig;
pub mod observe;
pub mod proxy;
pub mod tls;
pub mod token_review;
pub mod yaml;

pub use kubeconfig::ConfigError;

/// How often an idle HTTP/2 connection is pinged, and how long an answer may take before the
/// connection counts as dead (client-go's ReadIdleTimeout and PingTimeout).
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("the API server's TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("the credentials: {0}")]
    Auth(#[from] auth::AuthError),
    #[error("the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("the API server's TLS name {name:?}: {source}")]
    ServerName {
        name: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("the proxy: {0}")]
    Proxy(#[from] proxy::ProxyError),
    #[error("the proxy's credentials are not valid in an HTTP header")]
    ProxyCredentials(#[source] http::header::InvalidHeaderValue),
}

/// What a client does beyond its configuration.
#[derive(Clone, Default)]
pub struct Options {
    /// At most this many requests at once (watches hold a slot only until their response starts).
    pub in_flight: Option<usize>,
    /// Told of every attempt of every request (see `observe`).
    pub observer: Option<observe::Observer>,
}

/// A client configured as `kubeconfig::infer` finds, retrying 429, 503 and 504 answers as kube's
/// own stack does (after the server's Retry-After when it gives one, as client-go). Its requests
/// carry `agent` (see `user_agent`) as their User-Agent, so the API server's audit log and metrics
/// tell the programs apart.
pub async fn client(agent: &str, kubeconfig: Option<&Path>, options: Options) -> Result<kube::Client, ClientError> {
    let mut config = kubeconfig::infer(kubeconfig).await?;
    if let Ok(agent) = http::HeaderValue::from_str(agent) {
        config.headers.push((http::header::USER_AGENT, agent));
    }
    client_for(config, options)
}

/// A User-Agent in client-go's form, `program/vVERSION (os/arch)`: kube sends none, and a request
/// without one is anonymous in audit logs, where several programs share a service account (the
/// CSI-Addons sidecar and the CSI sidecars in a driver's Pods).
pub fn user_agent(program: &str, version: &str) -> String {
    format!("{program}/v{version} ({}/{}) csi-addons-rs", std::env::consts::OS, std::env::consts::ARCH)
}

/// A client for `config` (see `client`).
pub fn client_for(config: kube::Config, options: Options) -> Result<kube::Client, ClientError> {
    let proxy = match &config.proxy_url {
        Some(url) => Some(proxy::Proxy::parse("the proxy URL", &url.to_string())?),
        None => None,
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let route = connect::Route::new(http, proxy.as_ref()).map_err(ClientError::ProxyCredentials)?;
    let credentials = auth::Credentials::of(&config.auth_info)?;
    let plugin_identity = credentials.plugin_identity();
    let tls_config = tls::client_config(&config, plugin_identity.clone())?;
    let tls = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls_config).https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => {
            let server_name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|source| ClientError::ServerName { name: name.clone(), source })?;
            tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(server_name))
        }
        None => tls,
    };
    let connector = tls.enable_all_versions().wrap_connector(route);
    let mut builder = HyperClient::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true);
    let hyper = connections::Connections::new(builder, connector, plugin_identity);
    let service = ServiceBuilder::new()
        .option_layer(options.in_flight.map(ConcurrencyLimitLayer::new))
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(options.observer.map(observe::ObserveLayer))
        .layer(auth::AuthLayer(Arc::new(credentials)))
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod retry_tests;
