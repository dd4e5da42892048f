//! Starts every controller, and stops them together: what runs while this manager leads.
use std::sync::Arc;

use api::csiaddons::{EncryptionKeyRotationCronJob, EncryptionKeyRotationJob, ReclaimSpaceCronJob, ReclaimSpaceJob};
use tokio::sync::watch;

use crate::controllers::cron_jobs::{self, ManagedCrons};
use crate::controllers::jobs::{self, VolumeCaches, attachments::Attachments};
use crate::controllers::{
    network_fence, network_fence_class, node, pvc, volume_group_replication, volume_group_replication_content,
    volume_health, volume_replication,
};
use crate::core::Core;
use crate::core::wakeups::Wakeups;
use crate::pv_drivers::PvDrivers;

/// Runs every controller until `stop`.
pub async fn run_all(core: Arc<Core>, volume_health_cleanup: bool, stop: watch::Receiver<bool>) {
    let stopped = |mut stop: watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let mut tasks = tokio::task::JoinSet::new();
    let attachments = Arc::new(Attachments::default());
    tasks.spawn(Attachments::follow(core.clone(), attachments.clone(), stopped(stop.clone())));
    let (roster, node_changes, node_copies, connected) = node::watch(&core);
    let (store, ready) = roster.cache();
    tasks.spawn(node::run(core.clone(), roster.clone(), node_changes, stopped(stop.clone())));
    tasks.spawn(network_fence::run(core.clone(), stopped(stop.clone())));
    let nodes = network_fence_class::Nodes { store, ready };
    tasks.spawn(network_fence_class::run(core.clone(), nodes, node_copies, stopped(stop.clone())));
    tasks.spawn(volume_replication::run(core.clone(), stopped(stop.clone())));
    tasks.spawn(volume_group_replication::run(core.clone(), stopped(stop.clone())));
    tasks.spawn(volume_group_replication_content::run(core.clone(), stopped(stop.clone())));
    // The PVC controller's caches, which the job controllers read too.
    let (claims, drivers) = (pvc::watch_claims(&core, volume_health_cleanup), PvDrivers::default());
    let classes = pvc::watch_classes(&core);
    let (claims_store, claims_ready) = (claims.store.clone(), claims.ready.clone());
    let volumes = VolumeCaches {
        attachments,
        claims: claims.store.clone(),
        drivers: drivers.clone(),
        classes: (classes.store.clone(), classes.ready.clone()),
        roster: roster.clone(),
    };
    tasks.spawn(jobs::run::<ReclaimSpaceJob>(core.clone(), volumes.clone(), stopped(stop.clone())));
    tasks.spawn(jobs::run::<EncryptionKeyRotationJob>(core.clone(), volumes, stopped(stop.clone())));
    let (owners, owner_events) = tokio::sync::mpsc::unbounded_channel();
    let managed = ManagedCrons::default();
    let (reclaim_wakeups, rotation_wakeups) = (Wakeups::default(), Wakeups::default());
    let (reclaim, reclaim_ready, reclaim_changes) =
        cron_jobs::watch::<ReclaimSpaceCronJob>(&core, owners.clone(), managed.clone(), reclaim_wakeups.clone());
    let (rotation, rotation_ready, rotation_changes) =
        cron_jobs::watch::<EncryptionKeyRotationCronJob>(&core, owners, managed.clone(), rotation_wakeups.clone());
    let crons = pvc::CronCaches {
        reclaim: reclaim.clone(),
        rotation: rotation.clone(),
        ready: [reclaim_ready.clone(), rotation_ready.clone()],
        managed,
    };
    let (stopped_reclaim, stopped_rotation) = (stopped(stop.clone()), stopped(stop.clone()));
    tasks.spawn(cron_jobs::run(
        core.clone(),
        reclaim,
        reclaim_ready,
        reclaim_changes,
        reclaim_wakeups,
        stopped_reclaim,
    ));
    tasks.spawn(cron_jobs::run(
        core.clone(),
        rotation,
        rotation_ready,
        rotation_changes,
        rotation_wakeups,
        stopped_rotation,
    ));
    tasks.spawn(pvc::run(
        core.clone(),
        (claims, classes, drivers),
        crons,
        owner_events,
        (roster, connected),
        stopped(stop.clone()),
    ));
    if volume_health_cleanup {
        tasks.spawn(volume_health::run(core.clone(), claims_store, claims_ready, stop.clone()));
    }
    while tasks.join_next().await.is_some() {}
    core.caches.clear();
}
