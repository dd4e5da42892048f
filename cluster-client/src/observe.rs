//! Each attempt of each API request, told to an observer as it ends: its method, the API server it
//! went to, its path and its status code (none when no answer came). The manager counts them as
//! client-go does in `rest_client_requests_total`, and takes a served CSI-Addons request as a sign
//! of readiness. The layer sits below the retries, so a request answered
//! 429 and then 200 is two attempts, as in client-go's counter.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode};
use tower::{Layer, Service};

/// One attempt of one request, as it ended.
#[derive(Debug)]
pub struct Attempt<'a> {
    pub method: &'a Method,
    /// The API server's `host:port`.
    pub host: &'a str,
    pub path: &'a str,
    /// None when no answer came.
    pub status: Option<StatusCode>,
}

/// Told of every attempt.
pub type Observer = Arc<dyn Fn(&Attempt<'_>) + Send + Sync>;

#[derive(Clone)]
pub struct ObserveLayer(pub Observer);

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observe { inner, observer: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    observer: Observer,
}

impl<S, B, R> Service<Request<B>> for Observe<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = request.method().clone();
        let host = request.uri().authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
        let path = request.uri().path().to_owned();
        let observer = self.observer.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let result = answer.await;
            let status = result.as_ref().ok().map(Response::status);
            observer(&Attempt { method: &method, host: &host, path: &path, status });
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn every_attempt_is_told_with_its_method_host_path_and_status_or_none() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let observer: Observer = Arc::new(move |a| {
            let status = a.status.map(|s| s.as_u16());
            record.lock().unwrap().push((a.method.to_string(), a.host.to_owned(), a.path.to_owned(), status));
        });
        let answering = tower::service_fn(|request: Request<()>| async move {
            match request.uri().path() {
                "/busy" => Ok(Response::builder().status(429).body(()).unwrap()),
                "/gone" => Err("connection reset"),
                _ => Ok(Response::new(())),
            }
        });
        let mut service = ObserveLayer(observer).layer(answering);
        for (method, path) in [(Method::GET, "/ok"), (Method::PATCH, "/busy"), (Method::POST, "/gone")] {
            let request = Request::builder().method(method).uri(format!("https://10.96.0.1:443{path}")).body(());
            let _ = service.ready().await.unwrap().call(request.unwrap()).await;
        }
        let seen = seen.lock().unwrap().clone();
        let host = "10.96.0.1:443".to_owned();
        assert_eq!(
            seen,
            [
                ("GET".to_owned(), host.clone(), "/ok".to_owned(), Some(200)),
                ("PATCH".to_owned(), host.clone(), "/busy".to_owned(), Some(429)),
                ("POST".to_owned(), host, "/gone".to_owned(), None)
            ]
        );
    }
}
