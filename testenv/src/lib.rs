//! A real, local Kubernetes control plane for tests: etcd and kube-apiserver (and
//! kube-controller-manager on request) on free loopback ports, with their own certificates and the
//! CSI-Addons CRDs installed.
//!
//! One control plane is shared by all tests of a test binary ([`shared`]); each test works in its
//! own namespace ([`ControlPlane::namespace`]). Binaries come from `KUBEBUILDER_ASSETS` or, when
//! that is unset, from `hack/control-plane.sh` (which builds and caches them).

pub mod bound_claims;
mod certs;
mod control_plane;
pub mod fault_table;
pub mod hostile;
pub mod kinds;
pub mod manager;
pub mod poll;
mod ports;
/// Child processes that die with the test process (PDEATHSIG) and stop gracefully.
pub mod process;

pub use control_plane::{ControlPlane, shared};
pub use ports::free_port;

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
