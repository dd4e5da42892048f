//! Kinds of the `csiaddons.openshift.io/v1alpha1` group.

mod jobs;
mod networkfence;
mod node;

pub use jobs::*;
pub use networkfence::*;
pub use node::*;

/// The API group of these kinds.
pub const GROUP: &str = "csiaddons.openshift.io";
