//! `proto.NetworkFence`: parameters and CIDRs as given, the Secret read by reference.
use std::sync::Arc;

use api::proto::{fence as driver, internal as pb};
use tonic::{Code, Request, Response, Status};

use super::backend::Backend;

pub struct Fence(pub Arc<Backend>);

impl Fence {
    fn client(&self) -> driver::fence_controller_client::FenceControllerClient<tonic::transport::Channel> {
        driver::fence_controller_client::FenceControllerClient::new(self.0.driver.clone())
    }
}

fn cidrs(list: Vec<String>) -> Result<Vec<driver::Cidr>, Status> {
    if list.is_empty() {
        return Err(Status::invalid_argument("at least one CIDR is required"));
    }
    Ok(list.into_iter().map(|cidr| driver::Cidr { cidr }).collect())
}

#[tonic::async_trait]
impl pb::network_fence_server::NetworkFence for Fence {
    async fn fence_cluster_network(
        &self,
        request: Request<pb::NetworkFenceRequest>,
    ) -> Result<Response<pb::NetworkFenceResponse>, Status> {
        self.0.leadership.require()?;
        let r = request.into_inner();
        let request = driver::FenceClusterNetworkRequest {
            parameters: r.parameters,
            secrets: self.0.secret(&r.secret_namespace, &r.secret_name, Code::InvalidArgument).await?,
            cidrs: cidrs(r.cidrs)?,
        };
        let result = self.client().fence_cluster_network(request).await;
        self.0.driver_result("FenceClusterNetwork", result)?;
        Ok(Response::new(pb::NetworkFenceResponse {}))
    }

    async fn un_fence_cluster_network(
        &self,
        request: Request<pb::NetworkFenceRequest>,
    ) -> Result<Response<pb::NetworkFenceResponse>, Status> {
        self.0.leadership.require()?;
        let r = request.into_inner();
        let request = driver::UnfenceClusterNetworkRequest {
            parameters: r.parameters,
            secrets: self.0.secret(&r.secret_namespace, &r.secret_name, Code::InvalidArgument).await?,
            cidrs: cidrs(r.cidrs)?,
        };
        let result = self.client().unfence_cluster_network(request).await;
        self.0.driver_result("UnfenceClusterNetwork", result)?;
        Ok(Response::new(pb::NetworkFenceResponse {}))
    }

    async fn get_fence_clients(
        &self,
        request: Request<pb::FenceClientsRequest>,
    ) -> Result<Response<pb::FenceClientsResponse>, Status> {
        let r = request.into_inner();
        let request = driver::GetFenceClientsRequest {
            parameters: r.parameters,
            secrets: self.0.secret(&r.secret_namespace, &r.secret_name, Code::InvalidArgument).await?,
        };
        let result = self.client().get_fence_clients(request).await;
        let clients = self.0.driver_result("GetFenceClients", result)?.clients;
        Ok(Response::new(pb::FenceClientsResponse {
            clients: clients
                .into_iter()
                .map(|c| pb::ClientDetails { id: c.id, cidrs: c.addresses.into_iter().map(|a| a.cidr).collect() })
                .collect(),
        }))
    }
}
