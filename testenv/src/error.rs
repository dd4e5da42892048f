//! Why the control plane could not be started or used: the one error type of this crate, a leaf
//! the other modules take it from.

/// Why the control plane could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("certificates: {0}")]
    Pki(String),
    #[error("finding the control-plane binaries: {0}")]
    Assets(String),
    #[error("the control plane did not become ready: {name} exited: {log}")]
    Exited { name: &'static str, log: String },
    #[error("{what} did not become ready: {detail}")]
    NotReady { what: &'static str, detail: String },
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
}
