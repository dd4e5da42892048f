//! Helpers shared by the suites: dynamic access to our kinds by name.
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

/// The CRD of `kind`, as the project generates it.
pub fn crd(kind: &str) -> CustomResourceDefinition {
    api::crds::all().into_iter().find(|c| c.spec.names.kind == kind).unwrap_or_else(|| panic!("no CRD for kind {kind}"))
}

pub fn is_namespaced(kind: &str) -> bool {
    crd(kind).spec.scope == "Namespaced"
}

pub fn api_resource(kind: &str) -> ApiResource {
    let crd = crd(kind);
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &crd.spec.versions[0].name, kind);
    ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural)
}

/// The Api for `kind`, in `namespace` when the kind is namespaced.
pub fn dynamic_api(client: &Client, kind: &str, namespace: &str) -> Api<DynamicObject> {
    let ar = api_resource(kind);
    if is_namespaced(kind) {
        Api::namespaced_with(client.clone(), namespace, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    }
}

/// An object of `kind` named `name` with the given spec, ready to create.
pub fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    let mut obj = DynamicObject::new(name, &api_resource(kind));
    obj.data = serde_json::json!({ "spec": spec });
    obj
}

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

/// A Go-built test peer: `$ENV` if set, else what `hack/<script>` builds and prints.
pub fn test_peer(env: &str, script: &str) -> std::path::PathBuf {
    test_peer_with(env, script, &[])
}

/// As [`test_peer`], `hack/<script>` given `args`.
pub fn test_peer_with(env: &str, script: &str, args: &[&str]) -> std::path::PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return path.into();
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack").join(script);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{} {args:?} failed", script.display());
    String::from_utf8(out.stdout).unwrap().trim().into()
}

/// A gRPC channel over the Unix socket of `endpoint` (`unix:///path`); tonic dials `unix:` URIs.
pub async fn unix_channel(endpoint: &str) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(endpoint.to_owned())?.connect().await
}
