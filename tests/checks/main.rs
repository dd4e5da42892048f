//! Repository checks that need no control plane: import circles, the OLM bundle's files, our CRDs
//! against upstream's, every difference from upstream in docs/upstream.md against the code's
//! markers, and (ignored but by `make test-shipped`) the shipped build's futures' sizes and code
//! order. A test binary of its own, so they run without etcd or kube-apiserver.

mod import_cycles;
mod olm_bundle;
mod shipped;
mod upstream_markers;
mod upstream_parity;
