//! The `csi-addons` CLI as a real process against the reference driver, with PVs and Secrets in
//! the real API server: one test per operation family, plus bad arguments and no cluster.
use std::collections::BTreeMap;
use std::process::{Command, Output};

use api::proto::fence;
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::Value;

use crate::harness::driver::{Harness, MIB};
use crate::harness::support::{unique, workspace_binary};

fn cli(h: &Harness, kubeconfig: &std::path::Path, args: &[&str]) -> Output {
    Command::new(workspace_binary("csi-addons"))
        .arg(format!("-endpoint={}", h.driver.addons_endpoint))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

fn json(output: &Output) -> Value {
    assert!(output.status.success(), "csi-addons failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A PV in the API server for the driver volume `handle`.
async fn pv_for(client: &kube::Client, handle: &str) -> String {
    let name = unique("cli-pv");
    let pv = PersistentVolume {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_owned(), Quantity("16Mi".into()))])),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            csi: Some(CSIPersistentVolumeSource {
                driver: "reference.csi-addons-rs.io".into(),
                volume_handle: handle.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();
    name
}

#[tokio::test]
async fn identity_operations() {
    let h = Harness::start().await;
    let kubeconfig = testenv::shared().kubeconfig_path();
    let text = cli(&h, kubeconfig, &["-operation=GetIdentity"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("name: reference.csi-addons-rs.io"), "{text:?}");
    let caps = json(&cli(&h, kubeconfig, &["-operation", "GetCapabilities", "--output", "json"]));
    let caps: Vec<&str> = caps["capabilities"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    for wanted in [
        "service.CONTROLLER_SERVICE",
        "reclaim_space.OFFLINE",
        "network_fence.GET_CLIENTS_TO_FENCE",
        "volume_replication.VOLUME_REPLICATION",
    ] {
        assert!(caps.contains(&wanted), "{wanted} not in {caps:?}");
    }
    assert_eq!(json(&cli(&h, kubeconfig, &["-operation=Probe", "-output=json"]))["ready"], Value::Bool(true));
}

#[tokio::test]
async fn volume_operations_resolve_the_pv() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let h = Harness::start().await;
    let id = h.create("cli-volume", 16 * MIB).await;
    let pv = pv_for(&client, &id).await;

    let reclaimed = json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=ControllerReclaimSpace", "-persistentvolume", &pv, "-output=json"],
    ));
    assert!(reclaimed["preUsageBytes"].is_i64() && reclaimed["postUsageBytes"].is_i64(), "{reclaimed}");

    let key = || {
        let state: Value = serde_json::from_slice(&std::fs::read(h.path("state").join("state.json")).unwrap()).unwrap();
        state["volumes"][&id]["key_id"].clone()
    };
    json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=EncryptionKeyRotation", &format!("-persistentvolume={pv}"), "-output=json"],
    ));
    let first = key();
    assert!(first.is_string());
    json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=EncryptionKeyRotation", &format!("-persistentvolume={pv}"), "-output=json"],
    ));
    assert_ne!(key(), first);

    json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=EnableVolumeReplication", &format!("-persistentvolume={pv}"), "-output=json"],
    ));
    let info = json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=GetVolumeReplicationInfo", &format!("-persistentvolume={pv}"), "-output=json"],
    ));
    assert_eq!(info["status"], "HEALTHY", "{info}");
    json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=DisableVolumeReplication", &format!("-persistentvolume={pv}"), "-output=json"],
    ));
}

#[tokio::test]
async fn fence_and_group_operations_read_the_secret() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "cli").await.unwrap();
    let secret = Secret {
        metadata: ObjectMeta { name: Some("fence-secret".into()), ..Default::default() },
        string_data: Some(BTreeMap::from([("userKey".to_owned(), "k".to_owned())])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), &ns).create(&PostParams::default(), &secret).await.unwrap();
    let h = Harness::start().await;
    let secret_flag = format!("-secret={ns}/fence-secret");

    json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=NetworkFence", &secret_flag, "-cidrs=10.9.8.0/24", "-clusterid=c1", "-output=json"],
    ));
    let mut fences = fence::fence_controller_client::FenceControllerClient::new(h.addons.clone());
    let listed = fences.list_cluster_fence(fence::ListClusterFenceRequest::default()).await.unwrap().into_inner().cidrs;
    assert_eq!(listed, vec![fence::Cidr { cidr: "10.9.8.0/24".into() }]);
    json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=NetworkUnFence", &secret_flag, "-cidrs=10.9.8.0/24", "-output=json"],
    ));
    assert!(
        fences
            .list_cluster_fence(fence::ListClusterFenceRequest::default())
            .await
            .unwrap()
            .into_inner()
            .cidrs
            .is_empty()
    );

    let (a, b) = (h.create("cli-g-a", MIB).await, h.create("cli-g-b", MIB).await);
    let created = json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=CreateVolumeGroup", "-volumegroupname=g1", &format!("-volumeids={a},{b}"), "-output=json"],
    ));
    let group_id = created["volumeGroupId"].as_str().unwrap().to_owned();
    assert_eq!(created["volumeIds"].as_array().unwrap().len(), 2);
    json(&cli(
        &h,
        cp.kubeconfig_path(),
        &[
            "-operation=ModifyVolumeGroupMembership",
            &format!("-volumegroupid={group_id}"),
            "-volumeids",
            &a,
            "-output=json",
        ],
    ));
    let got = json(&cli(
        &h,
        cp.kubeconfig_path(),
        &["-operation=ControllerGetVolumeGroup", &format!("-volumegroupid={group_id}"), "-output=json"],
    ));
    assert_eq!(got["volumeIds"], serde_json::json!([a]));
}

#[tokio::test]
async fn bad_arguments_and_a_missing_cluster_are_clear_errors() {
    let h = Harness::start().await;
    let kubeconfig = testenv::shared().kubeconfig_path();
    let missing_pv = cli(&h, kubeconfig, &["-operation=ControllerReclaimSpace"]);
    assert!(!missing_pv.status.success());
    assert!(
        String::from_utf8_lossy(&missing_pv.stderr)
            .contains("-persistentvolume is required for ControllerReclaimSpace"),
        "{missing_pv:?}"
    );

    let unknown = cli(&h, kubeconfig, &["-operation=Reclaim"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("invalid value 'Reclaim'"), "{unknown:?}");

    let no_cluster = cli(
        &h,
        std::path::Path::new("/nonexistent/kubeconfig"),
        &["-operation=ControllerReclaimSpace", "-persistentvolume=pv-1"],
    );
    let stderr = String::from_utf8_lossy(&no_cluster.stderr);
    assert!(!no_cluster.status.success());
    assert!(stderr.contains("no cluster is configured") && !stderr.contains("panicked"), "{stderr}");

    let driver_error = cli(&h, kubeconfig, &["-operation=DeleteVolumeGroup", "-volumegroupid=../x"]);
    assert!(driver_error.status.success(), "deleting a group that does not exist is OK: {driver_error:?}");
}
