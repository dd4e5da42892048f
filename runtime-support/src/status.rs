//! Status written by server-side apply, by one field manager per program: the fields it sets are
//! its own, a field it leaves out is removed, and another writer's fields stay.
use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};

/// Applies `status` as the whole status `field_manager` owns on `object`. Unset fields (an explicit
/// null is not a value to apply) are left out.
pub async fn apply_status<K>(
    client: &kube::Client,
    object: &K,
    field_manager: &str,
    status: serde_json::Value,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    let status = match status {
        serde_json::Value::Object(fields) => {
            serde_json::Value::Object(fields.into_iter().filter(|(_, v)| !v.is_null()).collect())
        }
        other => other,
    };
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    crate::api_of(client, object)
        .patch_status(&object.name_any(), &PatchParams::apply(field_manager).force(), &Patch::Apply(&patch))
        .await
        .map(|_| ())
}
