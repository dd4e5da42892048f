//! A sidecar connection that closes while unused, and dials again at the next call. An open
//! HTTP/2 connection holds about 40 KiB in the manager (its read and write buffers, header tables,
//! the channel's task) and as much in the sidecar, while most sidecars of a large cluster are
//! called rarely (a job now and then). Upstream's v0.14.0 closes one after 5 minutes unused, its
//! main branch leaves it to gRPC's 30-minute idle default. [differs: idle-timeout]
//! A call in flight holds its own handle, so closing never cuts one short. How long a connection
//! may sit unused is `--sidecar-idle-timeout`.
//! It counts the calls that ended UNAVAILABLE, which is how a sidecar that no longer holds its
//! driver's Lease answers, and what a sidecar that is gone gives: the leader lookup reads the Lease
//! again after one.
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::body::Body;
use tonic::codegen::http;

use crate::sidecars::client::{ClientError, SidecarChannel};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Response = <SidecarChannel as tower::Service<http::Request<Body>>>::Response;
/// Makes a channel that connects at its first call (`Security::connect_lazy`).
type Redial = Box<dyn Fn() -> Result<SidecarChannel, ClientError> + Send + Sync>;

struct Open {
    channel: Option<SidecarChannel>,
    last_used: Instant,
}

struct Shared {
    open: Mutex<Open>,
    redial: Redial,
    unavailable_answers: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The open channel, or a new one that connects when called.
    fn channel(&self) -> Result<SidecarChannel, ClientError> {
        let mut open = self.lock();
        open.last_used = Instant::now();
        if let Some(channel) = &open.channel {
            return Ok(channel.clone());
        }
        let channel = (self.redial)()?;
        open.channel = Some(channel.clone());
        Ok(channel)
    }
}

/// A connection to one sidecar, as the pool keeps it: a tonic service like the channel it wraps.
pub struct IdleChannel {
    shared: Arc<Shared>,
    /// The channel a `poll_ready` made ready, for the `call` that follows.
    ready: Option<SidecarChannel>,
}

impl Clone for IdleChannel {
    fn clone(&self) -> Self {
        IdleChannel { shared: self.shared.clone(), ready: None }
    }
}

impl IdleChannel {
    /// `connected`, open now; once closed for idleness, `redial` makes the next one.
    pub fn new(
        connected: SidecarChannel,
        redial: impl Fn() -> Result<SidecarChannel, ClientError> + Send + Sync + 'static,
    ) -> Self {
        let open = Open { channel: Some(connected), last_used: Instant::now() };
        let shared =
            Shared { open: Mutex::new(open), redial: Box::new(redial), unavailable_answers: AtomicU64::new(0) };
        IdleChannel { shared: Arc::new(shared), ready: None }
    }

    /// How many calls have ended UNAVAILABLE: no connection, or the sidecar's own answer.
    pub fn unavailable_answers(&self) -> u64 {
        self.shared.unavailable_answers.load(Ordering::Relaxed)
    }

    /// Lets the connection go now: once the calls in flight are done, it closes.
    pub fn close(&self) {
        self.shared.lock().channel = None;
    }

    /// Lets the connection go when nothing has asked for it for `idle`, as [`IdleChannel::close`].
    pub fn close_if_idle(&self, idle: Duration) {
        let mut open = self.shared.lock();
        if open.channel.is_some() && open.last_used.elapsed() >= idle {
            open.channel = None;
        }
    }

    /// Whether the connection is kept open (a node's check leaves one that calls opened as it is).
    pub fn is_open(&self) -> bool {
        self.shared.lock().channel.is_some()
    }
}

impl tower::Service<http::Request<Body>> for IdleChannel {
    type Response = Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.ready.is_none() {
            match self.shared.channel() {
                Ok(channel) => self.ready = Some(channel),
                // A status, so the caller's error says why no call was made.
                Err(e) => {
                    self.shared.unavailable_answers.fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(Err(Box::new(tonic::Status::unavailable(e.to_string()))));
                }
            }
        }
        match self.ready.as_mut() {
            Some(channel) => tower::Service::poll_ready(channel, cx).map_err(|e| {
                self.shared.unavailable_answers.fetch_add(1, Ordering::Relaxed);
                e.into()
            }),
            None => Poll::Ready(Err("no channel to call".into())),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match self.ready.take() {
            Some(mut channel) => {
                let call = tower::Service::call(&mut channel, request);
                let shared = self.shared.clone();
                Box::pin(async move {
                    let answer = call.await;
                    // tonic makes a transport error UNAVAILABLE; tonic and grpc-go servers send the
                    // error of a unary call in its headers (a trailers-only answer).
                    let unavailable = match &answer {
                        Err(_) => true,
                        Ok(response) => response.headers().get("grpc-status").is_some_and(|code| code == "14"),
                    };
                    if unavailable {
                        shared.unavailable_answers.fetch_add(1, Ordering::Relaxed);
                    }
                    answer.map_err(Into::into)
                })
            }
            None => Box::pin(async { Err("called before it was ready".into()) }),
        }
    }
}
