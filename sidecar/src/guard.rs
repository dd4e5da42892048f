//! In front of every RPC: authentication (the bearer token, checked with TokenReview and cached
//! briefly by `cluster_client::token_review`), authorization (the caller must be one of
//! `--allowed-identities`), and metrics. Upstream accepts any valid token in the cluster
//! [differs: allowed-identities] and does a TokenReview on every call.
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use cluster_client::token_review::{AnswerCache, TokenRefused};
use tonic::Status;
use tonic::codegen::http;

use crate::metrics::Metrics;

/// How long a TokenReview answer is reused.
const ACCEPTED_TTL: Duration = Duration::from_secs(60);
const REJECTED_TTL: Duration = Duration::from_secs(10);
/// Bound on cached answers (one per distinct token).
const CACHE_LIMIT: usize = 1024;
/// TokenReviews in flight at once: callers with ever-new tokens cannot flood the API server.
const REVIEWS_IN_FLIGHT: usize = 4;

/// The prefix of a ServiceAccount's TokenReview username.
const SERVICE_ACCOUNT: &str = "system:serviceaccount:";

/// An `--allowed-identities` entry with `*` elsewhere than a ServiceAccount's namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?}: '*' may only stand for the namespace of a ServiceAccount, as in \
     system:serviceaccount:*:csi-addons-controller-manager"
)]
pub struct MisplacedWildcard(String);

/// Checks one `--allowed-identities` entry: a username, or a ServiceAccount in any namespace
/// (`system:serviceaccount:*:<name>`). `*` stands for a whole namespace and nothing else.
pub fn identity_entry(text: &str) -> Result<String, MisplacedWildcard> {
    let entry = text.trim();
    if !entry.contains('*') {
        return Ok(entry.to_owned());
    }
    let valid = entry
        .strip_prefix(SERVICE_ACCOUNT)
        .and_then(|rest| rest.strip_prefix("*:"))
        .is_some_and(|name| !name.is_empty() && !name.contains(['*', ':']));
    if valid { Ok(entry.to_owned()) } else { Err(MisplacedWildcard(entry.to_owned())) }
}

/// Whether `user` (a TokenReview username) is one of `allowed`.
pub fn allows(allowed: &HashSet<String>, user: &str) -> bool {
    if allowed.contains(user) {
        return true;
    }
    // A ServiceAccount of any namespace: `system:serviceaccount:<namespace>:<name>`.
    let Some((namespace, name)) = user.strip_prefix(SERVICE_ACCOUNT).and_then(|rest| rest.split_once(':')) else {
        return false;
    };
    !namespace.is_empty() && !name.contains(':') && allowed.contains(&format!("{SERVICE_ACCOUNT}*:{name}"))
}

/// Who may call.
pub struct Authenticator {
    client: kube::Client,
    allowed: HashSet<String>,
    /// Username, or why the token was refused, by token hash.
    reviews: AnswerCache<Result<String, TokenRefused>>,
    /// Refusals already logged, so a misconfigured caller does not flood the log.
    logged: Mutex<HashSet<String>>,
}

impl Authenticator {
    pub fn new(client: kube::Client, allowed: &[String]) -> Self {
        Authenticator {
            client,
            allowed: allowed.iter().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect(),
            reviews: AnswerCache::new(CACHE_LIMIT, REVIEWS_IN_FLIGHT),
            logged: Mutex::default(),
        }
    }

