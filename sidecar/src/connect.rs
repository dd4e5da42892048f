//! gRPC channels to a driver: `unix:///path`, a bare `/path`, or `host:port`. tonic dials
//! `unix:` URIs itself, taking what follows `unix://` (or `unix:`) as the path, so that
//! `unix://relative/path` stays relative, as Go reads it.
use tonic::transport::{Channel, Endpoint};

/// The endpoint of a driver address.
fn endpoint(address: &str) -> Result<Endpoint, tonic::transport::Error> {
    Endpoint::from_shared(uri(address))
}

/// A channel that connects on first use and reconnects by itself after the connection drops (a
/// driver restart), which is what a long-running sidecar wants.
pub fn lazy(address: &str) -> Result<Channel, tonic::transport::Error> {
    Ok(endpoint(address)?.connect_lazy())
}

/// A channel connected now: a missing driver is reported at once (what a CLI wants).
pub async fn now(address: &str) -> Result<Channel, tonic::transport::Error> {
    endpoint(address)?.connect().await
}

/// `unix://…` and `http(s)://…` as they are; a bare path is a Unix socket, anything else a TCP
/// `host:port`.
fn uri(address: &str) -> String {
    if address.starts_with('/') {
        format!("unix://{address}")
    } else if address.contains("://") || address.starts_with("unix:") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoint_forms() {
        assert_eq!(super::uri("unix:///run/csi-addons/socket"), "unix:///run/csi-addons/socket");
        assert_eq!(super::uri("/run/csi-addons/socket"), "unix:///run/csi-addons/socket");
        assert_eq!(super::uri("10.0.0.1:9070"), "http://10.0.0.1:9070");
        assert_eq!(super::uri("https://h:1"), "https://h:1");
    }
}
