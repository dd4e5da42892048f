//! Reads from the API server's watch cache.
use kube::Api;
use serde::de::DeserializeOwned;

/// `name` as the API server's watch cache has it (resourceVersion "0", what an informer would
/// show): no etcd round trip, which per-job reads would otherwise cost at every job. A read a
/// moment stale is retried like any other transient state. None when it does not exist.
pub async fn read_cached<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.get_with(name, &kube::api::GetParams::any()).await {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}
