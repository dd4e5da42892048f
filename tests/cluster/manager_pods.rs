//! The manager as `deploy/controller/` installs it: admitted under Pod Security `restricted`, made
//! Ready by the kubelet's probes, holding its Lease, and serving /metrics over HTTPS through its
//! Service to tokens that may read them, and to no others.
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Config};
use serde_json::json;
use testenv::poll;

use crate::cluster::{self, MANAGER_NAMESPACE};

pub const SCRAPERS: &str = "metrics-scrapers";

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster"]
async fn the_manager_runs_restricted_ready_and_leading() {
    let client = cluster::client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let labels = namespaces.get(MANAGER_NAMESPACE).await.unwrap().metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("restricted"));

    // The namespace's policy is enforced: a privileged Pod is refused where the manager was admitted.
    let pods: Api<Pod> = Api::namespaced(client.clone(), MANAGER_NAMESPACE);
    let privileged: Pod = serde_json::from_value(json!({
        "metadata": {"name": "privileged"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36.0",
                                 "securityContext": {"privileged": true}}]}
    }))
    .unwrap();
    let refused = pods.create(&PostParams::default(), &privileged).await.unwrap_err().to_string();
    assert!(refused.contains("violates PodSecurity"), "{refused}");

    cluster::ready_leading_manager(&client, MANAGER_NAMESPACE).await;
}

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-cluster"]
async fn metrics_through_the_service_need_a_token_bound_to_metrics_reader() {
    let client = cluster::client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": SCRAPERS}})).unwrap())
        .await;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding = json!({
        "metadata": {"name": "test-metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "csi-addons-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": SCRAPERS}]
    });
    let _ = bindings.create(&PostParams::default(), &serde_json::from_value(binding).unwrap()).await;

    let reader = pod_token(&client, "reader").await;
    let stranger = pod_token(&client, "stranger").await;
    let services: Api<Service> = Api::namespaced(client.clone(), MANAGER_NAMESPACE);
    let service = services.get("csi-addons-controller-manager-metrics-service").await.unwrap();
    let ip = service.spec.and_then(|s| s.cluster_ip).unwrap();
    let url = format!("https://{ip}:8443");

    let (status, body) = poll::until(poll::MINUTE, async || match scrape(&url, &reader).await {
        Ok(body) => Some((200, body)),
        Err(_) => None,
    })
    .await
    .expect("the reader's token gets the metrics through the Service");
    assert_eq!(status, 200);
    assert!(body.contains("controller_runtime_reconcile_total"), "{}", &body[..body.len().min(500)]);
    match scrape(&url, &stranger).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("a token without metrics-reader is refused with 403, not {other:?}"),
    }
    let _ = bindings.delete("test-metrics-reader", &DeleteParams::default()).await;
}

/// The token the kubelet would mount in a Pod of ServiceAccount `account`: a Pod of it runs, and
/// the token is requested bound to that Pod.
pub async fn pod_token(client: &Client, account: &str) -> String {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = json!({"metadata": {"name": SCRAPERS}});
    let _ = namespaces.create(&PostParams::default(), &serde_json::from_value(namespace).unwrap()).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), SCRAPERS);
    let _ = accounts
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": account}})).unwrap())
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), SCRAPERS);
    let pod = json!({
        "metadata": {"name": account},
        "spec": {"serviceAccountName": account, "containers": [{"name": "c", "image": "busybox:1.36.0",
                 "command": ["/bin/sleep", "3600"]}]}
    });
    let _ = pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await;
    let uid = poll::until(cluster::POD_START, async || {
        let pod = pods.get(account).await.ok()?;
        cluster::ready(&pod).then(|| pod.metadata.uid.clone()).flatten()
    })
    .await
    .expect("the scraper Pod runs");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(account.into()),
                uid: Some(uid),
            }),
            expiration_seconds: Some(600),
        },
        ..Default::default()
    };
    let issued = accounts.create_token_request(account, &PostParams::default(), &request).await.unwrap();
    issued.status.unwrap().token
}

/// GET /metrics at `url` with `token`, the serving certificate not verified (the manager makes its
/// own when none is given, as upstream's does).
pub async fn scrape(url: &str, token: &str) -> Result<String, kube::Error> {
    let mut config = Config::new(url.parse().unwrap());
    config.auth_info.token = Some(token.to_owned().into());
    config.accept_invalid_certs = true;
    let client = Client::try_from(config)?;
    client.request_text(http::Request::get("/metrics").body(Vec::new()).unwrap()).await
}