    /// The caller's identity if it may call, else UNAUTHENTICATED or PERMISSION_DENIED.
    pub async fn check(&self, headers: &http::HeaderMap) -> Result<String, Status> {
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim())
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            self.log_once("no-token", "refused a call without a bearer token");
            return Err(Status::unauthenticated("missing authorization: a bearer token is required"));
        };
        let user = self.review(token).await.map_err(|reason| {
            self.log_once(&format!("invalid:{reason}"), &format!("refused a call with an invalid token: {reason}"));
            Status::unauthenticated(format!("the bearer token was not accepted: {reason}"))
        })?;
        if allows(&self.allowed, &user) {
            return Ok(user);
        }
        self.log_once(&format!("denied:{user}"), &format!("refused a call from {user}: not in --allowed-identities"));
        Err(Status::permission_denied(format!("{user} is not allowed to call this sidecar (see --allowed-identities)")))
    }

    async fn review(&self, token: &str) -> Result<String, TokenRefused> {
        let ask = || async {
            cluster_client::token_review::review(&self.client, token)
                .await
                .map(|user| user.username.unwrap_or_default())
        };
        // An API failure is not the caller's fault: not kept, so the next call asks again.
        let keep_for = |answer: &Result<String, TokenRefused>| match answer {
            Ok(_) => Some(ACCEPTED_TTL),
            Err(TokenRefused::NotAuthenticated(_)) => Some(REJECTED_TTL),
            Err(TokenRefused::ReviewFailed(_)) => None,
        };
        self.reviews.answer(token, ask, keep_for).await
    }

    fn log_once(&self, key: &str, message: &str) {
        let mut logged = self.logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.len() < CACHE_LIMIT && logged.insert(key.to_owned()) {
            tracing::warn!("{message}");
        }
    }
}

/// The tower layer: authentication when an [`Authenticator`] is given, metrics always.
#[derive(Clone)]
pub struct GuardLayer {
    auth: Option<Arc<Authenticator>>,
    metrics: Metrics,
}

impl GuardLayer {
    pub fn new(auth: Option<Arc<Authenticator>>, metrics: Metrics) -> Self {
        GuardLayer { auth, metrics }
    }
}

impl<S> tower::Layer<S> for GuardLayer {
    type Service = Guarded<S>;
    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded { inner, auth: self.auth.clone(), metrics: self.metrics.clone() }
    }
}

#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    auth: Option<Arc<Authenticator>>,
    metrics: Metrics,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Guarded<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The clone is the one polled ready; the original stays for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (auth, metrics) = (self.auth.clone(), self.metrics.clone());
        Box::pin(async move {
            let started = Instant::now();
            // Unknown paths share one label, so callers cannot grow the metric without bound.
            let path = request.uri().path();
            let method =
                if path.starts_with("/identity.Identity/") || path.starts_with("/proto.") { path } else { "other" }
                    .to_owned();
            let response = match &auth {
                Some(auth) => match auth.check(request.headers()).await {
                    Ok(_) => inner.call(request).await?,
                    Err(status) => status.into_http(),
                },
                None => inner.call(request).await?,
            };
            // Unary errors are "trailers-only": the code is in the headers; no code there means OK.
            let code = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map_or(tonic::Code::Ok, tonic::Code::from_i32);
            metrics.rpcs.with_label_values(&[method.as_str(), &format!("{code:?}")]).inc();
            metrics.rpc_seconds.with_label_values(&[method.as_str()]).observe(started.elapsed().as_secs_f64());
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(entries: &[&str]) -> HashSet<String> {
        entries.iter().map(|e| identity_entry(e).unwrap()).collect()
    }

    #[test]
    fn a_namespace_wildcard_admits_that_service_account_anywhere_and_nothing_else() {
        let any = allowed(&["system:serviceaccount:*:csi-addons-controller-manager"]);
        for user in [
            "system:serviceaccount:csi-addons-system:csi-addons-controller-manager",
            "system:serviceaccount:openshift-storage:csi-addons-controller-manager",
        ] {
            assert!(allows(&any, user), "{user}");
        }
        for user in [
            "system:serviceaccount:openshift-storage:default",
            "system:serviceaccount::csi-addons-controller-manager",
            "system:serviceaccount:a:b:csi-addons-controller-manager",
            "csi-addons-controller-manager",
            "system:admin",
        ] {
            assert!(!allows(&any, user), "{user}");
        }
        let exact = allowed(&["system:serviceaccount:openshift-storage:csi-addons-controller-manager"]);
        assert!(allows(&exact, "system:serviceaccount:openshift-storage:csi-addons-controller-manager"));
        assert!(!allows(&exact, "system:serviceaccount:csi-addons-system:csi-addons-controller-manager"));
    }

    #[test]
    fn a_wildcard_anywhere_else_is_refused() {
        for bad in
            ["*", "system:serviceaccount:ns:*", "system:*:x", "system:serviceaccount:*:", "system:serviceaccount:*:a:b"]
        {
            assert!(identity_entry(bad).is_err(), "{bad}");
        }
        assert_eq!(identity_entry(" system:admin ").unwrap(), "system:admin");
    }
}
