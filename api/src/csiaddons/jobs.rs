//! ReclaimSpace and EncryptionKeyRotation jobs and the cron jobs that create them. Both families
//! share their shape; the shared parts are defined once here.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn default_back_off_limit() -> i32 {
    6
}
fn default_retry_deadline_seconds() -> i64 {
    600
}
fn default_successful_jobs_history_limit() -> i32 {
    3
}
fn default_failed_jobs_history_limit() -> i32 {
    1
}

/// The volume a job works on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobTarget {
    /// Name of the PersistentVolumeClaim, in the job's namespace.
    // Required and non-empty: upstream accepts an empty one and fails the job later.
    // [differs: pvc-target-required]
    #[schemars(length(min = 1))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("persistentVolumeClaim is immutable"))]
    pub persistent_volume_claim: String,
}

/// Desired behaviour of a ReclaimSpaceJob: reclaim unused space on one volume.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "csiaddons.openshift.io",
    version = "v1alpha1",
    kind = "ReclaimSpaceJob",
    plural = "reclaimspacejobs",
    namespaced,
    status = "ReclaimSpaceJobStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".metadata.namespace"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Retries","type":"integer","jsonPath":".status.retries"}"#,
    printcolumn = r#"{"name":"Result","type":"string","jsonPath":".status.result"}"#,
    printcolumn = r#"{"name":"ReclaimedSpace","type":"string","jsonPath":".status.reclaimedSpace","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimSpaceJobSpec {
    /// The volume to reclaim space on.
    pub target: JobTarget,
    /// How many times a failed attempt is retried before the job is marked Failed.
    #[serde(default = "default_back_off_limit")]
    #[schemars(range(min = 0, max = 60))]
    pub back_off_limit: i32,
    /// How long, from the job's start, retries may go on, in seconds.
    #[serde(default = "default_retry_deadline_seconds")]
    #[schemars(range(min = 0, max = 1800))]
    pub retry_deadline_seconds: i64,
    /// Timeout of each call to the driver, in seconds; the manager's `--reclaim-space-timeout` when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60))]
    pub timeout: Option<i64>,
}

/// Outcome of a job or a fence operation.
// The schema lists the two values (upstream's takes any string, though its manager writes only
// these). [differs: status-enums]
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationResult {
    Succeeded,
    Failed,
}

/// Observed state of a ReclaimSpaceJob.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimSpaceJobStatus {
    /// `Succeeded` or `Failed` once the job has finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<OperationResult>,
    /// Why the job ended as it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Space the driver reported as reclaimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity")]
    pub reclaimed_space: Option<Quantity>,
    /// Conditions of the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Attempts that failed so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<i32>,
    /// When the job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// Desired behaviour of an EncryptionKeyRotationJob: rotate the encryption key of one volume.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "csiaddons.openshift.io",
    version = "v1alpha1",
    kind = "EncryptionKeyRotationJob",
    plural = "encryptionkeyrotationjobs",
    namespaced,
    status = "EncryptionKeyRotationJobStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".metadata.namespace"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Retries","type":"integer","jsonPath":".status.retries"}"#,
    printcolumn = r#"{"name":"Result","type":"string","jsonPath":".status.result"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionKeyRotationJobSpec {
    /// The volume whose key is rotated.
    pub target: JobTarget,
    /// How many times a failed attempt is retried before the job is marked Failed.
    #[serde(default = "default_back_off_limit")]
    #[schemars(range(min = 0, max = 60))]
    pub back_off_limit: i32,
    /// How long, from the job's start, retries may go on, in seconds.
    #[serde(default = "default_retry_deadline_seconds")]
    #[schemars(range(min = 0, max = 1800))]
    pub retry_deadline_seconds: i64,
    /// Timeout of each call to the driver, in seconds (3 minutes when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60))]
    pub timeout: Option<i64>,
}

/// Observed state of an EncryptionKeyRotationJob.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionKeyRotationJobStatus {
    /// `Succeeded` or `Failed` once the job has finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<OperationResult>,
    /// Why the job ended as it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions of the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Attempts that failed so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<i32>,
    /// When the job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// What a cron job does when a run is due while the previous job is still active.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConcurrencyPolicy {
    /// Skip the new run.
    #[default]
    Forbid,
    /// Delete the active job and start the new one.
    Replace,
}

