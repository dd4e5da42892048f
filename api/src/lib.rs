//! Types shared by the csi-addons-rs operator, sidecar and reference driver: the custom resources of
//! `csiaddons.openshift.io` and `replication.storage.openshift.io`, and the gRPC protocol code.

#![forbid(unsafe_code)]

pub mod capabilities;
pub mod crds;
pub mod csiaddons;
pub mod driver;
pub mod lease;
pub mod names;
pub mod proto;
pub mod redact;
pub mod replication;
pub mod schema;
