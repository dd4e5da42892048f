//! Why a pass of the driver set controller failed, and the helper that names an API call's failure.
use crate::{assets, certificates};

/// Why a pass failed. `Assets` is a broken build and `Certificates` a clock out of range: not
/// retried soon. The rest are the API server's answers, retried.
#[derive(Debug, thiserror::Error)]
pub enum DriverSetError {
    #[error(transparent)]
    Assets(#[from] assets::AssetError),
    #[error(transparent)]
    Certificates(#[from] certificates::CertError),
    #[error("{action} {kind} {name}: {source}")]
    Api {
        action: &'static str,
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

pub(crate) fn api_error(action: &'static str, kind: &str, name: &str) -> impl FnOnce(kube::Error) -> DriverSetError {
    let (kind, name) = (kind.to_owned(), name.to_owned());
    move |source| DriverSetError::Api { action, kind, name, source }
}
