//! `identity.Identity`: forwarded to the driver unchanged.
use std::sync::Arc;

use api::proto::identity as pb;
use tonic::{Request, Response, Status};

use super::backend::Backend;

pub struct Identity(pub Arc<Backend>);

impl Identity {
    fn client(&self) -> pb::identity_client::IdentityClient<tonic::transport::Channel> {
        pb::identity_client::IdentityClient::new(self.0.driver.clone())
    }
}

#[tonic::async_trait]
impl pb::identity_server::Identity for Identity {
    async fn get_identity(
        &self,
        request: Request<pb::GetIdentityRequest>,
    ) -> Result<Response<pb::GetIdentityResponse>, Status> {
        let result = self.client().get_identity(request.into_inner()).await;
        self.0.driver_result("GetIdentity", result).map(Response::new)
    }

    async fn get_capabilities(
        &self,
        request: Request<pb::GetCapabilitiesRequest>,
    ) -> Result<Response<pb::GetCapabilitiesResponse>, Status> {
        let result = self.client().get_capabilities(request.into_inner()).await;
        self.0.driver_result("GetCapabilities", result).map(Response::new)
    }

    async fn probe(&self, request: Request<pb::ProbeRequest>) -> Result<Response<pb::ProbeResponse>, Status> {
        let result = self.client().probe(request.into_inner()).await;
        self.0.driver_result("Probe", result).map(Response::new)
    }
}
