//! Removes stale volume-health annotations from PVCs when the manager starts leading and then
//! every `volume-health-cleanup-interval` (leader only, as upstream); which keys are stale is
//! decided by `decide`. The PVCs are read from the annotation controller's PVC cache, which keeps
//! each volume-health annotation's `lastChecked` for this (`decide::keep_checked`): no list of
//! every PVC per pass, whose decoded pages (managedFields and all) were most of the manager's
//! peak memory at start. With `--watch-namespace`, only that namespace's PVCs, as the cache.
pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;

use self::decide::stale_keys;
use crate::cache_ready::Ready;
use crate::claim::Claim;
use crate::core::Core;
use crate::core::clock::now_seconds;
use crate::core::slim::SlimStore;

/// Runs the cleanup on `claims` (the PVC cache, once it has its first full list) until `stop`.
pub async fn run(ctx: Arc<Core>, claims: SlimStore<Claim>, ready: Ready, mut stop: watch::Receiver<bool>) {
    tokio::select! {
        listed = ready.wait() => if listed.is_err() { return },
        _ = stop.wait_for(|s| *s) => return,
    }
    loop {
        // The first pass at once, as upstream's worker does.
        match clean(&ctx, &claims).await {
            0 => {}
            removed => tracing::info!(removed, "stale volume-health annotations removed"),
        }
        let interval = ctx.settings().volume_health_cleanup_interval.max(Duration::from_secs(1));
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One pass over every cached PVC; returns how many annotations were removed. A PVC whose patch
/// fails is logged and tried again next interval.
pub async fn clean(ctx: &Core, claims: &SlimStore<Claim>) -> usize {
    let threshold = i64::try_from(ctx.settings().volume_health_stale_threshold.as_secs()).unwrap_or(i64::MAX);
    let now = now_seconds();
    let mut removed = 0;
    for pvc in claims.state() {
        let annotations = pvc.meta.annotations.iter().map(|(key, value)| (&**key, &**value));
        let stale = stale_keys(annotations, now, threshold);
        if stale.is_empty() {
            continue;
        }
        let nulls: serde_json::Map<String, serde_json::Value> =
            stale.iter().map(|k| (k.clone(), serde_json::Value::Null)).collect();
        let patch = serde_json::json!({"metadata": {"annotations": nulls}});
        let namespaced =
            Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), pvc.meta.namespace().unwrap_or_default());
        match namespaced.patch_metadata(pvc.meta.name(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => removed += stale.len(),
            Err(e) => tracing::warn!(pvc = %pvc.meta.name(), error = %e, "removing stale volume-health annotations"),
        }
    }
    removed
}
