//! The operations: validate flags, resolve references, call the driver, describe the result.
use std::collections::HashMap;

use anyhow::{Context, anyhow, bail};
use api::proto::{encryptionkeyrotation as ekr, fence, identity, reclaimspace, replication as repl, volumegroup as vg};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::flags::{Cli, Operation};
use crate::resolve;

/// A channel to the driver, connected now so a missing driver is reported at once.
async fn connect(endpoint: &str) -> anyhow::Result<Channel> {
    crate::connect::now(endpoint).await.with_context(|| format!("connecting to {endpoint}"))
}

async fn cluster(operation: Operation) -> anyhow::Result<kube::Client> {
    cluster_client::client(&cluster_client::user_agent("csi-addons", env!("CARGO_PKG_VERSION")), None, Default::default()).await.map_err(|e| {
        anyhow!("{operation:?} reads PersistentVolumes or Secrets from the cluster, and no cluster is configured ({e}): set KUBECONFIG, or run inside a Pod")
    })
}

fn required<'a>(value: &'a Option<String>, flag: &str, operation: Operation) -> anyhow::Result<&'a str> {
    value.as_deref().filter(|v| !v.is_empty()).ok_or_else(|| anyhow!("-{flag} is required for {operation:?}"))
}

/// `k1=v1,k2=v2` (plus `clusterID` from `-clusterid`).
fn parameters(cli: &Cli) -> anyhow::Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for pair in &cli.parameters {
        let (k, v) = pair.split_once('=').ok_or_else(|| anyhow!("-parameters entry {pair:?} is not key=value"))?;
        out.insert(k.to_owned(), v.to_owned());
    }
    if let Some(id) = cli.clusterid.as_ref().filter(|c| !c.is_empty()) {
        out.insert("clusterID".to_owned(), id.clone());
    }
    Ok(out)
}

/// The data of the Secret named by `-secret namespace/name`.
async fn secret_flag(cli: &Cli, required_for: Option<Operation>) -> anyhow::Result<HashMap<String, String>> {
    let Some(reference) = cli.secret.as_deref().filter(|s| !s.is_empty()) else {
        return match required_for {
            Some(op) => bail!("-secret namespace/name is required for {op:?}"),
            None => Ok(HashMap::new()),
        };
    };
    let (namespace, name) =
        reference.split_once('/').ok_or_else(|| anyhow!("-secret {reference:?} is not namespace/name"))?;
    let client = cluster(cli.operation).await?;
    Ok(resolve::secret(&client, namespace, name).await?)
}

async fn node_stage_secret(client: &kube::Client, volume: &resolve::Volume) -> anyhow::Result<HashMap<String, String>> {
    match &volume.node_stage_secret {
        Some((namespace, name)) => Ok(resolve::secret(client, namespace, name).await?),
        None => Ok(HashMap::new()),
    }
}

