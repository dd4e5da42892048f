//! The Kubernetes client. kube's own stack speaks HTTP/1.1: a TLS connection (with its buffers)
//! per request in flight and one per watch, some thirty for this manager. This one offers
//! HTTP/2 as client-go does, so every watch and request shares one connection, kept alive by
//! pings; the API server picks the protocol (ALPN), and a plain-HTTP URL stays HTTP/1.1. Behind
//! a proxy, kube's own stack is used, which knows how to tunnel.
use std::time::Duration;

use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::limit::ConcurrencyLimitLayer;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// How often an idle HTTP/2 connection is pinged, and how long an answer may take before the
/// connection counts as dead (client-go's ReadIdleTimeout and PingTimeout).
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    #[error("no Kubernetes configuration (in-cluster or KUBECONFIG): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("the API server's TLS name {name:?}: {source}")]
    ServerName {
        name: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
}

/// A client with at most `in_flight` requests at once (watches hold a slot only until their
/// response starts), retrying 429, 503 and 504 answers as kube's own stack does.
pub async fn api_client(in_flight: usize) -> Result<kube::Client, ApiClientError> {
    let config = kube::Config::infer().await?;
    if config.proxy_url.is_some() {
        let builder = kube::client::ClientBuilder::try_from(config)?;
        return Ok(builder.with_layer(&ConcurrencyLimitLayer::new(in_flight)).build());
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let tls =
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config.rustls_client_config()?).https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => {
            let server_name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|source| ApiClientError::ServerName { name: name.clone(), source })?;
            tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(server_name))
        }
        None => tls,
    };
    let connector = tls.enable_all_versions().wrap_connector(http);
    let hyper = HyperClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(in_flight))
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}
