//! The act step of each one-shot job kind: which sidecars to call and what their answers mean.
use std::time::Duration;

use api::csiaddons::{
    EncryptionKeyRotationJob, EncryptionKeyRotationJobSpec, EncryptionKeyRotationJobStatus, ReclaimSpaceJob,
    ReclaimSpaceJobSpec, ReclaimSpaceJobStatus,
};
use api::proto::internal::encryption_key_rotation_client::EncryptionKeyRotationClient;
use api::proto::internal::reclaim_space_client::ReclaimSpaceClient;
use api::proto::internal::{EncryptionKeyRotateRequest, ReclaimSpaceRequest};

use super::decide::{Limits, ReclaimCall, ReclaimSides, reclaim_plan, reclaimed_bytes};
pub use super::decide::{RECLAIM_OFFLINE, RECLAIM_ONLINE};
use super::side::{ChosenSide, RECLAIM_SIDE_ANNOTATION, chosen_side};
use super::{AttemptError, Done, JobContext, JobKind, Volume};
use crate::core::slim::Slimmable;
use crate::sidecars::client::with_timeout;

/// `JobKind::keep_only_outcome` for a kind whose status is `$status` (both kinds share the fields).
macro_rules! keep_only_outcome {
    ($status:ty) => {
        fn keep_only_outcome(&mut self) {
            if let Some(status) = self.status.as_mut().filter(|s| s.result.is_some()) {
                let kept = (status.result.take(), status.start_time.take(), status.completion_time.take());
                *status = <$status>::default();
                (status.result, status.start_time, status.completion_time) = kept;
            }
        }
    };
}

/// A job kind's slim cache keeps its spec and status beside the compact metadata; the status
/// boxed, as a job waiting for its first pass has none and a finished one keeps three of its
/// fields (`keep_only_outcome`), while inline it would take some 200 bytes either way.
macro_rules! slimmable_job {
    ($job:ty, $spec:ty, $status:ty) => {
        impl Slimmable for $job {
            type Rest = ($spec, Option<Box<$status>>);
            fn split(self) -> (kube::api::ObjectMeta, Self::Rest) {
                (self.metadata, (self.spec, self.status.map(Box::new)))
            }
            fn join(metadata: kube::api::ObjectMeta, (spec, status): &Self::Rest) -> Self {
                Self { metadata, spec: spec.clone(), status: status.as_deref().cloned() }
            }
        }
    };
}

slimmable_job!(ReclaimSpaceJob, ReclaimSpaceJobSpec, ReclaimSpaceJobStatus);
slimmable_job!(EncryptionKeyRotationJob, EncryptionKeyRotationJobSpec, EncryptionKeyRotationJobStatus);

pub const KEY_ROTATION: &str = "encryption_key_rotation.ENCRYPTIONKEYROTATION";

impl JobKind for ReclaimSpaceJob {
    const CONTROLLER: &'static str = "reclaimspacejob";
    const SUCCESS: &'static str = "Reclaim Space operation successfully completed.";
    const KEPT_ANNOTATIONS: &'static [&'static str] = &[RECLAIM_SIDE_ANNOTATION];

    fn pvc(&self) -> &str {
        &self.spec.target.persistent_volume_claim
    }

    fn limits(&self) -> Limits {
        Limits::from_spec(self.spec.back_off_limit, self.spec.retry_deadline_seconds)
    }

    fn timeout(&self) -> Option<i64> {
        self.spec.timeout
    }

    fn default_timeout(settings: &crate::config::Settings) -> Duration {
        settings.reclaim_space_timeout
    }

    keep_only_outcome!(ReclaimSpaceJobStatus);

    async fn attempt(ctx: &JobContext, job: &Self, volume: &Volume, timeout: Duration) -> Result<Done, AttemptError> {
        let side = Box::pin(reclaim_side(ctx, job, volume)).await?;
        let node = volume.attached_to.as_deref().and_then(|n| ctx.pool.on_node(&volume.driver, n, RECLAIM_ONLINE).ok());
        // Boxed, as the calls below: a pass waits in one of them at a time, and a hundred passes
        // run at once; inline, each pass would hold room for all of them for its whole life.
        let (leader, leader_why) = match Box::pin(ctx.pool.leader(&ctx.client, &volume.driver)).await {
            Ok(leader) if leader.offers(RECLAIM_OFFLINE) => (Some(leader), String::new()),
            Ok(leader) => (None, format!("the leader {} does not offer it", leader.key())),
            Err(e) => (None, e.to_string()),
        };
        let sides = ReclaimSides {
            node_online: node.is_some(),
            driver_online: ctx.pool.offers(&volume.driver, RECLAIM_ONLINE),
            driver_offline: ctx.pool.offers(&volume.driver, RECLAIM_OFFLINE),
            leader_offline: leader.is_some(),
            // Read only for a chosen side: it walks the driver's CSIAddonsNodes.
            known: side.is_explicit()
                && ctx.state.caches.roster.settled(&ctx.pool, &volume.driver)
                && !ctx.pool.namespaces_of(&volume.driver).is_empty(),
        };
        let plan = reclaim_plan((&volume.driver, &volume.pv), volume.attached_to.as_deref(), sides, &leader_why, side)?;
        let mut usages = Vec::new();
        for call in plan {
            let (connection, method, what) = match &call {
                ReclaimCall::Node(_) => (node.clone(), "ReclaimSpace/NodeReclaimSpace", "make node request to"),
                ReclaimCall::Controller => {
                    (leader.clone(), "ReclaimSpace/ControllerReclaimSpace", "make controller request to")
                }
            };
            // The plan only names sides whose connection was found.
            let Some(connection) = connection else { continue };
            let mut client = ReclaimSpaceClient::new(connection.channel.clone());
            let message = ReclaimSpaceRequest { pv_name: volume.pv.clone() };
            let answer = ctx
                .metrics
                .timed_rpc(
                    method,
                    Box::pin(async {
                        match call {
                            ReclaimCall::Node(_) => client.node_reclaim_space(with_timeout(message, timeout)).await,
                            ReclaimCall::Controller => {
                                client.controller_reclaim_space(with_timeout(message, timeout)).await
                            }
                        }
                    }),
                )
                .await;
            match answer {
                Ok(answer) => {
                    let answer = answer.into_inner();
                    usages.push((answer.pre_usage.map(|u| u.usage_bytes), answer.post_usage.map(|u| u.usage_bytes)));
                }
                // As upstream: a side the driver does not implement reclaims nothing, unless it is
                // the side the user chose.
                Err(status) if status.code() == tonic::Code::Unimplemented && !side.is_explicit() => {}
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    return Err(AttemptError::SideUnimplemented {
                        side,
                        driver: volume.driver.clone(),
                        method,
                        message: status.message().to_owned(),
                    });
                }
                Err(status) => {
                    return Err(AttemptError::Call {
                        what,
                        sidecar: connection.key(),
                        code: status.code(),
                        message: status.message().to_owned(),
                    });
                }
            }
        }
        Ok(Done { reclaimed_bytes: reclaimed_bytes(&usages) })
    }
}

