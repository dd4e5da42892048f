//! The sizes of the reconcile futures. One is allocated for each object being reconciled, up to
//! the worker limit at once, so the manager's memory under load (what `make bench` measures)
//! grows with them. `examples/future_sizes.rs` prints them as the shipped binary's profile lays
//! them out, and a test holds each under a bound, so a change that doubles one fails a test
//! instead of silently costing memory.
use api::csiaddons::{EncryptionKeyRotationCronJob, EncryptionKeyRotationJob, ReclaimSpaceCronJob, ReclaimSpaceJob};

use crate::controllers::{
    cron_jobs, jobs, network_fence, network_fence_class, node, pvc, volume_group_replication,
    volume_group_replication_content, volume_replication,
};

// The size of what `f` returns, read from its type alone: nothing is called.
fn of2<A, B, F: Future>(_: impl Fn(A, B) -> F) -> usize {
    size_of::<F>()
}

fn of3<A, B, C, F: Future>(_: impl Fn(A, B, C) -> F) -> usize {
    size_of::<F>()
}

fn of4<A, B, C, D, F: Future>(_: impl Fn(A, B, C, D) -> F) -> usize {
    size_of::<F>()
}

/// Each controller's reconcile future (controller-runtime's names for upstream's), in bytes.
pub fn reconcile_futures() -> Vec<(&'static str, usize)> {
    vec![
        ("csiaddonsnode", of2(node::reconcile)),
        ("reclaimspacejob", of2(jobs::reconcile::<ReclaimSpaceJob>)),
        ("encryptionkeyrotationjob", of2(jobs::reconcile::<EncryptionKeyRotationJob>)),
        ("reclaimspacecronjob", of4(cron_jobs::reconcile::<ReclaimSpaceCronJob>)),
        ("encryptionkeyrotationcronjob", of4(cron_jobs::reconcile::<EncryptionKeyRotationCronJob>)),
        ("persistentvolumeclaim", of3(pvc::reconcile)),
        ("networkfence", of2(network_fence::reconcile)),
        ("networkfenceclass", of2(network_fence_class::reconcile)),
        ("volumereplication", of2(volume_replication::reconcile)),
        ("volumegroupreplication", of2(volume_group_replication::reconcile)),
        ("volumegroupreplicationcontent", of2(volume_group_replication_content::reconcile)),
    ]
}
