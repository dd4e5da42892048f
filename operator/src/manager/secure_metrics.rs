//! `/metrics` over HTTPS for callers Kubernetes lets in, as controller-runtime's secure metrics:
//! the bearer token is checked by a TokenReview, then a SubjectAccessReview asks whether its user
//! may `get` the non-resource URL `/metrics`. Answers are cached briefly so a scrape every few
//! seconds costs no API calls. The certificate is self-signed (renewed in time) unless
//! `--metrics-cert-dir` holds `tls.crt` and `tls.key`.
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cluster_client::token_review::{AnswerCache, TokenRefused};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::mpsc;

/// How long a review's answer is reused.
const REVIEW_TTL: Duration = Duration::from_secs(60);
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
    verdicts: Arc<AnswerCache<Verdict>>,
}

impl MetricsAuth {
    pub fn new(client: kube::Client) -> Self {
        MetricsAuth { client, verdicts: Arc::new(AnswerCache::new(VERDICTS_KEPT, REVIEWS_IN_FLIGHT)) }
    }

    async fn review(&self, token: &str) -> Verdict {
        let user = match cluster_client::token_review::review(&self.client, token).await {
            Ok(user) => user,
            Err(TokenRefused::NotAuthenticated(_)) => {
                return Err((StatusCode::UNAUTHORIZED, "Unauthorized: the token was not accepted".into()));
            }
            Err(failed @ TokenRefused::ReviewFailed(_)) => {
                return Err((StatusCode::INTERNAL_SERVER_ERROR, failed.to_string()));
            }
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
        // Server errors are not kept: the next scrape asks again.
        let keep_for = |verdict: &Verdict| match verdict {
            Err((StatusCode::INTERNAL_SERVER_ERROR, _)) => None,
            _ => Some(REVIEW_TTL),
        };
        self.verdicts.answer(token, || self.review(token), keep_for).await
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

/// Connections that finished their TLS handshake (`server_tls::accept`), for axum.
pub struct TlsListener {
    accepted: mpsc::Receiver<server_tls::accept::TlsConnection>,
    local: std::net::SocketAddr,
}

impl TlsListener {
    pub fn new(listener: tokio::net::TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        Ok(TlsListener { accepted: server_tls::accept::accept(listener, config), local })
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
