//! Helpers shared by the suites: dynamic access to our kinds by name (from testenv), test peers, names.

use kube::Api;
use kube::api::PostParams;
use serde_json::json;

pub use testenv::kinds::{api_resource, dynamic_api, is_namespaced, object};

/// A name no other test uses, for cluster-scoped objects in the shared control plane.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The message of an API call that failed with 422 Invalid, or what happened instead.
pub fn invalid_message<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Result<String, String> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 => Ok(status.message),
        other => Err(format!("expected 422 Invalid, got {other:?}")),
    }
}

/// A binary of this workspace (built by `make test` before the suites run), next to this test
/// binary's `deps/` directory.
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(std::path::Path::parent).unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo build --workspace --bins`, as `make test` does)",
        path.display()
    );
    path
}

pub use integration_tests::{test_peer, test_peer_with};

/// A gRPC channel over the Unix socket of `endpoint` (`unix:///path`); tonic dials `unix:` URIs.
pub async fn unix_channel(endpoint: &str) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(endpoint.to_owned())?.connect().await
}

/// Creates a job of `kind` (`ReclaimSpaceJob`, `EncryptionKeyRotationJob`) with `spec`.
pub async fn create_job(client: &kube::Client, namespace: &str, kind: &str, name: &str, spec: serde_json::Value) {
    let api = dynamic(client, namespace, kind);
    let object: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// The namespaced Api of a csiaddons.openshift.io/v1alpha1 kind.
pub fn dynamic(client: &kube::Client, namespace: &str, kind: &str) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("csiaddons.openshift.io", "v1alpha1", kind);
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase()));
    Api::namespaced_with(client.clone(), namespace, &resource)
}
