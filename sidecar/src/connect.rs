//! gRPC channels to a driver: `unix:///path`, a bare `/path`, or `host:port`.
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel that connects on first use and reconnects by itself after the connection drops (a
/// driver restart), which is what a long-running sidecar wants.
pub fn lazy(endpoint: &str) -> Result<Channel, tonic::transport::Error> {
    match unix_path(endpoint) {
        Some(path) => Ok(Endpoint::from_static("http://localhost").connect_with_connector_lazy(unix_connector(path))),
        None => Ok(Endpoint::from_shared(tcp_uri(endpoint))?.connect_lazy()),
    }
}

/// A channel connected now: a missing driver is reported at once (what a CLI wants).
pub async fn now(endpoint: &str) -> Result<Channel, tonic::transport::Error> {
    match unix_path(endpoint) {
        Some(path) => Endpoint::from_static("http://localhost").connect_with_connector(unix_connector(path)).await,
        None => Endpoint::from_shared(tcp_uri(endpoint))?.connect().await,
    }
}

fn unix_path(endpoint: &str) -> Option<String> {
    endpoint.strip_prefix("unix://").or_else(|| endpoint.starts_with('/').then_some(endpoint)).map(str::to_owned)
}

fn tcp_uri(endpoint: &str) -> String {
    if endpoint.contains("://") { endpoint.to_owned() } else { format!("http://{endpoint}") }
}

fn unix_connector(
    path: String,
) -> impl tower::Service<
    Uri,
    Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<hyper_util::rt::TokioIo<tokio::net::UnixStream>>> + Send,
> + Clone
+ Send {
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoint_forms() {
        assert_eq!(super::unix_path("unix:///run/csi-addons/socket").as_deref(), Some("/run/csi-addons/socket"));
        assert_eq!(super::unix_path("/run/csi-addons/socket").as_deref(), Some("/run/csi-addons/socket"));
        assert_eq!(super::unix_path("10.0.0.1:9070"), None);
        assert_eq!(super::tcp_uri("10.0.0.1:9070"), "http://10.0.0.1:9070");
        assert_eq!(super::tcp_uri("https://h:1"), "https://h:1");
    }
}
