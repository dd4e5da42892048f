//! Serving the driver's gRPC services on Unix sockets, with every failed call logged once.
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::http;

/// Parses `unix:///path/to.sock` (or a bare path) into the socket path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.is_empty() || !path.starts_with('/') {
        return Err(format!("endpoint {endpoint:?} is not unix:///absolute/path"));
    }
    Ok(PathBuf::from(path))
}

/// Binds a Unix socket at `path`, replacing a stale socket left by an earlier run.
pub fn bind(path: &Path) -> std::io::Result<UnixListenerStream> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    Ok(UnixListenerStream::new(UnixListener::bind(path)?))
}

/// Logs every call that ends with a non-OK gRPC status: method, code and message. Requests are
/// never logged, so secrets in them never reach the log.
#[derive(Clone, Default)]
pub struct LogFailuresLayer;

impl<S> tower::Layer<S> for LogFailuresLayer {
    type Service = LogFailures<S>;
    fn layer(&self, inner: S) -> Self::Service {
        LogFailures { inner }
    }
}

#[derive(Clone)]
pub struct LogFailures<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for LogFailures<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().to_owned();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            // Unary errors are "trailers-only" responses: the status is in the headers.
            if let Some(status) = tonic::Status::from_header_map(response.headers())
                && status.code() != tonic::Code::Ok
            {
                tracing::warn!(method, code = ?status.code(), message = status.message(), "call failed");
            }
            Ok(response)
        })
    }
}
