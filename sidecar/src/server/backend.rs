//! What every service of the server shares: the driver's channel, whether this sidecar leads,
//! the API client that resolves PVs and Secrets, and the metrics.
use std::collections::HashMap;

use tokio::sync::{OnceCell, watch};
use tonic::Status;
use tonic::transport::Channel;

use crate::metrics::Metrics;
use crate::resolve::{self, ResolveError};

/// Whether this sidecar may serve controller operations.
#[derive(Clone, Debug)]
pub enum Leadership {
    /// The driver has no controller service: nothing to elect, everything is served.
    NotElecting,
    /// The Lease decides; `holder` is true while this sidecar holds it.
    Elected { lease: String, holder: watch::Receiver<bool> },
}

impl Leadership {
    /// Controller operations that change something are served by the Lease holder only, so two
    /// sidecars never act on the same volume at once; the controller retries on UNAVAILABLE and
    /// finds the new holder. Reads (fence clients, replication info, a group) and the calls the
    /// controller routes to a node's sidecar (node reclaim space, key rotation) are served on
    /// every replica, as upstream serves everything: the manager asks every sidecar for its fence
    /// clients, and node sidecars may advertise the controller service too.
    /// [differs: sidecar-lease-writes]
    pub(super) fn require(&self) -> Result<(), Status> {
        match self {
            Leadership::Elected { lease, holder } if !*holder.borrow() => Err(Status::unavailable(format!(
                "this sidecar does not hold Lease {lease}: controller operations go to its holder"
            ))),
            _ => Ok(()),
        }
    }
}

/// What the services need.
pub struct Backend {
    pub driver: Channel,
    pub kube: kube::Client,
    pub node_id: String,
    /// `--stagingpath`.
    pub staging_root: String,
    /// `--kubelet-dir`.
    pub kubelet_dir: String,
    /// `--csi-address`: the driver's CSI socket, asked whether the driver stages volumes.
    pub csi_address: Option<String>,
    pub leadership: Leadership,
    pub metrics: Metrics,
    stages: OnceCell<bool>,
}

impl Backend {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        driver: Channel,
        kube: kube::Client,
        node_id: String,
        staging_root: String,
        kubelet_dir: String,
        csi_address: Option<String>,
        leadership: Leadership,
        metrics: Metrics,
    ) -> Self {
        Backend {
            driver,
            kube,
            node_id,
            staging_root,
            kubelet_dir,
            csi_address,
            leadership,
            metrics,
            stages: OnceCell::new(),
        }
    }

    /// The PV; a missing or non-CSI PV is the caller's error, an unreachable API server is not.
    pub(super) async fn volume(&self, pv_name: &str) -> Result<resolve::Volume, Status> {
        if pv_name.is_empty() {
            return Err(Status::invalid_argument("pv_name is required"));
        }
        resolve::volume(&self.kube, pv_name).await.map_err(|e| resolve_status(&e, tonic::Code::InvalidArgument))
    }

    /// The Secret named by a request; none when both parts are empty (upstream's sidecar refuses
    /// such a call). `code` is upstream's code for a Secret that cannot be read (InvalidArgument or
    /// Internal, per service). [differs: no-secret-calls]
    pub(super) async fn secret(
        &self,
        namespace: &str,
        name: &str,
        code: tonic::Code,
    ) -> Result<HashMap<String, String>, Status> {
        if namespace.is_empty() && name.is_empty() {
            return Ok(HashMap::new());
        }
        if namespace.is_empty() || name.is_empty() {
            return Err(Status::new(
                code,
                format!("a secret needs both a name and a namespace (got name {name:?}, namespace {namespace:?})"),
            ));
        }
        resolve::secret(&self.kube, namespace, name).await.map_err(|e| resolve_status(&e, code))
    }

    /// The PV's node-stage Secret (reclaim space and key rotation use it).
    pub(super) async fn stage_secret(&self, volume: &resolve::Volume) -> Result<HashMap<String, String>, Status> {
        match &volume.node_stage_secret {
            Some((namespace, name)) => self.secret(namespace, name, tonic::Code::InvalidArgument).await,
            None => Ok(HashMap::new()),
        }
    }

    /// Records a driver call and returns its result unchanged (driver codes reach the controller).
    pub(super) fn driver_result<T>(
        &self,
        method: &str,
        result: Result<tonic::Response<T>, Status>,
    ) -> Result<T, Status> {
        self.metrics.driver_call(method, &result);
        result.map(tonic::Response::into_inner)
    }

    /// Whether the driver stages volumes: asked once through `--csi-address`; without it,
    /// assumed (upstream always sends the computed staging path).
    pub(super) async fn driver_stages(&self) -> bool {
        let Some(address) = &self.csi_address else { return true };
        if let Some(known) = self.stages.get() {
            return *known;
        }
        match node_stages(address).await {
            Ok(stages) => *self.stages.get_or_init(|| async { stages }).await,
            Err(e) => {
                tracing::warn!(address = %address, error = %e, "NodeGetCapabilities failed; assuming the driver stages");
                true
            }
        }
    }
}

async fn node_stages(address: &str) -> Result<bool, Status> {
    use api::proto::csi::v1 as csi;
    let channel = crate::connect::now(address).await.map_err(|e| Status::unavailable(e.to_string()))?;
    let caps = csi::node_client::NodeClient::new(channel)
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await?
        .into_inner();
    Ok(caps.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(csi::node_service_capability::Type::Rpc(rpc))
            if rpc.r#type == csi::node_service_capability::rpc::Type::StageUnstageVolume as i32)
    }))
}

/// Not found and malformed references are the caller's (`code`); API failures are UNAVAILABLE
/// so the controller retries them.
fn resolve_status(error: &ResolveError, code: tonic::Code) -> Status {
    let api_error = match error {
        ResolveError::GetPv { source, .. } | ResolveError::GetSecret { source, .. } => Some(source),
        ResolveError::NotCsi(_) | ResolveError::BadName { .. } => None,
    };
    match api_error {
        Some(kube::Error::Api(status)) if status.code == 404 || status.code == 403 => {
            Status::new(code, error.to_string())
        }
        Some(_) => Status::unavailable(error.to_string()),
        None => Status::new(code, error.to_string()),
    }
}