/// The replication source: exactly one of `-persistentvolume` or `-volumegroupreplicationcontent`.
async fn replication_source(cli: &Cli) -> anyhow::Result<repl::ReplicationSource> {
    use repl::replication_source::{Type, VolumeGroupSource, VolumeSource};
    let r#type = match (&cli.persistentvolume, &cli.volumegroupreplicationcontent) {
        (Some(pv), None) => {
            let volume = resolve::volume(&cluster(cli.operation).await?, pv).await?;
            Type::Volume(VolumeSource { volume_id: volume.handle })
        }
        (None, Some(content)) => {
            let api = kube::Api::<api::replication::VolumeGroupReplicationContent>::all(cluster(cli.operation).await?);
            let content =
                api.get(content).await.with_context(|| format!("getting VolumeGroupReplicationContent {content}"))?;
            let handle = content.spec.volume_group_replication_handle.filter(|h| !h.is_empty());
            Type::Volumegroup(VolumeGroupSource {
                volume_group_id: handle.context("the VolumeGroupReplicationContent has no group handle yet")?,
            })
        }
        _ => bail!(
            "exactly one of -persistentvolume or -volumegroupreplicationcontent is required for {:?}",
            cli.operation
        ),
    };
    Ok(repl::ReplicationSource { r#type: Some(r#type) })
}

fn usage(pre: Option<reclaimspace::StorageConsumption>, post: Option<reclaimspace::StorageConsumption>) -> Value {
    let (pre, post) = (pre.map(|u| u.usage_bytes), post.map(|u| u.usage_bytes));
    // Reclaimed space is what was used before minus what is used after, as the manager counts it
    // (upstream's CLI prints the two usages alone). [differs: cli-reclaimed-space]
    let reclaimed = pre.zip(post).map(|(a, b)| (a - b).max(0));
    json!({"preUsageBytes": pre, "postUsageBytes": post, "reclaimedBytes": reclaimed})
}

fn group(volume_group: Option<vg::VolumeGroup>) -> Value {
    let g = volume_group.unwrap_or_default();
    json!({"volumeGroupId": g.volume_group_id, "volumeIds": g.volumes.iter().map(|v| v.volume_id.clone()).collect::<Vec<_>>()})
}

pub async fn run(cli: &Cli) -> anyhow::Result<Value> {
    use Operation as Op;
    let op = cli.operation;
    // Flags first: a bad command line fails before anything is contacted.
    match op {
        Op::ControllerReclaimSpace | Op::NodeReclaimSpace | Op::EncryptionKeyRotation => {
            required(&cli.persistentvolume, "persistentvolume", op)?;
        }
        Op::NetworkFence | Op::NetworkUnFence if cli.cidrs.is_empty() => bail!("-cidrs is required for {op:?}"),
        Op::CreateVolumeGroup => {
            required(&cli.volumegroupname, "volumegroupname", op)?;
        }
        Op::ModifyVolumeGroupMembership | Op::DeleteVolumeGroup | Op::ControllerGetVolumeGroup => {
            required(&cli.volumegroupid, "volumegroupid", op)?;
        }
        _ => {}
    }
    let parameters = parameters(cli)?;
    let channel = connect(&cli.endpoint).await?;
    let result = match op {
        Op::GetIdentity => {
            let r = identity::identity_client::IdentityClient::new(channel)
                .get_identity(identity::GetIdentityRequest {})
                .await?
                .into_inner();
            json!({"name": r.name, "vendorVersion": r.vendor_version, "manifest": r.manifest})
        }
        Op::GetCapabilities => {
            let r = identity::identity_client::IdentityClient::new(channel)
                .get_capabilities(identity::GetCapabilitiesRequest {})
                .await?;
            json!({"capabilities": api::capabilities::to_strings(&r.into_inner().capabilities)})
        }
        Op::Probe => {
            let r = identity::identity_client::IdentityClient::new(channel)
                .probe(identity::ProbeRequest {})
                .await?
                .into_inner();
            json!({"ready": r.ready})
        }
        Op::ControllerReclaimSpace => {
            let client = cluster(op).await?;
            let volume = resolve::volume(&client, required(&cli.persistentvolume, "persistentvolume", op)?).await?;
            let request = reclaimspace::ControllerReclaimSpaceRequest {
                volume_id: volume.handle.clone(),
                parameters: volume.attributes.clone(),
                secrets: node_stage_secret(&client, &volume).await?,
            };
            let r = reclaimspace::reclaim_space_controller_client::ReclaimSpaceControllerClient::new(channel)
                .controller_reclaim_space(request)
                .await?
                .into_inner();
            usage(r.pre_usage, r.post_usage)
        }
        Op::NodeReclaimSpace => {
            let client = cluster(op).await?;
            let mut volume = resolve::volume(&client, required(&cli.persistentvolume, "persistentvolume", op)?).await?;
            if let Some(driver) = cli.drivername.as_ref().filter(|d| !d.is_empty()) {
                volume.driver = driver.clone();
            }
            let staging = if cli.legacy {
                format!("{}/pv/{}/globalmount", cli.stagingpath.trim_end_matches('/'), volume.pv_name)
            } else {
                resolve::staging_path(&cli.stagingpath, &volume)
            };
            let request = reclaimspace::NodeReclaimSpaceRequest {
                volume_id: volume.handle.clone(),
                volume_path: String::new(),
                staging_target_path: staging,
                volume_capability: Some(resolve::capability(&volume)),
                secrets: node_stage_secret(&client, &volume).await?,
            };
            let r = reclaimspace::reclaim_space_node_client::ReclaimSpaceNodeClient::new(channel)
                .node_reclaim_space(request)
                .await?
                .into_inner();
            usage(r.pre_usage, r.post_usage)
        }
        Op::NetworkFence | Op::NetworkUnFence => {
            let secrets = secret_flag(cli, Some(op)).await?;
            let cidrs: Vec<fence::Cidr> = cli.cidrs.iter().map(|c| fence::Cidr { cidr: c.clone() }).collect();
            let mut client = fence::fence_controller_client::FenceControllerClient::new(channel);
            if op == Op::NetworkFence {
                client.fence_cluster_network(fence::FenceClusterNetworkRequest { parameters, secrets, cidrs }).await?;
            } else {
                client
                    .unfence_cluster_network(fence::UnfenceClusterNetworkRequest { parameters, secrets, cidrs })
                    .await?;
            }
            json!({"result": if op == Op::NetworkFence { "fenced" } else { "unfenced" }, "cidrs": cli.cidrs})
        }
        Op::EnableVolumeReplication
        | Op::DisableVolumeReplication
        | Op::PromoteVolume
        | Op::DemoteVolume
        | Op::ResyncVolume
        | Op::GetVolumeReplicationInfo => replicate(cli, channel, parameters).await?,
        Op::CreateVolumeGroup => {
            let request = vg::CreateVolumeGroupRequest {
                name: required(&cli.volumegroupname, "volumegroupname", op)?.to_owned(),
                parameters,
                secrets: secret_flag(cli, None).await?,
                volume_ids: cli.volumeids.clone(),
            };
            group(
                vg::controller_client::ControllerClient::new(channel)
                    .create_volume_group(request)
                    .await?
                    .into_inner()
                    .volume_group,
            )
        }
        Op::ModifyVolumeGroupMembership => {
            let request = vg::ModifyVolumeGroupMembershipRequest {
                volume_group_id: required(&cli.volumegroupid, "volumegroupid", op)?.to_owned(),
                volume_ids: cli.volumeids.clone(),
                secrets: secret_flag(cli, None).await?,
                parameters,
            };
            group(
                vg::controller_client::ControllerClient::new(channel)
                    .modify_volume_group_membership(request)
                    .await?
                    .into_inner()
                    .volume_group,
            )
        }
        Op::DeleteVolumeGroup => {
            let id = required(&cli.volumegroupid, "volumegroupid", op)?.to_owned();
            let request =
                vg::DeleteVolumeGroupRequest { volume_group_id: id.clone(), secrets: secret_flag(cli, None).await? };
            vg::controller_client::ControllerClient::new(channel).delete_volume_group(request).await?;
            json!({"deleted": id})
        }
        Op::ControllerGetVolumeGroup => {
            let request = vg::ControllerGetVolumeGroupRequest {
                volume_group_id: required(&cli.volumegroupid, "volumegroupid", op)?.to_owned(),
                secrets: secret_flag(cli, None).await?,
            };
            group(
                vg::controller_client::ControllerClient::new(channel)
                    .controller_get_volume_group(request)
                    .await?
                    .into_inner()
                    .volume_group,
            )
        }
        Op::EncryptionKeyRotation => {
            let client = cluster(op).await?;
            let volume = resolve::volume(&client, required(&cli.persistentvolume, "persistentvolume", op)?).await?;
            let request = ekr::EncryptionKeyRotateRequest {
                volume_id: volume.handle.clone(),
                parameters: volume.attributes.clone(),
                secrets: node_stage_secret(&client, &volume).await?,
                // A complete capability (upstream sends one without an access type, invalid in CSI).
                // [differs: key-rotation-capability]
                volume_capability: Some(resolve::capability(&volume)),
                ..Default::default()
            };
            ekr::encryption_key_rotation_controller_client::EncryptionKeyRotationControllerClient::new(channel)
                .encryption_key_rotate(request)
                .await?;
            json!({"rotated": volume.pv_name})
        }
    };
    Ok(result)
}

async fn replicate(cli: &Cli, channel: Channel, parameters: HashMap<String, String>) -> anyhow::Result<Value> {
    use Operation as Op;
    let source = Some(replication_source(cli).await?);
    let secrets = secret_flag(cli, None).await?;
    let mut client = repl::controller_client::ControllerClient::new(channel);
    Ok(match cli.operation {
        Op::EnableVolumeReplication => {
            client
                .enable_volume_replication(repl::EnableVolumeReplicationRequest {
                    parameters,
                    secrets,
                    replication_source: source,
                    ..Default::default()
                })
                .await?;
            json!({"result": "replication enabled"})
        }
        Op::DisableVolumeReplication => {
            client
                .disable_volume_replication(repl::DisableVolumeReplicationRequest {
                    parameters,
                    secrets,
                    replication_source: source,
                    ..Default::default()
                })
                .await?;
            json!({"result": "replication disabled"})
        }
        Op::PromoteVolume => {
            client
                .promote_volume(repl::PromoteVolumeRequest {
                    parameters,
                    secrets,
                    replication_source: source,
                    ..Default::default()
                })
                .await?;
            json!({"result": "promoted"})
        }
        Op::DemoteVolume => {
            client
                .demote_volume(repl::DemoteVolumeRequest {
                    parameters,
                    secrets,
                    replication_source: source,
                    ..Default::default()
                })
                .await?;
            json!({"result": "demoted"})
        }
        Op::ResyncVolume => {
            let r = client
                .resync_volume(repl::ResyncVolumeRequest {
                    parameters,
                    secrets,
                    replication_source: source,
                    ..Default::default()
                })
                .await?;
            json!({"ready": r.into_inner().ready})
        }
        _ => {
            let r = client
                .get_volume_replication_info(repl::GetVolumeReplicationInfoRequest {
                    secrets,
                    replication_source: source,
                    ..Default::default()
                })
                .await?
                .into_inner();
            json!({
                "lastSyncTime": r.last_sync_time.map(|t| t.seconds),
                "lastSyncDurationSeconds": r.last_sync_duration.map(|d| d.seconds),
                "lastSyncBytes": r.last_sync_bytes,
                "status": r.status().as_str_name(),
                "statusMessage": r.status_message,
            })
        }
    })
}
