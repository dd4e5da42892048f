//! The sidecar's connection to its driver's CSI-Addons socket: probed until ready, its identity
//! and capabilities read, then watched. When the driver goes away the state says so and probing
//! continues with backoff, so a driver restart is picked up without restarting the sidecar
//! (upstream exits instead; `--exit-on-driver-loss` keeps that behaviour for those who want it).
//! [differs: sidecar-keeps-running]
use std::time::Duration;

use api::proto::identity;
use tokio::sync::watch;
use tonic::transport::Channel;

/// What the driver told us about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    pub name: String,
    pub vendor_version: String,
    /// `<field>.<VALUE>` strings (see [`api::capabilities`]).
    pub capabilities: Vec<String>,
}

/// Why the driver cannot be used now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("{call}: {message}")]
    Call { call: &'static str, message: String },
    #[error("the driver says it is not ready")]
    NotReady,
    #[error("the driver returned an empty name")]
    EmptyName,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The driver as the sidecar currently sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverState {
    /// Not reached yet.
    Connecting,
    Ready(DriverInfo),
    /// Was ready, now unreachable or not ready; `reason` says why.
    Lost {
        reason: Unusable,
    },
}

impl DriverState {
    pub fn is_ready(&self) -> bool {
        matches!(self, DriverState::Ready(_))
    }
}

/// How the connection is watched.
#[derive(Debug, Clone, Copy)]
pub struct Probing {
    /// Between probes while the driver is ready.
    pub interval: Duration,
    /// Timeout of each call to the driver.
    pub timeout: Duration,
    /// First and largest wait between attempts while it is not.
    pub backoff: (Duration, Duration),
}

impl Default for Probing {
    fn default() -> Self {
        Probing {
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            backoff: (Duration::from_millis(500), Duration::from_secs(30)),
        }
    }
}

/// A watched connection; dropping it stops the watching.
pub struct DriverConnection {
    channel: Channel,
    state: watch::Receiver<DriverState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DriverConnection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DriverConnection {
    /// Starts watching the driver at `endpoint` (`unix:///path`, `/path` or `host:port`).
    pub fn start(endpoint: &str, probing: Probing) -> Result<Self, tonic::transport::Error> {
        let channel = crate::connect::lazy(endpoint)?;
        let (tx, state) = watch::channel(DriverState::Connecting);
        let task = tokio::spawn(watch_driver(channel.clone(), probing, tx));
        Ok(DriverConnection { channel, state, task })
    }

    /// The channel calls to the driver go through (it reconnects by itself).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The current state, and changes to it.
    pub fn state(&self) -> watch::Receiver<DriverState> {
        self.state.clone()
    }

    /// Waits until the driver is ready, up to `timeout`.
    pub async fn ready(&self, timeout: Duration) -> Option<DriverInfo> {
        let mut state = self.state.clone();
        let ready = tokio::time::timeout(timeout, state.wait_for(DriverState::is_ready)).await.ok()?.ok()?;
        match &*ready {
            DriverState::Ready(info) => Some(info.clone()),
            _ => None,
        }
    }
}

/// Probe → identity → capabilities.
async fn query(channel: &Channel, timeout: Duration) -> Result<DriverInfo, Unusable> {
    let mut client = identity::identity_client::IdentityClient::new(channel.clone());
    let failed = |call: &'static str| move |s: tonic::Status| Unusable::Call { call, message: with_causes(&s) };
    let call = async {
        let probe = client.probe(identity::ProbeRequest {}).await.map_err(failed("Probe"))?.into_inner();
        if probe.ready == Some(false) {
            return Err(Unusable::NotReady);
        }
        let id =
            client.get_identity(identity::GetIdentityRequest {}).await.map_err(failed("GetIdentity"))?.into_inner();
        if id.name.is_empty() {
            return Err(Unusable::EmptyName);
        }
        let caps =
            client.get_capabilities(identity::GetCapabilitiesRequest {}).await.map_err(failed("GetCapabilities"))?;
        Ok(DriverInfo {
            name: id.name,
            vendor_version: id.vendor_version,
            capabilities: api::capabilities::to_strings(&caps.into_inner().capabilities),
        })
    };
    tokio::time::timeout(timeout, call).await.map_err(|_| Unusable::Timeout(timeout))?
}

/// A status's message with the errors under it: a connection refused for want of permission on
/// the socket says so, where the message alone says "transport error".
fn with_causes(status: &tonic::Status) -> String {
    let mut message = status.message().to_owned();
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        let text = error.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        cause = error.source();
    }
    message
}

async fn watch_driver(channel: Channel, probing: Probing, state: watch::Sender<DriverState>) {
    let mut backoff = probing.backoff.0;
    // While the driver was never reached, each new reason is logged once.
    let mut told: Option<Unusable> = None;
    loop {
        let ready_now = state.borrow().is_ready();
        let next = match query(&channel, probing.timeout).await {
            Ok(info) => {
                backoff = probing.backoff.0;
                DriverState::Ready(info)
            }
            Err(reason) if ready_now || matches!(*state.borrow(), DriverState::Lost { .. }) => {
                DriverState::Lost { reason }
            }
            Err(reason) => {
                if told.as_ref() != Some(&reason) {
                    tracing::warn!(%reason, "the driver cannot be used yet");
                    told = Some(reason);
                }
                DriverState::Connecting
            }
        };
        let wait = if next.is_ready() { probing.interval } else { backoff };
        if !next.is_ready() {
            backoff = (backoff * 2).min(probing.backoff.1);
        }
        state.send_if_modified(|current| {
            let changed = *current != next;
            *current = next;
            changed
        });
        tokio::time::sleep(wait).await;
    }
}
