//! A finalizer on or off, as both operators hold their objects until they have cleaned up.
use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};

/// Adds (`present`) or removes `finalizer` on `object`, a no-op when it is already so. The patch
/// carries the object's resourceVersion, so it is a compare-and-swap: a concurrent change of the
/// list fails it with a conflict, and the caller's pass is retried with the object read anew. An
/// object already gone needs no finalizer removed.
pub async fn set_finalizer<K>(
    client: &kube::Client,
    object: &K,
    finalizer: &str,
    present: bool,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    let finalizers = object.finalizers();
    if finalizers.iter().any(|f| f == finalizer) == present {
        return Ok(());
    }
    let mut next: Vec<String> = finalizers.iter().filter(|f| *f != finalizer).cloned().collect();
    if present {
        next.push(finalizer.to_owned());
    }
    let patch = serde_json::json!({"metadata": {"finalizers": next, "resourceVersion": object.resource_version()}});
    let written = crate::api_of(client, object)
        .patch(&object.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ());
    match written {
        Err(kube::Error::Api(s)) if s.code == 404 && !present => Ok(()),
        other => other,
    }
}
