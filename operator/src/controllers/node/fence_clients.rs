//! The `networkFenceClientStatus` of a CSIAddonsNode: for each NetworkFenceClass its annotation
//! names, the clients the driver reports through GetFenceClients (when its sidecar offers that).
use std::time::Duration;

use api::csiaddons::{CSIAddonsNode, ClientDetail, NetworkFenceClass, NetworkFenceClientStatus};
use api::proto::internal::FenceClientsRequest;
use api::proto::internal::network_fence_client::NetworkFenceClient;
use kube::{Api, ResourceExt};

use crate::controllers::network_fence_class::decide::{
    CLASS_NAMES_ANNOTATION, ClassParameterError, GET_CLIENTS_TO_FENCE, class_names, class_parameters,
};
use crate::core::Core;
use crate::sidecars::client::with_timeout;
use crate::sidecars::pool::Connection;

/// Upstream sets none; a driver that never answers must not hold the reconciler forever.
/// [differs: fence-clients-timeout]
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the fence clients could not be listed, naming the class.
#[derive(Debug, thiserror::Error)]
pub enum FenceClientsError {
    #[error("reading NetworkFenceClass {class}: {source}")]
    ReadClass {
        class: String,
        #[source]
        source: kube::Error,
    },
    #[error("NetworkFenceClass {class}: {source}")]
    InvalidClass {
        class: String,
        #[source]
        source: ClassParameterError,
    },
    #[error("GetFenceClients for NetworkFenceClass {class} through {sidecar}: {code:?}: {message}")]
    Call { class: String, sidecar: String, code: tonic::Code, message: String },
}

/// The fence clients per named class, sorted by class. Classes that no longer exist are left
/// out, so a deleted class's entry goes from `networkFenceClientStatus`.
/// [differs: fence-class-cleanup]
pub async fn list(
    ctx: &Core,
    node: &CSIAddonsNode,
    connection: &Connection,
) -> Result<Vec<NetworkFenceClientStatus>, FenceClientsError> {
    if !connection.offers(GET_CLIENTS_TO_FENCE) {
        return Ok(Vec::new());
    }
    let mut names = class_names(node.annotations().get(CLASS_NAMES_ANNOTATION).map(String::as_str));
    names.sort();
    names.dedup();
    let classes = Api::<NetworkFenceClass>::all(ctx.client.clone());
    let mut out = Vec::new();
    for name in names {
        let class = match classes.get_opt(&name).await {
            Ok(Some(class)) => class,
            Ok(None) => continue,
            Err(source) => return Err(FenceClientsError::ReadClass { class: name, source }),
        };
        let parameters = match class_parameters(class.spec.parameters.as_ref()) {
            Ok(parameters) => parameters,
            Err(source) => return Err(FenceClientsError::InvalidClass { class: name, source }),
        };
        let (secret_name, secret_namespace) = parameters.secret.unwrap_or_default();
        let message = FenceClientsRequest {
            parameters: parameters.parameters.into_iter().collect(),
            secret_name,
            secret_namespace,
        };
        let request = with_timeout(message, CALL_TIMEOUT);
        let mut client = NetworkFenceClient::new(connection.channel.clone());
        let answer = ctx.metrics.timed_rpc("NetworkFence/GetFenceClients", client.get_fence_clients(request)).await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(s) => {
                let (code, message) = (s.code(), s.message().to_owned());
                return Err(FenceClientsError::Call { class: name, sidecar: connection.key(), code, message });
            }
        };
        let client_details =
            answer.into_inner().clients.into_iter().map(|c| ClientDetail { id: c.id, cidrs: c.cidrs }).collect();
        out.push(NetworkFenceClientStatus { network_fence_class_name: name, client_details });
    }
    Ok(out)
}
