//! The names the operator's modules share: who writes, which labels mark what it manages, and the
//! Secrets it keeps. A leaf: it imports nothing of the crate, so any module may use it.

/// The field manager of every write, status included.
pub const FIELD_MANAGER: &str = "reference-driver-operator";
/// The label on every object the operator makes (the watches select on it).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "reference-driver-operator");
/// Holds the ReferenceCSIDriver until its driver is removed.
pub const FINALIZER: &str = "driver.csi-addons-rs.io/driver-removal";
/// The driver's Pods, controller and node.
pub const DRIVER_PODS: &str = "app.kubernetes.io/name=reference-driver";
/// The Secret holding the sidecars' serving certificate, mounted into each sidecar.
pub const SERVING_SECRET: &str = "reference-driver-sidecar-tls";
