//! Repository checks that need no control plane: the code-order lists against the shipped binaries,
//! the reconcile futures' sizes, import circles, the OLM bundle's files, and our CRDs against
//! upstream's. A test binary of its own, so they run without etcd or kube-apiserver.

mod code_order;
mod future_sizes;
mod import_cycles;
mod olm_bundle;
mod upstream_parity;
