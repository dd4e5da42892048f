//! `make demo`: a real control plane (etcd, kube-apiserver, kube-controller-manager), the
//! reference CSI driver (controller and node), a csi-addons sidecar next to each, csi-provisioner
//! and the csi-addons manager, all as local processes; then a story that runs every CSI-Addons
//! operation and measures its effect. The end-to-end suite runs the same story as assertions.
//!
//! No kubelet runs: where a step needs one (staging, publishing, the VolumeAttachment), the story
//! makes exactly the CSI calls and API writes the kubelet and the attacher would, and says so.
pub mod cleanup;
pub mod kube_apply;
pub mod peers;
pub mod stack;
pub mod story;

/// What can go wrong while setting up or telling the story.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("control plane: {0}")]
    ControlPlane(#[from] testenv::Error),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("gRPC: {0}")]
    Grpc(#[from] tonic::Status),
    #[error("connecting to {endpoint}: {source}")]
    Connect { endpoint: String, source: std::io::Error },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{0}")]
    Manifest(String),
    #[error("timed out after {seconds} s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
}

impl Error {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
