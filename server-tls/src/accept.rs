//! TLS connections accepted for a server (the sidecar's gRPC server, the manager's metrics): each
//! handshake runs in a task of its own, at most ten seconds, so one slow or silent client holds
//! up no other. The accept loop stops when the server stops taking connections (the receiver is
//! dropped), and the port is released.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server.
const QUEUE: usize = 64;

/// A connection that finished its handshake, and its peer.
pub type TlsConnection = (TlsStream<TcpStream>, SocketAddr);

/// Accepts on `listener` and hands over the connections whose handshake under `config` succeeds.
pub fn accept(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> mpsc::Receiver<TlsConnection> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let (sender, accepted) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = listener.accept() => next,
                () = sender.closed() => return,
            };
            let (tcp, peer) = match next {
                Ok(connection) => connection,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, sender) = (acceptor.clone(), sender.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = sender.send((tls, peer)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    accepted
}
