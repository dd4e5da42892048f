//! The story: every CSI-Addons operation on the stack, each step with its measured effect.
mod kubelet;
mod protection;
mod volumes;

use std::collections::BTreeMap;
use std::path::PathBuf;

use kube::api::{Api, DynamicObject};
use serde_json::Value;

use crate::stack::{DEMO_NAMESPACE, Stack};
use crate::{Error, Result};

pub const MIB: i64 = 1 << 20;

/// One step that worked: what was done to which object, and what it measurably changed.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub step: &'static str,
    pub object: String,
    pub effect: String,
    /// The measured figures behind `effect` (bytes, counts), for the end-to-end suite.
    pub facts: BTreeMap<&'static str, i64>,
}

impl Outcome {
    fn new(step: &'static str, object: impl Into<String>, effect: impl Into<String>) -> Self {
        Outcome { step, object: object.into(), effect: effect.into(), facts: BTreeMap::new() }
    }

    fn fact(mut self, name: &'static str, value: i64) -> Self {
        self.facts.insert(name, value);
        self
    }
}

/// A step that did not work: which, on what, why, and the last log lines of the component at fault.
#[derive(Debug)]
pub struct Failure {
    pub step: &'static str,
    pub object: String,
    pub error: Error,
    pub component: &'static str,
    pub log_tail: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "step {:?} failed on {}: {}", self.step, self.object, self.error)?;
        writeln!(f, "last lines of {}'s log:", self.component)?;
        write!(f, "{}", self.log_tail)
    }
}

/// The steps, in order: (name, object, the component a failure most likely lies with).
pub const STEPS: [(&str, &str, &str); 10] = [
    ("Provision", "demo/data-{1,2}, repl-1, group-{1,2}", "csi-provisioner"),
    ("Publish and write", "demo/data-1", "reference-driver (node)"),
    ("ReclaimSpaceJob (attached)", "demo/reclaim-attached", "csi-addons-manager"),
    ("ReclaimSpaceJob (unattached)", "demo/reclaim-unattached", "csi-addons-manager"),
    ("StorageClass schedule", "StorageClass/demo-reference", "csi-addons-manager"),
    ("EncryptionKeyRotationJob", "demo/rotate-data-1", "csi-addons-manager"),
    ("NetworkFence", "NetworkFence/demo-node-fence", "csi-addons-manager"),
    ("VolumeReplication", "demo/repl-1", "csi-addons-manager"),
    ("VolumeGroupReplication", "demo/group", "csi-addons-manager"),
    ("Clean-up", "demo/*", "csi-addons-manager"),
];

/// The steps the interop suite runs with one half upstream's: reclaim space, fencing and
/// replication, with the steps they stand on (provisioning, a written volume) and the clean-up.
pub const INTEROP_STEPS: [&str; 8] = [
    "Provision",
    "Publish and write",
    "ReclaimSpaceJob (attached)",
    "ReclaimSpaceJob (unattached)",
    "NetworkFence",
    "VolumeReplication",
    "VolumeGroupReplication",
    "Clean-up",
];

/// Runs the whole story; `report` sees each outcome as it happens.
pub async fn run(stack: &Stack, report: &mut dyn FnMut(&Outcome)) -> Result<Vec<Outcome>, Failure> {
    run_steps(stack, &STEPS.map(|(step, _, _)| step), report).await
}

/// Runs the named steps of the story, in the story's order.
pub async fn run_steps(
    stack: &Stack,
    names: &[&str],
    report: &mut dyn FnMut(&Outcome),
) -> Result<Vec<Outcome>, Failure> {
    let mut outcomes = Vec::new();
    let mut story = Story { stack, volumes: BTreeMap::new(), mounted_data_1: None };
    for (step, object, component) in STEPS.iter().filter(|(step, _, _)| names.contains(step)) {
        let result = match *step {
            "Provision" => story.provision().await,
            "Publish and write" => story.publish_and_write().await,
            "ReclaimSpaceJob (attached)" => story.reclaim_attached().await,
            "ReclaimSpaceJob (unattached)" => story.reclaim_unattached().await,
            "StorageClass schedule" => story.storage_class_schedule().await,
            "EncryptionKeyRotationJob" => story.rotate_key().await,
            "NetworkFence" => story.fence().await,
            "VolumeReplication" => story.replicate().await,
            "VolumeGroupReplication" => story.replicate_group().await,
            "Clean-up" => story.clean_up().await,
            other => Err(Error::Manifest(format!("the story has no step {other:?}"))),
        };
        match result {
            Ok(outcome) => {
                report(&outcome);
                outcomes.push(outcome);
            }
            Err(error) => {
                return Err(Failure {
                    step,
                    object: (*object).to_owned(),
                    error,
                    component,
                    log_tail: stack.log_tail(component, 20),
                });
            }
        }
    }
    Ok(outcomes)
}

/// A provisioned PVC: its PV and the driver's volume ID.
#[derive(Clone, Debug)]
struct Volume {
    pv: String,
    handle: String,
}

/// Where a volume is staged and published (the kubelet's steps, in `kubelet`).
struct Mounted {
    staging: PathBuf,
    target: PathBuf,
}

struct Story<'a> {
    stack: &'a Stack,
    volumes: BTreeMap<String, Volume>,
    /// data-1 stays published between the write and the reclaim on the node.
    mounted_data_1: Option<Mounted>,
}

impl Story<'_> {
    fn api(&self, api_version: &str, kind: &str) -> Result<Api<DynamicObject>> {
        self.stack.applier.api(api_version, kind, DEMO_NAMESPACE)
    }

    fn volume(&self, pvc: &str) -> Result<&Volume> {
        self.volumes.get(pvc).ok_or_else(|| Error::Manifest(format!("PVC {pvc} was not provisioned")))
    }

    /// Waits until `name`'s status has a value at `pointer` for which `done` holds; returns the status.
    async fn status_until(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        what: &str,
        seconds: u64,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        self.stack
            .until(what, seconds, async || {
                let status = api.get_opt(name).await?.map(|o| o.data["status"].clone()).unwrap_or_default();
                Ok(done(&status).then_some(status))
            })
            .await
    }
}

/// `bytes` as MiB with one decimal, e.g. `96.0 MiB`.
pub fn mib(bytes: i64) -> String {
    // Display only: the f64 rounding of byte counts below 2^53 is exact enough.
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}
