//! Where volumes are attached, from a watch of VolumeAttachments that keeps only that: for each
//! live, attached VolumeAttachment of a PV, its name, PV and node (about a hundred bytes). Jobs
//! read it instead of listing every VolumeAttachment in the cluster on each pass (a request, and a
//! list held whole in memory, per job); upstream reads the same from a full informer cache.
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{Future, StreamExt};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::compact::Attachment;
use crate::core::Core;

/// How long a job pass waits for the first full list before it is retried.
#[cfg(not(test))]
const SYNC_WAIT: Duration = Duration::from_secs(10);
#[cfg(test)]
const SYNC_WAIT: Duration = Duration::from_millis(20);

/// The controller name the cache is known by in readiness.
pub const CACHE_NAME: &str = "volumeattachments";

/// A VolumeAttachment that counts: live, attached, of a PV.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Attached {
    pv: String,
    node: String,
}

/// Where a volume is attached is not known yet: the VolumeAttachment cache has no full list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the VolumeAttachment cache has not synced yet")]
pub struct NotSynced;

/// PV → node, kept by `follow`.
pub struct Attachments {
    /// VolumeAttachment name → what it attaches.
    by_name: RwLock<HashMap<String, Attached>>,
    synced: watch::Sender<bool>,
}

impl Default for Attachments {
    fn default() -> Self {
        Attachments { by_name: RwLock::new(HashMap::new()), synced: watch::Sender::new(false) }
    }
}

/// What `attachment` attaches, if it counts.
fn attached(attachment: &Attachment) -> Option<Attached> {
    if attachment.metadata.deletion_timestamp.is_some() || !attachment.status.as_ref().is_some_and(|s| s.attached) {
        return None;
    }
    // Inline volumes name no PV and are skipped (upstream's manager crashes on one).
    // [differs: inline-volumes]
    let pv = attachment.spec.source.persistent_volume_name.clone()?;
    Some(Attached { pv, node: attachment.spec.node_name.clone() })
}

impl Attachments {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Attached>> {
        self.by_name.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `attachment` as it is now.
    fn apply(&self, attachment: &Attachment) {
        let name = attachment.metadata.name.clone().unwrap_or_default();
        match attached(attachment) {
            Some(what) => self.write().insert(name, what),
            None => self.write().remove(&name),
        };
    }

    /// The node `pv` is attached to (of several attachments, the first by name, as a list
    /// returns them), once the first full list is in.
    pub async fn node_of(&self, pv: &str) -> Result<Option<String>, NotSynced> {
        let mut synced = self.synced.subscribe();
        match tokio::time::timeout(SYNC_WAIT, synced.wait_for(|s| *s)).await {
            Ok(Ok(_)) => {}
            _ => return Err(NotSynced),
        }
        let by_name = self.by_name.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(by_name.iter().filter(|(_, a)| a.pv == pv).min_by_key(|(name, _)| *name).map(|(_, a)| a.node.clone()))
    }

    /// Keeps `this` index until `stop`, marking it synced in readiness after each full list.
    pub async fn follow(core: Arc<Core>, this: Arc<Attachments>, stop: impl Future<Output = ()>) {
        let caches = &core.caches;
        caches.set(CACHE_NAME, false);
        this.synced.send_replace(false);
        let api = Api::<Attachment>::all(core.client.clone());
        let mut events = std::pin::pin!(crate::core::watch::list_and_watch(api).default_backoff());
        let mut stop = std::pin::pin!(stop);
        let mut listing: Option<HashMap<String, Attached>> = None;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = &mut stop => break,
            };
            match event {
                None => break,
                Some(Ok(watcher::Event::Init)) => listing = Some(HashMap::new()),
                Some(Ok(watcher::Event::InitApply(attachment))) => {
                    if let (Some(listing), Some(what)) = (listing.as_mut(), attached(&attachment)) {
                        listing.insert(attachment.metadata.name.clone().unwrap_or_default(), what);
                    }
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    *this.write() = listing.take().unwrap_or_default();
                    this.synced.send_replace(true);
                    caches.set(CACHE_NAME, true);
                }
                Some(Ok(watcher::Event::Apply(attachment))) => this.apply(&attachment),
                Some(Ok(watcher::Event::Delete(attachment))) => {
                    this.write().remove(attachment.metadata.name.as_deref().unwrap_or_default());
                }
                Some(Err(e)) => tracing::debug!(error = %e, "watching VolumeAttachments; retrying"),
            }
        }
        this.synced.send_replace(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::{AttachmentSource, AttachmentSpec, AttachmentStatus};

    fn attachment(name: &str, pv: Option<&str>, node: &str, attached: bool) -> Attachment {
        Attachment {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: AttachmentSpec {
                node_name: node.into(),
                source: AttachmentSource { persistent_volume_name: pv.map(Into::into) },
            },
            status: Some(AttachmentStatus { attached }),
        }
    }

    #[tokio::test]
    async fn only_live_attachments_of_the_pv_count_and_inline_ones_are_skipped() {
        let index = Attachments::default();
        assert!(index.node_of("pv-1").await.is_err(), "not synced yet");
        index.synced.send_replace(true);
        index.apply(&attachment("inline", None, "n9", true));
        index.apply(&attachment("b", Some("pv-1"), "n1", true));
        index.apply(&attachment("a", Some("pv-1"), "n0", false));
        assert_eq!(index.node_of("pv-1").await, Ok(Some("n1".into())));
        index.apply(&attachment("a", Some("pv-1"), "n0", true));
        assert_eq!(index.node_of("pv-1").await, Ok(Some("n0".into())), "the first by name");
        let mut going = attachment("a", Some("pv-1"), "n0", true);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        index.apply(&going);
        assert_eq!(index.node_of("pv-1").await, Ok(Some("n1".into())));
        assert_eq!(index.node_of("pv-2").await, Ok(None));
        assert_eq!(index.write().len(), 1, "only what counts is kept");
    }
}
