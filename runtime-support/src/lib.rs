//! What the workspace's binaries share at run time, each taking what it needs: logging and the one
//! shutdown signal (every binary), and, for the two operators, conditions that keep their transition
//! time, the finalizer helper and status written by server-side apply. The CRD types and the
//! protocol code are the `api` crate's; nothing here is a type of the API.

#![forbid(unsafe_code)]

pub mod conditions;
pub mod finalizer;
pub mod logging;
pub mod shutdown;
pub mod status;

use kube::api::{Api, ApiResource, DynamicObject};
use kube::{Resource, ResourceExt};

/// The API of `object`'s kind, in its namespace when it has one.
pub fn api_of<K: Resource<DynamicType = ()>>(client: &kube::Client, object: &K) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<K>(&());
    match object.namespace() {
        Some(namespace) => Api::namespaced_with(client.clone(), &namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}
