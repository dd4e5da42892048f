//! Integration suites on a real kube-apiserver + etcd (built by hack/control-plane.sh). One
//! control plane for the whole binary; every test works in its own namespace. The folders say what
//! is tested (tests/README.md lists them and what each needs); `harness/` holds what the suites
//! share.

mod benches;
mod cluster_client;
mod driver;
mod harness;
mod hostile;
mod manager;
mod packaging;
mod sidecar;
mod stack;
