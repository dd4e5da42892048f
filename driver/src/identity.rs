//! CSI Identity.
use std::sync::Arc;

use api::proto::csi::v1 as csi;
use csi::plugin_capability::{Service, service};
use tonic::{Request, Response, Status};

use crate::driver::Driver;

pub struct Identity(pub Arc<Driver>);

#[tonic::async_trait]
impl csi::identity_server::Identity for Identity {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.0.config.name.clone(),
            vendor_version: build_info::VERSION.to_owned(),
            // Only a controller plugin reports profiles: the driver operator asks it.
            manifest: if self.0.config.mode.controller() {
                let profiles = crate::profiles::served(&self.0.config.state_dir, self.0.config.directories);
                [(crate::profiles::KEY.to_owned(), crate::profiles::manifest_value(&profiles))].into()
            } else {
                Default::default()
            },
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = Vec::new();
        if self.0.config.mode.controller() {
            let service = Service { r#type: service::Type::ControllerService as i32 };
            capabilities.push(csi::PluginCapability { r#type: Some(csi::plugin_capability::Type::Service(service)) });
            let topology = Service { r#type: service::Type::VolumeAccessibilityConstraints as i32 };
            capabilities.push(csi::PluginCapability { r#type: Some(csi::plugin_capability::Type::Service(topology)) });
        }
        // Offline: the file grows at once, the filesystem when the volume is next staged. (Online
        // ext4 resizing is attempted by NodeExpandVolume, but some kernels refuse it.)
        let offline = csi::plugin_capability::VolumeExpansion {
            r#type: csi::plugin_capability::volume_expansion::Type::Offline as i32,
        };
        capabilities
            .push(csi::PluginCapability { r#type: Some(csi::plugin_capability::Type::VolumeExpansion(offline)) });
        Ok(Response::new(csi::GetPluginCapabilitiesResponse { capabilities }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}
