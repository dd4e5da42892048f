//! Network fencing, volume replication and volume-group replication, then the clean-up that
//! disables replication again.
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::volumes::GROUP_LABEL;
use super::{Outcome, Story};
use crate::stack::{DEMO_NAMESPACE, DRIVER, DRIVER_NAMESPACE, NODE_IP};
use crate::{Error, Result};

const CSIADDONS: &str = "csiaddons.openshift.io/v1alpha1";
const REPLICATION: &str = "replication.storage.openshift.io/v1alpha1";
const FENCE: &str = "demo-node-fence";
const DRIVER_SECRET: &str = "demo-driver-credentials";
const REPLICATION_CLASS: &str = "demo-replication";

impl Story<'_> {
    /// The driver's credentials, as Ceph-CSI's: the classes name the Secret and the sidecar reads
    /// it (the manager never reads Secrets). Upstream's sidecar needs one: it always reads the
    /// Secret, and refuses a fence or a replication that names none.
    async fn driver_credentials(&self) -> Result<()> {
        self.stack
            .applier
            .apply(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": DRIVER_SECRET, "namespace": DRIVER_NAMESPACE},
                "stringData": {"userID": "demo-admin", "userKey": "demo-key"},
            }))
            .await?;
        Ok(())
    }

    async fn fence_state(&self, state: &str, message: &str) -> Result<Value> {
        let fences = self.stack.applier.api(CSIADDONS, "NetworkFence", "")?;
        let patch = json!({"spec": {"fenceState": state}});
        fences.patch(FENCE, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        let what = format!("NetworkFence {FENCE} to say {message:?}");
        self.status_until(&fences, FENCE, &what, 60, |s| s["message"] == message).await
    }

    pub(super) async fn fence(&mut self) -> Result<Outcome> {
        let applier = &self.stack.applier;
        self.driver_credentials().await?;
        applier
            .apply(json!({
                "apiVersion": CSIADDONS, "kind": "NetworkFenceClass",
                "metadata": {"name": "demo-fence-class"},
                "spec": {"provisioner": DRIVER, "parameters": {
                    "clusterID": "demo",
                    "csiaddons.openshift.io/networkfence-secret-name": DRIVER_SECRET,
                    "csiaddons.openshift.io/networkfence-secret-namespace": DRIVER_NAMESPACE,
                }},
            }))
            .await?;
        // A volume staged on the node before the fence: publishing it is what fencing must stop.
        let volume = self.volume("data-2")?.clone();
        let mounted = self.stage_and_publish(&volume).await?;
        self.unpublish(&volume, &mounted).await?;
        let cidr = format!("{NODE_IP}/32");
        applier
            .apply(json!({
                "apiVersion": CSIADDONS, "kind": "NetworkFence",
                "metadata": {"name": FENCE},
                "spec": {"networkFenceClassName": "demo-fence-class", "cidrs": [cidr], "fenceState": "Fenced"},
            }))
            .await?;
        self.fence_state("Fenced", "fencing operation successful").await?;
        let refused = match self.publish(&volume, &mounted).await {
            Err(status) if status.code() == tonic::Code::FailedPrecondition => status.message().to_owned(),
            Err(status) => return Err(Error::Grpc(status)),
            Ok(()) => return Err(Error::Manifest("NodePublishVolume worked on a fenced node".into())),
        };
        self.fence_state("Unfenced", "unfencing operation successful").await?;
        self.publish(&volume, &mounted).await?;
        self.unpublish_and_unstage(&volume, &mounted).await?;
        let effect =
            format!("Fenced {cidr}: NodePublishVolume refused ({refused}); Unfenced: the same publish works again");
        Ok(Outcome::new("NetworkFence", format!("NetworkFence/{FENCE}"), effect).fact("refused", 1))
    }

    /// Sets the VolumeReplication's state and waits until its status reports `observed`.
    async fn replication_state(&self, desired: &str, observed: &str) -> Result<Value> {
        let replications = self.api(REPLICATION, "VolumeReplication")?;
        let patch = json!({"spec": {"replicationState": desired}});
        replications.patch("repl-1", &PatchParams::default(), &Patch::Merge(&patch)).await?;
        let what = format!("VolumeReplication repl-1 to be {observed}");
        self.status_until(&replications, "repl-1", &what, 120, |s| s["state"] == observed).await
    }

    pub(super) async fn replicate(&mut self) -> Result<Outcome> {
        let applier = &self.stack.applier;
        self.driver_credentials().await?;
        applier
            .apply(json!({
                "apiVersion": REPLICATION, "kind": "VolumeReplicationClass",
                "metadata": {"name": REPLICATION_CLASS},
                "spec": {"provisioner": DRIVER, "parameters": {
                    "schedulingInterval": "1m",
                    "replication.storage.openshift.io/replication-secret-name": DRIVER_SECRET,
                    "replication.storage.openshift.io/replication-secret-namespace": DRIVER_NAMESPACE,
                }},
            }))
            .await?;
        applier
            .apply(json!({
                "apiVersion": REPLICATION, "kind": "VolumeReplication",
                "metadata": {"name": "repl-1", "namespace": DEMO_NAMESPACE},
                "spec": {
                    "volumeReplicationClass": REPLICATION_CLASS, "replicationState": "primary", "autoResync": false,
                    "dataSource": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "repl-1"},
                },
            }))
            .await?;
        let replications = self.api(REPLICATION, "VolumeReplication")?;
        let primary = self
            .status_until(&replications, "repl-1", "VolumeReplication repl-1 to be Primary with sync info", 120, |s| {
                s["state"] == "Primary" && s["lastSyncTime"].is_string()
            })
            .await?;
        self.replication_state("secondary", "Secondary").await?;
        self.replication_state("primary", "Primary").await?;
        let effect = format!(
            "Primary (last sync {}{}, destination {}) → Secondary → Primary",
            primary["lastSyncTime"].as_str().unwrap_or("?"),
            primary["lastSyncBytes"].as_i64().map_or_else(String::new, |b| format!(", {b} bytes")),
            primary["destinationVolumeID"].as_str().unwrap_or("not reported"),
        );
        Ok(Outcome::new("VolumeReplication", "demo/repl-1", effect).fact("transitions", 2))
    }

    pub(super) async fn replicate_group(&mut self) -> Result<Outcome> {
        let applier = &self.stack.applier;
        self.driver_credentials().await?;
        applier
            .apply(json!({
                "apiVersion": REPLICATION, "kind": "VolumeGroupReplicationClass",
                "metadata": {"name": "demo-group-replication"},
                "spec": {"provisioner": DRIVER, "parameters": {
                    "replication.storage.openshift.io/group-replication-secret-name": DRIVER_SECRET,
                    "replication.storage.openshift.io/group-replication-secret-namespace": DRIVER_NAMESPACE,
                }},
            }))
            .await?;
        applier
            .apply(json!({
                "apiVersion": REPLICATION, "kind": "VolumeGroupReplication",
                "metadata": {"name": "group", "namespace": DEMO_NAMESPACE},
                "spec": {
                    "volumeGroupReplicationClassName": "demo-group-replication",
                    "volumeReplicationClassName": REPLICATION_CLASS, "replicationState": "primary",
                    "source": {"selector": {"matchLabels": {GROUP_LABEL: "demo"}}},
                },
            }))
            .await?;
        let groups = self.api(REPLICATION, "VolumeGroupReplication")?;
        let status = self
            .status_until(&groups, "group", "VolumeGroupReplication group to be Primary with 2 PVCs", 120, |s| {
                s["state"] == "Primary" && s["persistentVolumeClaimsRefList"].as_array().is_some_and(|l| l.len() == 2)
            })
            .await?;
        let members: Vec<&str> = status["persistentVolumeClaimsRefList"]
            .as_array()
            .map(|l| l.iter().filter_map(|r| r["name"].as_str()).collect())
            .unwrap_or_default();
        let content = groups.get("group").await?.data["spec"]["volumeGroupReplicationContentName"].clone();
        let effect = format!(
            "the PVCs labelled {GROUP_LABEL}=demo ({}) grouped in content {} and replicating as Primary",
            members.join(", "),
            content.as_str().unwrap_or("?")
        );
        Ok(Outcome::new("VolumeGroupReplication", "demo/group", effect).fact("members", 2))
    }

    pub(super) async fn clean_up(&mut self) -> Result<Outcome> {
        let mut gone = Vec::new();
        for (kind, name) in [("VolumeGroupReplication", "group"), ("VolumeReplication", "repl-1")] {
            let api = self.api(REPLICATION, kind)?;
            api.delete(name, &DeleteParams::default()).await?;
            let what = format!("{kind} {name} to be deleted (replication disabled, finalizers released)");
            self.stack.until(&what, 120, async || Ok(api.get_opt(name).await?.is_none().then_some(()))).await?;
            gone.push(format!("{kind} {name}"));
        }
        let effect = format!("{} deleted: replication disabled, finalizers released", gone.join(" and "));
        Ok(Outcome::new("Clean-up", "demo/group, demo/repl-1", effect).fact("deleted", 2))
    }
}
