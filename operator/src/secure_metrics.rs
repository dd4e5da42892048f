//! `/metrics` over HTTPS for callers Kubernetes lets in, as controller-runtime's secure metrics:
//! the bearer token is checked by a TokenReview, then a SubjectAccessReview asks whether its user
//! may `get` the non-resource URL `/metrics`. Answers are cached briefly so a scrape every few
//! seconds costs no API calls. The certificate is self-signed (renewed in time) unless
//! `--metrics-cert-dir` holds `tls.crt` and `tls.key`.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

/// How long a review's answer is reused.
const REVIEW_TTL: Duration = Duration::from_secs(60);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Reviews in flight at once, and verdicts remembered: callers with ever-new tokens cannot
/// crowd out the controllers' API requests nor grow the cache without bound.
const REVIEWS_IN_FLIGHT: usize = 2;
const VERDICTS_KEPT: usize = 1024;

/// A review's answer: allowed, or the status and message to refuse with.
type Verdict = Result<(), (StatusCode, String)>;

/// Who may read `/metrics`: TokenReview + SubjectAccessReview, cached by token hash.
#[derive(Clone)]
pub struct MetricsAuth {
    client: kube::Client,
    cache: Arc<Mutex<VerdictCache>>,
    reviews: Arc<tokio::sync::Semaphore>,
}

/// SHA-256 of a token → its verdict and when it was reached.
type VerdictCache = HashMap<[u8; 32], (Verdict, Instant)>;

impl MetricsAuth {
    pub fn new(client: kube::Client) -> Self {
        MetricsAuth { client, cache: Arc::default(), reviews: Arc::new(tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT)) }
    }

    async fn review(&self, token: &str) -> Verdict {
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &TokenReview {
                    spec: TokenReviewSpec { token: Some(token.to_owned()), ..Default::default() },
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("TokenReview failed: {e}")))?;
        let status = reviewed.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Err((StatusCode::UNAUTHORIZED, "Unauthorized: the token was not accepted".into()));
        };
        let name = user.username.clone().unwrap_or_default();
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let decided = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("SubjectAccessReview failed: {e}")))?;
        if decided.status.is_some_and(|s| s.allowed) {
            Ok(())
        } else {
            Err((StatusCode::FORBIDDEN, format!("Forbidden: {name} may not get /metrics")))
        }
    }

    /// Checks the request's bearer token (cached answers first).
    pub async fn check(&self, authorization: Option<&str>) -> Verdict {
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or((StatusCode::UNAUTHORIZED, "Unauthorized: no bearer token".to_owned()))?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some((answer, at)) = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key)
            && at.elapsed() < REVIEW_TTL
        {
            return answer.clone();
        }
        let answer = match self.reviews.acquire().await {
            Ok(_permit) => self.review(token).await,
            Err(_) => Err((StatusCode::SERVICE_UNAVAILABLE, "shutting down".to_owned())),
        };
        // Server errors are not cached: the next scrape asks again.
        if answer.as_ref().err().is_none_or(|(code, _)| *code != StatusCode::INTERNAL_SERVER_ERROR) {
            let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            cache.retain(|_, (_, at)| at.elapsed() < REVIEW_TTL);
            if cache.len() >= VERDICTS_KEPT {
                cache.clear();
            }
            cache.insert(key, (answer.clone(), Instant::now()));
        }
        answer
    }
}

/// The axum middleware.
pub async fn authorize(State(auth): State<MetricsAuth>, request: Request, next: Next) -> Response {
    let header = request.headers().get(axum::http::header::AUTHORIZATION).and_then(|h| h.to_str().ok());
    match auth.check(header).await {
        Ok(()) => next.run(request).await,
        Err((code, message)) => {
            tracing::debug!(%code, %message, "metrics request refused");
            (code, format!("{message}\n")).into_response()
        }
    }
}

/// Connections that finished their TLS handshake; handshakes run apart from the accept loop, so a
/// slow client cannot hold up the others.
pub struct TlsListener {
    accepted: mpsc::Receiver<(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
    _task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: tokio::net::TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (sender, accepted) = mpsc::channel(64);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let task = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(connection) => connection,
                    Err(e) => {
                        tracing::debug!(error = %e, "metrics accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "metrics TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { accepted, local, _task: task })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(connection) => connection,
            // The accept task never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
