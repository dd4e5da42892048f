//! Writes of an object's metadata: a finalizer on or off, and merge patches.
use kube::Resource;

use super::Core;

/// Adds or removes `finalizer` on `object` (a no-op when already so), as a compare-and-swap: a
/// concurrent change fails the patch and the pass is retried.
pub async fn set_finalizer<K>(core: &Core, object: &K, finalizer: &str, present: bool) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    runtime_support::finalizer::set_finalizer(&core.client, object, finalizer, present).await
}

/// A JSON merge patch of `object`.
async fn merge_patch<K>(core: &Core, object: &K, patch: &serde_json::Value) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    use kube::ResourceExt;
    let params = kube::api::PatchParams::default();
    core.api_of(object).patch(&object.name_any(), &params, &kube::api::Patch::Merge(patch)).await.map(|_| ())
}

/// A JSON merge patch of `object`; an object already gone is fine.
pub async fn patch_merge<K>(core: &Core, object: &K, patch: &serde_json::Value) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    match merge_patch(core, object, patch).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    }
}
