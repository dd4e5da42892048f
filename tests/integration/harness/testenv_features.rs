//! What the test control plane hands out, used as later suites will use it.
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, Namespace, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::await_condition;

use crate::harness::support::unique;

#[tokio::test]
async fn service_account_tokens_authenticate_as_that_account() {
    let cp = testenv::shared();
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, "tokens").await.unwrap();
    let token = cp.token(&admin, &ns, "csi-addons-sidecar").await.unwrap();

    let review = TokenReview {
        spec: TokenReviewSpec { token: Some(token.clone()), ..Default::default() },
        ..Default::default()
    };
    let reviewed = Api::<TokenReview>::all(admin.clone()).create(&PostParams::default(), &review).await.unwrap();
    let status = reviewed.status.unwrap();
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(status.user.unwrap().username.unwrap(), format!("system:serviceaccount:{ns}:csi-addons-sidecar"));

    // The token works as a client credential too, with that account's (empty) rights.
    let mut config = cp.config().await.unwrap();
    config.auth_info = kube::config::AuthInfo { token: Some(token.into()), ..Default::default() };
    let as_account = kube::Client::try_from(config).unwrap();
    let denied = Api::<Namespace>::all(as_account).list(&Default::default()).await;
    assert!(matches!(denied, Err(kube::Error::Api(ref s)) if s.code == 403), "{denied:?}");

    // A second request for the same account reuses it.
    assert!(!cp.token(&admin, &ns, "csi-addons-sidecar").await.unwrap().is_empty());
}

#[tokio::test]
async fn the_kubeconfig_file_reaches_the_server_as_admin() {
    let cp = testenv::shared();
    let kubeconfig = Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
    assert_eq!(config.cluster_url.to_string().trim_end_matches('/'), cp.server_url());
    let client = kube::Client::try_from(config).unwrap();
    let names: Vec<String> = Api::<Namespace>::all(client)
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&"default".to_owned()), "{names:?}");
}

#[tokio::test]
async fn controller_manager_binds_a_pre_created_volume_to_its_claim() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "binder").await.unwrap();
    cp.ensure_controller_manager(&["persistentvolume-binder"]).unwrap();

    let pv_name = unique("pv");
    let size = BTreeMap::from([("storage".to_owned(), Quantity("1Gi".into()))]);
    let pv = PersistentVolume {
        metadata: ObjectMeta { name: Some(pv_name.clone()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(size.clone()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            host_path: Some(HostPathVolumeSource { path: "/tmp/testenv-pv".into(), ..Default::default() }),
            claim_ref: Some(ObjectReference {
                namespace: Some(ns.clone()),
                name: Some("data".into()),
                ..Default::default()
            }),
            storage_class_name: Some(String::new()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();
    let pvc = PersistentVolumeClaim {
        metadata: ObjectMeta { name: Some("data".into()), ..Default::default() },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements { requests: Some(size), ..Default::default() }),
            storage_class_name: Some(String::new()),
            volume_name: Some(pv_name.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(client, &ns);
    claims.create(&PostParams::default(), &pvc).await.unwrap();

    let bound = |pvc: Option<&PersistentVolumeClaim>| {
        pvc.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Bound")
    };
    let waited = tokio::time::timeout(Duration::from_secs(60), await_condition(claims.clone(), "data", bound)).await;
    let pvc = claims.get("data").await.unwrap();
    assert!(matches!(waited, Ok(Ok(_))), "the claim did not bind: {:?}", pvc.status);
    assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some(pv_name.as_str()));
}
