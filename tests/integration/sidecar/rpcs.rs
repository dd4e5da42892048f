//! Each RPC of the controller↔sidecar protocol through the real sidecar process (TLS, a
//! TokenReview'd bearer token) to a recording driver: handles, attributes, Secrets read by
//! reference, access modes, both staging-path forms, the publish path, and error codes.
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use api::proto::csi::v1 as csi;
use api::proto::internal as pb;
use api::proto::{encryptionkeyrotation as ekr, fence, reclaimspace, replication, volumegroup};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Secret};
use kube::api::{Api, PostParams};
use serde_json::json;
use sha2::Digest;
use testenv::poll::MINUTE;
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::recording_driver::RecordingDriver;
use crate::harness::sidecar::{
    Serving, SidecarProcess, TestPki, Workload, bearer, manager_token, sidecar_pod, tls_channel,
};
use crate::harness::support::unique;

const DRIVER: &str = "recording.csi-addons-rs.io";
const NODE: &str = "node-rpc";
const STAGING_ROOT: &str = "/staging/root/";
const KUBELET: &str = "/kubelet";

struct Fixture {
    client: kube::Client,
    namespace: String,
    driver: RecordingDriver,
    sidecar: SidecarProcess,
    _pki: TestPki,
    channel: Channel,
    token: String,
}

/// `stages`: the driver advertises STAGE_UNSTAGE_VOLUME; `csi_address`: the sidecar is given
/// the driver's CSI socket (without it, upstream's computed staging path is always sent).
async fn fixture(stages: bool, csi_address: bool) -> Fixture {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "sidecar-rpc").await.unwrap();
    let driver = RecordingDriver::start(DRIVER, true, stages);
    let pod = sidecar_pod(&client, &namespace, NODE, Workload::DaemonSet, "csi-plugin").await;
    let (token, identity) = manager_token(&client).await;
    let pki = TestPki::new();
    let mut extra = vec![
        format!("--allowed-identities={identity}"),
        format!("-stagingpath={STAGING_ROOT}"),
        format!("--kubelet-dir={KUBELET}"),
    ];
    if csi_address {
        extra.push(format!("--csi-address={}", driver.endpoint()));
    }
    let sidecar = SidecarProcess::start(&pod, NODE, &driver.endpoint(), Serving::Tls(&pki), &extra);
    sidecar.wait_ready().await;
    sidecar.wait_leader(true).await;
    let channel = tls_channel(sidecar.port, &pki.ca_pem).await.unwrap();
    Fixture { client, namespace, driver, sidecar, _pki: pki, channel, token }
}

impl Fixture {
    /// A Secret in the test namespace; returns its name.
    async fn secret(&self, data: &[(&str, &str)]) -> String {
        let name = unique("secret");
        let data: BTreeMap<String, String> = data.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let secret: Secret = serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data})).unwrap();
        Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        name
    }

    /// A CSI PV bound to claim `claim` in the test namespace; returns (PV name, handle).
    async fn pv(&self, block: bool, stage_secret: Option<&str>, claim: &str) -> (String, String) {
        let name = unique("rpc-pv");
        let handle = format!("handle-{name}");
        let mut csi_source = json!({
            "driver": DRIVER,
            "volumeHandle": handle,
            "volumeAttributes": {"pool": "fast", "clusterID": "c1"},
        });
        if let Some(secret) = stage_secret {
            csi_source["nodeStageSecretRef"] = json!({"name": secret, "namespace": self.namespace});
        }
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": if block { "Block" } else { "Filesystem" },
                "csi": csi_source,
                "claimRef": {"namespace": self.namespace, "name": claim},
            }
        }))
        .unwrap();
        Api::<PersistentVolume>::all(self.client.clone()).create(&PostParams::default(), &pv).await.unwrap();
        (name, handle)
    }

    /// A Pod on this node that mounts `claim`; returns its UID.
    async fn pod_using(&self, claim: &str) -> String {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": unique("app")},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "app", "image": "app"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            }
        }))
        .unwrap();
        let pod = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        pod.metadata.uid.unwrap()
    }

    fn reclaim(&self) -> pb::reclaim_space_client::ReclaimSpaceClient<Channel> {
        pb::reclaim_space_client::ReclaimSpaceClient::new(self.channel.clone())
    }
}

