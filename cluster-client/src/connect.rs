//! The TCP connection to the API server: direct, or through the proxy `proxy.rs` chose (an HTTP
//! CONNECT tunnel or a SOCKS5 connection). TLS goes on top, end to end with the API server.
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine;
use http::{HeaderValue, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::{SocksV5, Tunnel};
use hyper_util::rt::TokioIo;
use tower::BoxError;

use crate::proxy::{Protocol, Proxy};

/// Connects to the API server, directly or through a proxy.
#[derive(Clone)]
pub enum Route {
    Direct(HttpConnector),
    Tunnel(Tunnel<HttpConnector>),
    Socks(SocksV5<HttpConnector>),
}

impl Route {
    pub fn new(tcp: HttpConnector, proxy: Option<&Proxy>) -> Result<Self, http::header::InvalidHeaderValue> {
        let Some(proxy) = proxy else {
            return Ok(Route::Direct(tcp));
        };
        // The connector reaches the proxy itself by plain TCP.
        let proxy_address = proxy.address.clone();
        Ok(match proxy.protocol {
            Protocol::Http => {
                let tunnel = Tunnel::new(proxy_address, tcp);
                Route::Tunnel(match &proxy.credentials {
                    Some((user, password)) => {
                        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                        tunnel.with_auth(HeaderValue::from_str(&format!("Basic {encoded}"))?)
                    }
                    None => tunnel,
                })
            }
            Protocol::Socks5 => {
                let socks = SocksV5::new(proxy_address, tcp);
                match &proxy.credentials {
                    Some((user, password)) => Route::Socks(socks.with_auth(user.clone(), password.clone())),
                    None => Route::Socks(socks),
                }
            }
        })
    }
}

type Connection = TokioIo<tokio::net::TcpStream>;
type Connecting = Pin<Box<dyn Future<Output = Result<Connection, BoxError>> + Send>>;

impl tower::Service<Uri> for Route {
    type Response = Connection;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Route::Direct(tcp) => tcp.poll_ready(cx).map_err(Into::into),
            Route::Tunnel(tunnel) => tunnel.poll_ready(cx).map_err(Into::into),
            Route::Socks(socks) => socks.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, server: Uri) -> Connecting {
        match self {
            Route::Direct(tcp) => {
                let connecting = tcp.call(server);
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
            // The proxies are told the server's port even when its URL leaves it implied.
            Route::Tunnel(tunnel) => {
                let connecting = tunnel.call(with_port(server));
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
            Route::Socks(socks) => {
                let connecting = socks.call(with_port(server));
                Box::pin(async move { connecting.await.map_err(Into::into) })
            }
        }
    }
}

/// `server` with its scheme's port written out.
fn with_port(server: Uri) -> Uri {
    if server.port().is_some() {
        return server;
    }
    let (Some(scheme), Some(host)) = (server.scheme_str(), server.host()) else {
        return server;
    };
    let port = if scheme.eq_ignore_ascii_case("http") { 80 } else { 443 };
    format!("{scheme}://{host}:{port}").parse().unwrap_or(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_implied_port_is_written_out() {
        let port = |uri: &str| with_port(uri.parse().unwrap()).port_u16();
        assert_eq!(port("https://api.example.com"), Some(443));
        assert_eq!(port("http://api.example.com"), Some(80));
        assert_eq!(port("https://api.example.com:6443"), Some(6443));
        assert_eq!(port("https://[fd00::1]"), Some(443));
    }
}
