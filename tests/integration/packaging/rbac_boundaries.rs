//! What the shipped RBAC does not allow, asked of the API server's own authorizer with
//! SubjectAccessReviews. The manager's ServiceAccount, bound as config/rbac ships it, cannot read
//! Secrets, nor write Pods or Nodes: a sidecar resolves the Secrets a class names, with its own
//! rights. The driver operator's reads Secrets of its own namespace only, where the user keeps the
//! credentials it copies. Each account is also asked for a rule it needs, so a review that
//! allowed nothing would fail here.
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use serde::Deserialize;

use crate::harness::manager::ManagerIdentity;

/// Whether ServiceAccount `account` of `namespace` may `verb` the `resource` of `group` (in
/// `scope`, or cluster-wide).
async fn allowed(
    client: &kube::Client,
    (namespace, account): (&str, &str),
    verb: &str,
    (group, resource): (&str, &str),
    scope: Option<&str>,
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{namespace}:{account}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                namespace: scope.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone()).create(&PostParams::default(), &review).await;
    answer.unwrap().status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn the_managers_account_reads_no_secret_and_writes_no_pod_or_node() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "rbac-manager").await.unwrap();
    let _identity = ManagerIdentity::new(&client, &namespace).await;
    let manager = (namespace.as_str(), "csi-addons-controller-manager");
    let nodes = ("csiaddons.openshift.io", "csiaddonsnodes");
    assert!(allowed(&client, manager, "watch", nodes, None).await, "the manager watches CSIAddonsNodes");
    for (verb, resource, scope) in [
        ("get", "secrets", Some("default")),
        ("list", "secrets", None),
        ("watch", "secrets", Some(namespace.as_str())),
        ("create", "pods", Some("default")),
        ("patch", "pods", Some("default")),
        ("delete", "pods", Some("default")),
        ("create", "nodes", None),
        ("patch", "nodes", None),
        ("update", "nodes", None),
        ("delete", "nodes", None),
    ] {
        assert!(!allowed(&client, manager, verb, ("", resource), scope).await, "the manager may {verb} {resource}");
    }
}

#[tokio::test]
async fn the_driver_operators_account_reads_secrets_of_its_own_namespace_only() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "rbac-driver-operator").await.unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../driver-operator/config/rbac/role.yaml");
    let documents: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&std::fs::read_to_string(path).unwrap())
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .collect();
    let find = |kind: &str, name: &str| {
        documents.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name).cloned().unwrap()
    };
    let role = find("ClusterRole", "reference-driver-operator");
    let credentials = find("Role", "reference-driver-operator-credentials");
    let account = "reference-driver-operator";
    let _identity = ManagerIdentity::with_roles(&client, &namespace, account, role, (&namespace, credentials)).await;
    let operator = (namespace.as_str(), account);
    for verb in ["get", "list", "watch"] {
        let own = allowed(&client, operator, verb, ("", "secrets"), Some(&namespace)).await;
        assert!(own, "the operator may not {verb} Secrets in its namespace, where the credentials are");
    }
    for (verb, resource, scope) in [
        ("get", "secrets", Some("kube-system")),
        ("list", "secrets", None),
        ("watch", "secrets", Some("default")),
        ("create", "pods", Some("default")),
        ("patch", "nodes", None),
    ] {
        assert!(!allowed(&client, operator, verb, ("", resource), scope).await, "the operator may {verb} {resource}");
    }
}
