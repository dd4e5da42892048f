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
mod error;
pub mod fault_table;
pub mod hostile;
pub mod kinds;
pub mod manager;
pub mod poll;
mod ports;
/// Child processes that die with the test process (PDEATHSIG) and stop gracefully.
pub mod process;

pub use control_plane::{ControlPlane, shared};
pub use error::Error;
pub use ports::free_port;