// Upstream's schema drops `labels` and `annotations` here, and rejects them under strict field
// validation. [differs: template-metadata]
/// Labels and annotations given to every job a cron job creates.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct JobTemplateMetadata {
    /// Labels of the created jobs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the created jobs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The job a ReclaimSpaceCronJob creates on each run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ReclaimSpaceJobTemplateSpec {
    /// Labels and annotations of the created jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JobTemplateMetadata>,
    /// Spec of the created jobs.
    pub spec: ReclaimSpaceJobSpec,
}

/// The job an EncryptionKeyRotationCronJob creates on each run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct EncryptionKeyRotationJobTemplateSpec {
    /// Labels and annotations of the created jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JobTemplateMetadata>,
    /// Spec of the created jobs.
    pub spec: EncryptionKeyRotationJobSpec,
}

/// Desired behaviour of a ReclaimSpaceCronJob: run ReclaimSpaceJobs on a schedule.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "csiaddons.openshift.io",
    version = "v1alpha1",
    kind = "ReclaimSpaceCronJob",
    plural = "reclaimspacecronjobs",
    namespaced,
    status = "CronJobStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#,
    printcolumn = r#"{"name":"Suspend","type":"boolean","jsonPath":".spec.suspend"}"#,
    printcolumn = r#"{"name":"Active","type":"string","jsonPath":".status.active.name"}"#,
    printcolumn = r#"{"name":"Lastschedule","type":"date","jsonPath":".status.lastScheduleTime"}"#,
    printcolumn = r#"{"name":"Lastsuccessfultime","type":"date","jsonPath":".status.lastSuccessfulTime","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimSpaceCronJobSpec {
    /// When to run: five cron fields (`0 2 * * 0`) or a descriptor such as `@weekly`.
    #[schemars(regex(pattern = r".+"))]
    pub schedule: String,
    /// How late, in seconds, a missed run may still start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_seconds: Option<i64>,
    /// What to do when a run is due while a job is still active.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// Suspends future runs; a running job is not stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// The job created on each run.
    pub job_template: ReclaimSpaceJobTemplateSpec,
    /// How many succeeded jobs to keep.
    #[serde(default = "default_successful_jobs_history_limit")]
    #[schemars(range(min = 0, max = 60))]
    pub successful_jobs_history_limit: i32,
    /// How many failed jobs to keep.
    #[serde(default = "default_failed_jobs_history_limit")]
    #[schemars(range(min = 0, max = 60))]
    pub failed_jobs_history_limit: i32,
}

/// Desired behaviour of an EncryptionKeyRotationCronJob: rotate a volume's key on a schedule.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "csiaddons.openshift.io",
    version = "v1alpha1",
    kind = "EncryptionKeyRotationCronJob",
    plural = "encryptionkeyrotationcronjobs",
    namespaced,
    status = "CronJobStatus",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#,
    printcolumn = r#"{"name":"Suspend","type":"boolean","jsonPath":".spec.suspend"}"#,
    printcolumn = r#"{"name":"Active","type":"string","jsonPath":".status.active.name"}"#,
    printcolumn = r#"{"name":"Lastschedule","type":"date","jsonPath":".status.lastScheduleTime"}"#,
    printcolumn = r#"{"name":"Lastsuccessfultime","type":"date","jsonPath":".status.lastSuccessfulTime","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionKeyRotationCronJobSpec {
    /// When to run: five cron fields (`0 2 * * 0`) or a descriptor such as `@weekly`.
    #[schemars(regex(pattern = r".+"))]
    pub schedule: String,
    /// How late, in seconds, a missed run may still start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_seconds: Option<i64>,
    /// What to do when a run is due while a job is still active.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// Suspends future runs; a running job is not stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// The job created on each run.
    pub job_template: EncryptionKeyRotationJobTemplateSpec,
    /// How many succeeded jobs to keep.
    #[serde(default = "default_successful_jobs_history_limit")]
    #[schemars(range(min = 0, max = 60))]
    pub successful_jobs_history_limit: i32,
    /// How many failed jobs to keep.
    #[serde(default = "default_failed_jobs_history_limit")]
    #[schemars(range(min = 0, max = 60))]
    pub failed_jobs_history_limit: i32,
}

/// Observed state of a cron job.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CronJobStatus {
    /// The job currently running, if any.
    // Boxed: usually empty, and every cached cron job would otherwise carry its 168 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub active: Option<Box<ObjectReference>>,
    /// When a job was last scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When a job last succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Time>,
}
