//! Kinds of the `csiaddons.openshift.io/v1alpha1` group.

mod jobs;
mod networkfence;
mod node;

pub use jobs::*;
pub use networkfence::*;
pub use node::*;

/// The API group of these kinds.
pub const GROUP: &str = "csiaddons.openshift.io";

/// Annotation our sidecar puts on its CSIAddonsNode with its Pod's name, so the manager can key
/// an `ip:port` endpoint (which names no Pod) the way the driver's Lease names its holder.
pub const SIDECAR_POD_ANNOTATION: &str = "sidecar.csiaddons.openshift.io/podName";

/// Finalizer the manager keeps on a CSIAddonsNode while its connection is pooled (upstream's).
pub const CSIADDONSNODE_FINALIZER: &str = "csiaddons.openshift.io/csiaddonsnode";
