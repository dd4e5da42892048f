//! Small helpers any layer of the manager may use, the sidecar connections and events included: a
//! leaf, importing nothing of the crate, so no arrow runs from them back up into `core`.
use std::sync::Mutex;

use kube::Api;
use serde::de::DeserializeOwned;

/// The locked value, even if a panic elsewhere poisoned the lock (the maps stay consistent:
/// every update is a single insert or remove).
pub fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
