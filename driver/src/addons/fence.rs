//! NetworkFence: fenced CIDRs are kept in the shared state; node plugins whose address falls in
//! one refuse to publish volumes until it is unfenced.
use std::sync::Arc;

use api::proto::fence as pb;
use tonic::{Request, Response, Status};

use crate::cidr::Cidr;
use crate::driver::Driver;

pub struct Fence(pub Arc<Driver>);

/// The request's CIDRs, validated: at least one, each a valid block.
fn parse(cidrs: &[pb::Cidr]) -> Result<Vec<String>, Status> {
    if cidrs.is_empty() {
        return Err(Status::invalid_argument("cidrs are required"));
    }
    cidrs
        .iter()
        .map(|c| c.cidr.parse::<Cidr>().map(|parsed| parsed.to_string()).map_err(Status::invalid_argument))
        .collect()
}

fn cidr_list(cidrs: impl IntoIterator<Item = String>) -> Vec<pb::Cidr> {
    cidrs.into_iter().map(|cidr| pb::Cidr { cidr }).collect()
}

#[tonic::async_trait]
impl pb::fence_controller_server::FenceController for Fence {
    async fn fence_cluster_network(
        &self,
        request: Request<pb::FenceClusterNetworkRequest>,
    ) -> Result<Response<pb::FenceClusterNetworkResponse>, Status> {
        let cidrs = parse(&request.into_inner().cidrs)?;
        self.0
            .update(|state| {
                state.fenced_cidrs.extend(cidrs);
                Ok(())
            })
            .await?;
        Ok(Response::new(pb::FenceClusterNetworkResponse {}))
    }

    async fn unfence_cluster_network(
        &self,
        request: Request<pb::UnfenceClusterNetworkRequest>,
    ) -> Result<Response<pb::UnfenceClusterNetworkResponse>, Status> {
        let cidrs = parse(&request.into_inner().cidrs)?;
        self.0
            .update(|state| {
                for cidr in &cidrs {
                    state.fenced_cidrs.remove(cidr);
                }
                Ok(())
            })
            .await?;
        Ok(Response::new(pb::UnfenceClusterNetworkResponse {}))
    }

    async fn list_cluster_fence(
        &self,
        _: Request<pb::ListClusterFenceRequest>,
    ) -> Result<Response<pb::ListClusterFenceResponse>, Status> {
        let state = self.0.reload().await.map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(pb::ListClusterFenceResponse { cidrs: cidr_list(state.fenced_cidrs) }))
    }

    async fn get_fence_clients(
        &self,
        _: Request<pb::GetFenceClientsRequest>,
    ) -> Result<Response<pb::GetFenceClientsResponse>, Status> {
        let state = self.0.reload().await.map_err(|e| Status::internal(e.to_string()))?;
        let clients = state
            .clients
            .into_iter()
            .map(|(id, addresses)| pb::ClientDetails { id, addresses: cidr_list(addresses) })
            .collect();
        Ok(Response::new(pb::GetFenceClientsResponse { clients }))
    }
}

/// Why this node may not serve I/O right now: the fenced block that holds its address.
pub fn fenced_by(state: &crate::state::State, node_ip: Option<std::net::IpAddr>) -> Option<String> {
    let ip = node_ip?;
    state.fenced_cidrs.iter().find(|c| c.parse::<Cidr>().is_ok_and(|cidr| cidr.contains(ip))).cloned()
}
