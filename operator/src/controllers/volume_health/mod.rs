//! Removes stale volume-health annotations from PVCs when the manager starts leading and then
//! every `volume-health-cleanup-interval` (leader only, as upstream); which keys are stale is
//! decided by `decide`. With `--watch-namespace`, only that namespace's PVCs.
pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use self::decide::stale_keys;
use crate::core::Core;
use crate::core::clock::now_seconds;

/// Metadata pages of this many PVCs keep the pass's memory flat at any scale.
const PAGE: u32 = 500;

pub async fn run(ctx: Arc<Core>, enabled: bool, mut stop: watch::Receiver<bool>) {
    if !enabled {
        return;
    }
    loop {
        // The first pass at once, as upstream's worker does.
        match clean(&ctx).await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(removed, "stale volume-health annotations removed"),
            Err(e) => tracing::warn!(error = %e, "volume-health cleanup failed; trying again next interval"),
        }
        let interval = ctx.settings().volume_health_cleanup_interval.max(Duration::from_secs(1));
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One pass over every PVC; returns how many annotations were removed.
pub async fn clean(ctx: &Core) -> Result<usize, kube::Error> {
    let api = ctx.watched::<PersistentVolumeClaim>();
    let threshold = i64::try_from(ctx.settings().volume_health_stale_threshold.as_secs()).unwrap_or(i64::MAX);
    let mut params = ListParams::default().limit(PAGE);
    let mut removed = 0;
    loop {
        let page = api.list_metadata(&params).await?;
        let now = now_seconds();
        for pvc in &page.items {
            let stale = stale_keys(pvc.annotations(), now, threshold);
            if stale.is_empty() {
                continue;
            }
            let nulls: serde_json::Map<String, serde_json::Value> =
                stale.iter().map(|k| (k.clone(), serde_json::Value::Null)).collect();
            let patch = serde_json::json!({"metadata": {"annotations": nulls}});
            let namespaced =
                Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &pvc.namespace().unwrap_or_default());
            match namespaced.patch(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => removed += stale.len(),
                Err(e) => tracing::warn!(pvc = %pvc.name_any(), error = %e, "removing stale volume-health annotations"),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(removed),
        }
    }
}
