//! Dynamic access to the project's kinds by name, from the CRDs it generates.
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
