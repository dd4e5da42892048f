//! Kinds of the `replication.storage.openshift.io/v1alpha1` group.

mod classes;
mod group;
mod volume;

pub use classes::*;
pub use group::*;
pub use volume::*;

/// The API group of these kinds.
pub const GROUP: &str = "replication.storage.openshift.io";