/// The side `job` reclaims on: its own annotation's, else its PVC's, else its StorageClass's (read
/// only when neither has one), else both.
async fn reclaim_side(ctx: &JobContext, job: &ReclaimSpaceJob, volume: &Volume) -> Result<ChosenSide, AttemptError> {
    let of_job = job.metadata.annotations.as_ref().and_then(|a| a.get(RECLAIM_SIDE_ANNOTATION)).map(String::as_str);
    let of_pvc = volume.pvc_reclaim_side.as_deref();
    let of_class = match (of_job, of_pvc, volume.storage_class.as_deref()) {
        (None, None, Some(class)) => ctx.state.caches.class_annotation(class, RECLAIM_SIDE_ANNOTATION).await?,
        _ => None,
    };
    Ok(chosen_side(of_job, of_pvc, of_class.as_deref())?)
}

impl JobKind for EncryptionKeyRotationJob {
    const CONTROLLER: &'static str = "encryptionkeyrotationjob";
    const SUCCESS: &'static str = "Key rotation operation successfully completed.";
    const KEPT_ANNOTATIONS: &'static [&'static str] = &[];

    fn pvc(&self) -> &str {
        &self.spec.target.persistent_volume_claim
    }

    fn limits(&self) -> Limits {
        Limits::from_spec(self.spec.back_off_limit, self.spec.retry_deadline_seconds)
    }

    fn timeout(&self) -> Option<i64> {
        self.spec.timeout
    }

    /// Upstream's fixed default for key rotation (reclaim-space-timeout is about reclaim space).
    fn default_timeout(_settings: &crate::config::Settings) -> Duration {
        Duration::from_secs(180)
    }

    keep_only_outcome!(EncryptionKeyRotationJobStatus);

    async fn attempt(ctx: &JobContext, _job: &Self, volume: &Volume, timeout: Duration) -> Result<Done, AttemptError> {
        let Some(node) = volume.attached_to.as_deref() else {
            return Err(AttemptError::NotAttached(volume.pv.clone()));
        };
        let connection = ctx.pool.on_node(&volume.driver, node, KEY_ROTATION)?;
        let message = EncryptionKeyRotateRequest { pv_name: volume.pv.clone() };
        let mut client = EncryptionKeyRotationClient::new(connection.channel.clone());
        // Boxed: the call's state is kilobytes, held only while it runs.
        let rotate = Box::pin(client.encryption_key_rotate(with_timeout(message, timeout)));
        let answer = ctx.metrics.timed_rpc("EncryptionKeyRotation/EncryptionKeyRotate", rotate).await;
        match answer {
            Ok(_) => Ok(Done::default()),
            // Upstream counts this as success: nothing was rotated. [differs: key-rotation-unimplemented]
            Err(status) if status.code() == tonic::Code::Unimplemented => Err(AttemptError::RotationUnimplemented {
                driver: volume.driver.clone(),
                message: status.message().to_owned(),
            }),
            Err(status) => Err(AttemptError::Call {
                what: "rotate the key through",
                sidecar: connection.key(),
                code: status.code(),
                message: status.message().to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::csiaddons::OperationResult;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_finished_job_keeps_its_outcome_and_times_and_a_running_one_everything() {
        let time = Time(k8s_openapi::jiff::Timestamp::from_second(1000).unwrap());
        let status = ReclaimSpaceJobStatus {
            result: Some(OperationResult::Succeeded),
            message: Some("done".into()),
            retries: Some(2),
            start_time: Some(time.clone()),
            completion_time: Some(time.clone()),
            ..Default::default()
        };
        let mut job = ReclaimSpaceJob::new("j", Default::default());
        job.status = Some(status.clone());
        job.keep_only_outcome();
        let kept = job.status.unwrap();
        assert_eq!(kept.result, Some(OperationResult::Succeeded));
        assert_eq!((kept.start_time, kept.completion_time), (Some(time.clone()), Some(time)));
        assert_eq!((kept.message, kept.retries), (None, None));

        let mut running = EncryptionKeyRotationJob::new("r", Default::default());
        running.status = Some(EncryptionKeyRotationJobStatus { retries: Some(1), ..Default::default() });
        running.keep_only_outcome();
        assert_eq!(running.status.unwrap().retries, Some(1));
    }
}