fn secrets(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn attributes() -> HashMap<String, String> {
    secrets(&[("pool", "fast"), ("clusterID", "c1")])
}

fn sha256_hex(text: &str) -> String {
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn reclaim_space_maps_handles_secrets_and_paths() {
    let f = fixture(true, true).await;
    let secret = f.secret(&[("userID", "admin"), ("userKey", "s3cr3t")]).await;
    let (fs_pv, fs_handle) = f.pv(false, Some(&secret), "data").await;
    let pod_uid = f.pod_using("data").await;
    let (block_pv, block_handle) = f.pv(true, None, "raw").await;

    let answer = f
        .reclaim()
        .controller_reclaim_space(bearer(pb::ReclaimSpaceRequest { pv_name: fs_pv.clone() }, &f.token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.pre_usage.map(|u| u.usage_bytes), Some(100));
    assert_eq!(answer.post_usage.map(|u| u.usage_bytes), Some(40));
    let sent: reclaimspace::ControllerReclaimSpaceRequest = f.driver.last("controller_reclaim_space");
    assert_eq!(sent.volume_id, fs_handle);
    assert_eq!(sent.parameters, attributes());
    assert_eq!(sent.secrets, secrets(&[("userID", "admin"), ("userKey", "s3cr3t")]));

    // Filesystem: the kubelet's publish path of the Pod using the claim, and the staging path.
    f.reclaim().node_reclaim_space(bearer(pb::ReclaimSpaceRequest { pv_name: fs_pv.clone() }, &f.token)).await.unwrap();
    let sent: reclaimspace::NodeReclaimSpaceRequest = f.driver.last("node_reclaim_space");
    assert_eq!(sent.volume_id, fs_handle);
    assert_eq!(sent.volume_path, format!("{KUBELET}/pods/{pod_uid}/volumes/kubernetes.io~csi/{fs_pv}/mount"));
    assert_eq!(sent.staging_target_path, format!("/staging/root/{DRIVER}/{}/globalmount", sha256_hex(&fs_handle)));
    assert_eq!(sent.secrets.get("userKey").map(String::as_str), Some("s3cr3t"));
    let capability = sent.volume_capability.unwrap();
    assert!(matches!(capability.access_type, Some(csi::volume_capability::AccessType::Mount(_))));
    assert_eq!(
        capability.access_mode.unwrap().mode,
        csi::volume_capability::access_mode::Mode::SingleNodeMultiWriter as i32
    );

    // Block, used by no Pod here: no publish path (as upstream), the block staging path.
    f.reclaim()
        .node_reclaim_space(bearer(pb::ReclaimSpaceRequest { pv_name: block_pv.clone() }, &f.token))
        .await
        .unwrap();
    let sent: reclaimspace::NodeReclaimSpaceRequest = f.driver.last("node_reclaim_space");
    assert_eq!(sent.volume_id, block_handle);
    assert_eq!(sent.volume_path, "");
    assert_eq!(sent.staging_target_path, format!("/staging/root/volumeDevices/staging/{block_pv}"));
    assert!(matches!(sent.volume_capability.unwrap().access_type, Some(csi::volume_capability::AccessType::Block(_))));
    assert!(sent.secrets.is_empty());

    // References that cannot be resolved are the caller's error; the driver's codes pass through.
    let missing = f
        .reclaim()
        .controller_reclaim_space(bearer(pb::ReclaimSpaceRequest { pv_name: "no-such-pv".into() }, &f.token))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
    assert!(missing.message().contains("no-such-pv"), "{missing:?}");
    f.driver.fail("controller_reclaim_space", tonic::Status::resource_exhausted("the pool is busy"));
    let busy = f
        .reclaim()
        .controller_reclaim_space(bearer(pb::ReclaimSpaceRequest { pv_name: fs_pv }, &f.token))
        .await
        .unwrap_err();
    assert_eq!((busy.code(), busy.message()), (Code::ResourceExhausted, "the pool is busy"));
    // The Secret's data never reaches the log.
    assert!(!f.sidecar.log().contains("s3cr3t"));
}

#[tokio::test]
async fn the_staging_path_is_sent_only_where_the_driver_stages() {
    // The driver's CSI socket says it does not stage: no staging path.
    let f = fixture(false, true).await;
    let (pv, _) = f.pv(false, None, "data").await;
    f.reclaim().node_reclaim_space(bearer(pb::ReclaimSpaceRequest { pv_name: pv }, &f.token)).await.unwrap();
    let sent: reclaimspace::NodeReclaimSpaceRequest = f.driver.last("node_reclaim_space");
    assert_eq!(sent.staging_target_path, "");

    // Without --csi-address the sidecar cannot ask, and sends upstream's computed path.
    let f = fixture(false, false).await;
    let (pv, handle) = f.pv(false, None, "data").await;
    f.reclaim().node_reclaim_space(bearer(pb::ReclaimSpaceRequest { pv_name: pv }, &f.token)).await.unwrap();
    let sent: reclaimspace::NodeReclaimSpaceRequest = f.driver.last("node_reclaim_space");
    assert_eq!(sent.staging_target_path, format!("/staging/root/{DRIVER}/{}/globalmount", sha256_hex(&handle)));
}

/// A driver call that never answers holds up only itself: while the driver sits on a reclaim,
/// the same sidecar still carries other calls to it (key rotation, fencing), and the held call
/// answers once the driver does. Each other call is given 30 s, so a sidecar that queued calls
/// behind the hung one fails here instead of hanging the suite.
#[tokio::test]
async fn a_hung_driver_call_leaves_the_sidecars_other_calls_answering() {
    const HELD: &str = "controller_reclaim_space";
    let f = fixture(true, true).await;
    let secret = f.secret(&[("key", "fence-key")]).await;
    let (pv, _) = f.pv(false, Some(&secret), "data").await;
    f.driver.hold(HELD);
    let held = tokio::spawn({
        let (mut reclaim, request) = (f.reclaim(), bearer(pb::ReclaimSpaceRequest { pv_name: pv.clone() }, &f.token));
        async move { reclaim.controller_reclaim_space(request).await }
    });
    let reached = testenv::poll::until(MINUTE, async || (f.driver.in_flight(HELD) == 1).then_some(())).await;
    assert!(reached.is_some(), "the reclaim never reached the driver");

    let bound = Duration::from_secs(30);
    let mut rotation = pb::encryption_key_rotation_client::EncryptionKeyRotationClient::new(f.channel.clone());
    let rotate = rotation.encryption_key_rotate(bearer(pb::EncryptionKeyRotateRequest { pv_name: pv }, &f.token));
    let rotated = tokio::time::timeout(bound, rotate).await;
    assert!(matches!(rotated, Ok(Ok(_))), "key rotation while a reclaim hangs: {rotated:?}");
    let request = pb::NetworkFenceRequest {
        parameters: HashMap::new(),
        secret_name: secret,
        secret_namespace: f.namespace.clone(),
        cidrs: vec!["10.0.0.0/24".into()],
    };
    let mut fencing = pb::network_fence_client::NetworkFenceClient::new(f.channel.clone());
    let fence = fencing.fence_cluster_network(bearer(request, &f.token));
    let fenced = tokio::time::timeout(bound, fence).await;
    assert!(matches!(fenced, Ok(Ok(_))), "fencing while a reclaim hangs: {fenced:?}");
    assert_eq!(f.driver.in_flight(HELD), 1, "the reclaim still hangs in the driver");
    assert!(!held.is_finished(), "the reclaim answered while the driver held it");

    f.driver.release(HELD);
    let answer = held.await.unwrap().unwrap().into_inner();
    assert_eq!(answer.post_usage.map(|u| u.usage_bytes), Some(40));
    assert_eq!(f.driver.count(HELD), 1);
}

#[tokio::test]
async fn key_rotation_and_fencing_map_their_requests() {
    let f = fixture(true, true).await;
    let secret = f.secret(&[("key", "fence-key")]).await;
    let (pv, handle) = f.pv(false, Some(&secret), "data").await;

    pb::encryption_key_rotation_client::EncryptionKeyRotationClient::new(f.channel.clone())
        .encryption_key_rotate(bearer(pb::EncryptionKeyRotateRequest { pv_name: pv }, &f.token))
        .await
        .unwrap();
    let sent: ekr::EncryptionKeyRotateRequest = f.driver.last("encryption_key_rotate");
    assert_eq!((sent.volume_id.as_str(), &sent.parameters), (handle.as_str(), &attributes()));
    assert_eq!(sent.secrets, secrets(&[("key", "fence-key")]));
    // A complete capability (upstream sends one without an access type, invalid in CSI).
    let capability = sent.volume_capability.unwrap();
    assert!(matches!(capability.access_type, Some(csi::volume_capability::AccessType::Mount(_))));
    assert_ne!(capability.access_mode.unwrap().mode, 0);

    let mut fencing = pb::network_fence_client::NetworkFenceClient::new(f.channel.clone());
    let request = pb::NetworkFenceRequest {
        parameters: secrets(&[("clusterID", "c1")]),
        secret_name: secret.clone(),
        secret_namespace: f.namespace.clone(),
        cidrs: vec!["10.0.0.0/24".into(), "192.168.1.7/32".into()],
    };
    fencing.fence_cluster_network(bearer(request.clone(), &f.token)).await.unwrap();
    let sent: fence::FenceClusterNetworkRequest = f.driver.last("fence_cluster_network");
    assert_eq!(sent.parameters, secrets(&[("clusterID", "c1")]));
    assert_eq!(sent.secrets, secrets(&[("key", "fence-key")]));
    assert_eq!(sent.cidrs.iter().map(|c| c.cidr.as_str()).collect::<Vec<_>>(), ["10.0.0.0/24", "192.168.1.7/32"]);
    fencing.un_fence_cluster_network(bearer(request.clone(), &f.token)).await.unwrap();
    let sent: fence::UnfenceClusterNetworkRequest = f.driver.last("unfence_cluster_network");
    assert_eq!(sent.cidrs.len(), 2);

    let clients = fencing
        .get_fence_clients(bearer(
            pb::FenceClientsRequest {
                parameters: HashMap::new(),
                secret_name: secret,
                secret_namespace: f.namespace.clone(),
            },
            &f.token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(clients.clients, vec![pb::ClientDetails { id: "client-1".into(), cidrs: vec!["10.1.2.3/32".into()] }]);

    // A Secret that does not exist and an empty CIDR list are refused before the driver is called.
    let calls = f.driver.count("fence_cluster_network");
    let missing = fencing
        .fence_cluster_network(bearer(
            pb::NetworkFenceRequest { secret_name: "nope".into(), ..request.clone() },
            &f.token,
        ))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
    let empty = fencing
        .fence_cluster_network(bearer(pb::NetworkFenceRequest { cidrs: vec![], ..request }, &f.token))
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");
    assert_eq!(f.driver.count("fence_cluster_network"), calls);
}

#[tokio::test]
async fn replication_and_volume_groups_map_their_requests() {
    let f = fixture(true, true).await;
    let secret = f.secret(&[("replication", "r-key")]).await;
    let mut replication_client = pb::replication_client::ReplicationClient::new(f.channel.clone());
    let volume_source = Some(pb::ReplicationSource {
        r#type: Some(pb::replication_source::Type::Volume(pb::replication_source::VolumeSource {
            volume_id: "vol-1".into(),
        })),
    });
    let enable = pb::EnableVolumeReplicationRequest {
        replication_id: "rep-1".into(),
        parameters: secrets(&[("mirroringMode", "snapshot")]),
        secret_name: secret.clone(),
        secret_namespace: f.namespace.clone(),
        replication_source: volume_source.clone(),
    };
    replication_client.enable_volume_replication(bearer(enable.clone(), &f.token)).await.unwrap();
    let sent: replication::EnableVolumeReplicationRequest = f.driver.last("enable_volume_replication");
    assert_eq!(sent.replication_id, "rep-1");
    assert_eq!(sent.parameters, secrets(&[("mirroringMode", "snapshot")]));
    assert_eq!(sent.secrets, secrets(&[("replication", "r-key")]));
    assert!(matches!(
        sent.replication_source.and_then(|s| s.r#type),
        Some(replication::replication_source::Type::Volume(v)) if v.volume_id == "vol-1"
    ));

    let group_source = Some(pb::ReplicationSource {
        r#type: Some(pb::replication_source::Type::VolumeGroup(pb::replication_source::VolumeGroupSource {
            volume_group_id: "group-9".into(),
        })),
    });
    let promote = pb::PromoteVolumeRequest {
        replication_id: "rep-1".into(),
        force: true,
        secret_name: secret.clone(),
        secret_namespace: f.namespace.clone(),
        replication_source: group_source,
        ..Default::default()
    };
    replication_client.promote_volume(bearer(promote, &f.token)).await.unwrap();
    let sent: replication::PromoteVolumeRequest = f.driver.last("promote_volume");
    assert!(sent.force);
    assert!(matches!(
        sent.replication_source.and_then(|s| s.r#type),
        Some(replication::replication_source::Type::Volumegroup(g)) if g.volume_group_id == "group-9"
    ));
    let resync = pb::ResyncVolumeRequest {
        secret_name: secret.clone(),
        secret_namespace: f.namespace.clone(),
        replication_source: volume_source.clone(),
        ..Default::default()
    };
    assert!(replication_client.resync_volume(bearer(resync, &f.token)).await.unwrap().into_inner().ready);
    let info = pb::GetVolumeReplicationInfoRequest {
        secret_name: secret.clone(),
        secret_namespace: f.namespace.clone(),
        replication_source: volume_source.clone(),
        ..Default::default()
    };
    let info = replication_client.get_volume_replication_info(bearer(info, &f.token)).await.unwrap().into_inner();
    assert_eq!(info.last_sync_bytes, 4096);
    let destination = pb::GetReplicationDestinationInfoRequest {
        secret_name: secret.clone(),
        secret_namespace: f.namespace.clone(),
        replication_source: volume_source.clone(),
    };
    let destination =
        replication_client.get_replication_destination_info(bearer(destination, &f.token)).await.unwrap().into_inner();
    assert!(matches!(
        destination.replication_destination.and_then(|d| d.r#type),
        Some(pb::replication_destination::Type::Volume(v)) if v.volume_id == "remote-7"
    ));
    // Replication answers INTERNAL for a Secret it cannot read, as upstream.
    let unreadable = replication_client
        .enable_volume_replication(bearer(
            pb::EnableVolumeReplicationRequest { secret_name: "nope".into(), ..enable },
            &f.token,
        ))
        .await
        .unwrap_err();
    assert_eq!(unreadable.code(), Code::Internal, "{unreadable:?}");

    let mut groups = pb::volume_group_controller_client::VolumeGroupControllerClient::new(f.channel.clone());
    let created = groups
        .create_volume_group(bearer(
            pb::CreateVolumeGroupRequest {
                name: "group-a".into(),
                parameters: secrets(&[("pool", "fast")]),
                secret_name: secret.clone(),
                secret_namespace: f.namespace.clone(),
                volume_ids: vec!["vol-a".into()],
            },
            &f.token,
        ))
        .await
        .unwrap()
        .into_inner();
    let group = created.volume_group.unwrap();
    assert_eq!(
        (group.volume_group_id.as_str(), group.volume_ids.as_slice()),
        ("group-1", ["vol-a".to_owned()].as_slice())
    );
    let sent: volumegroup::CreateVolumeGroupRequest = f.driver.last("create_volume_group");
    assert_eq!((sent.name.as_str(), sent.volume_ids.as_slice()), ("group-a", ["vol-a".to_owned()].as_slice()));
    assert_eq!(sent.secrets, secrets(&[("replication", "r-key")]));
    groups
        .delete_volume_group(bearer(
            pb::DeleteVolumeGroupRequest {
                volume_group_id: "group-1".into(),
                secret_name: secret,
                secret_namespace: f.namespace.clone(),
            },
            &f.token,
        ))
        .await
        .unwrap();
    let sent: volumegroup::DeleteVolumeGroupRequest = f.driver.last("delete_volume_group");
    assert_eq!(sent.volume_group_id, "group-1");
}
