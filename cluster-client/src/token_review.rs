//! Callers identified by their bearer token: a TokenReview asks the API server whose token it is,
//! and answers are kept briefly by the token's SHA-256 (never the token) so a caller that calls
//! often costs no API requests. The sidecar's gRPC guard and the manager's `/metrics` share this.
//! Upstream's sidecar reviews the token on every call. [differs: token-review-cache]
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use sha2::{Digest, Sha256};

/// Why a token did not name a user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefused {
    /// The API server's words on the token.
    #[error("{0}")]
    NotAuthenticated(String),
    /// The review itself failed: not the caller's fault, so not worth remembering.
    #[error("TokenReview failed: {0}")]
    ReviewFailed(String),
}

/// The user `token` belongs to, as the API server's TokenReview says.
pub async fn review(client: &kube::Client, token: &str) -> Result<UserInfo, TokenRefused> {
    let request =
        TokenReview { spec: TokenReviewSpec { token: Some(token.to_owned()), audiences: None }, ..Default::default() };
    let reviewed = kube::Api::<TokenReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &request)
        .await
        .map_err(|e| TokenRefused::ReviewFailed(e.to_string()))?;
    let status = reviewed.status.unwrap_or_default();
    match status.user {
        Some(user) if status.authenticated == Some(true) => Ok(user),
        _ => Err(TokenRefused::NotAuthenticated(
            status.error.filter(|e| !e.is_empty()).unwrap_or_else(|| "not authenticated".to_owned()),
        )),
    }
}

/// Answers about tokens, each kept for as long as its `keep_for` says, at most `limit` of them,
/// with at most `in_flight` answers being worked out at once: callers with ever-new tokens can
/// neither grow memory without bound nor crowd out the process's other API requests.
pub struct AnswerCache<V> {
    answers: Mutex<HashMap<[u8; 32], (V, Instant)>>,
    limit: usize,
    in_flight: tokio::sync::Semaphore,
}

impl<V: Clone> AnswerCache<V> {
    pub fn new(limit: usize, in_flight: usize) -> Self {
        AnswerCache { answers: Mutex::default(), limit, in_flight: tokio::sync::Semaphore::new(in_flight.max(1)) }
    }

    /// The answer for `token`: remembered, or from `ask`, then kept for `keep_for(answer)`
    /// (`None`: not kept, e.g. when the API server could not be asked).
    pub async fn answer<F, Fut>(&self, token: &str, ask: F, keep_for: impl Fn(&V) -> Option<Duration>) -> V
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(answer) = self.remembered(&key) {
            return answer;
        }
        // The semaphore is never closed, so acquiring only waits. A call that waited for a permit
        // looks again: another call with the same token may have been answered meanwhile.
        let _permit = self.in_flight.acquire().await.ok();
        if let Some(answer) = self.remembered(&key) {
            return answer;
        }
        let answer = ask().await;
        if let Some(ttl) = keep_for(&answer) {
            let mut answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if answers.len() >= self.limit {
                let now = Instant::now();
                answers.retain(|_, (_, expiry)| *expiry > now);
                if answers.len() >= self.limit {
                    answers.clear();
                }
            }
            // A TTL too large to count is not one to keep.
            if let Some(expiry) = Instant::now().checked_add(ttl) {
                answers.insert(key, (answer.clone(), expiry));
            }
        }
        answer
    }

    fn remembered(&self, key: &[u8; 32]) -> Option<V> {
        let answers = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        answers.get(key).filter(|(_, expiry)| *expiry > Instant::now()).map(|(answer, _)| answer.clone())
    }

    /// How many answers are kept.
    pub fn len(&self) -> usize {
        self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const MINUTE: Option<Duration> = Some(Duration::from_secs(60));

    #[tokio::test]
    async fn an_answer_is_asked_once_and_then_remembered() {
        let cache = AnswerCache::<u32>::new(8, 2);
        let asked = AtomicUsize::new(0);
        for _ in 0..3 {
            let answer =
                cache.answer("token-a", || async { asked.fetch_add(1, Ordering::SeqCst) as u32 + 7 }, |_| MINUTE).await;
            assert_eq!(answer, 7);
        }
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        // Another token is another question.
        assert_eq!(cache.answer("token-b", || async { 9 }, |_| MINUTE).await, 9);
        assert_eq!(cache.len(), 2);
    }

    #[tokio::test]
    async fn answers_not_to_be_kept_are_asked_again() {
        let cache = AnswerCache::<Result<u32, String>>::new(8, 2);
        let asked = AtomicUsize::new(0);
        for _ in 0..2 {
            let answer = cache
                .answer(
                    "t",
                    || async {
                        asked.fetch_add(1, Ordering::SeqCst);
                        Err("API server unreachable".to_owned())
                    },
                    |answer| answer.as_ref().ok().and(MINUTE),
                )
                .await;
            assert!(answer.is_err());
        }
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        assert!(cache.is_empty());
    }

    #[tokio::test]
    async fn expired_answers_are_asked_again() {
        let cache = AnswerCache::<u32>::new(8, 1);
        assert_eq!(cache.answer("t", || async { 1 }, |_| Some(Duration::ZERO)).await, 1);
        assert_eq!(cache.answer("t", || async { 2 }, |_| MINUTE).await, 2);
        assert_eq!(cache.answer("t", || async { 3 }, |_| MINUTE).await, 2);
    }

    #[tokio::test]
    async fn the_cache_never_holds_more_than_its_limit() {
        let cache = AnswerCache::<usize>::new(4, 1);
        for i in 0..10 {
            let token = format!("token-{i}");
            assert_eq!(cache.answer(&token, || async move { i }, |_| MINUTE).await, i);
            assert!(cache.len() <= 4, "{} answers after {} tokens", cache.len(), i + 1);
        }
    }
}
