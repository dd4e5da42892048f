//! The `networkFenceClientStatus` of a CSIAddonsNode: for each NetworkFenceClass its annotation
//! names, the clients the driver reports through GetFenceClients (when its sidecar offers that).
use std::time::Duration;

use api::csiaddons::{CSIAddonsNode, ClientDetail, NetworkFenceClass, NetworkFenceClientStatus};
use api::proto::internal::FenceClientsRequest;
use api::proto::internal::network_fence_client::NetworkFenceClient;
use kube::{Api, ResourceExt};

use crate::context::Context;
use crate::fencing::{self, CLASS_NAMES_ANNOTATION, GET_CLIENTS_TO_FENCE};
use crate::pool::Connection;
use crate::sidecar_client::with_timeout;

/// Upstream sets none; a driver that never answers must not hold the reconciler forever.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The fence clients per named class, sorted by class; an error names the class and the cause.
/// Classes that no longer exist are left out.
pub async fn list(
    ctx: &Context,
    node: &CSIAddonsNode,
    connection: &Connection,
) -> Result<Vec<NetworkFenceClientStatus>, String> {
    if !connection.offers(GET_CLIENTS_TO_FENCE) {
        return Ok(Vec::new());
    }
    let mut names = fencing::class_names(node.annotations().get(CLASS_NAMES_ANNOTATION).map(String::as_str));
    names.sort();
    names.dedup();
    let classes = Api::<NetworkFenceClass>::all(ctx.client.clone());
    let mut out = Vec::new();
    for name in names {
        let class = match classes.get_opt(&name).await {
            Ok(Some(class)) => class,
            Ok(None) => continue,
            Err(e) => return Err(format!("reading NetworkFenceClass {name}: {e}")),
        };
        let parameters = fencing::class_parameters(class.spec.parameters.as_ref())
            .map_err(|why| format!("NetworkFenceClass {name}: {why}"))?;
        let (secret_name, secret_namespace) = parameters.secret.unwrap_or_default();
        let message = FenceClientsRequest {
            parameters: parameters.parameters.into_iter().collect(),
            secret_name,
            secret_namespace,
        };
        let request = with_timeout(message, CALL_TIMEOUT);
        let mut client = NetworkFenceClient::new(connection.channel.clone());
        let answer = ctx.metrics.timed_rpc("NetworkFence/GetFenceClients", client.get_fence_clients(request)).await;
        let answer = answer.map_err(|s| {
            format!(
                "GetFenceClients for NetworkFenceClass {name} through {}: {:?}: {}",
                connection.key(),
                s.code(),
                s.message()
            )
        })?;
        let client_details =
            answer.into_inner().clients.into_iter().map(|c| ClientDetail { id: c.id, cidrs: c.cidrs }).collect();
        out.push(NetworkFenceClientStatus { network_fence_class_name: name, client_details });
    }
    Ok(out)
}
