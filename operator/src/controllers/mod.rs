//! The controllers, one folder each: `mod.rs` runs the controller and acts (the calls and the
//! writes), `decide.rs` holds its decisions without I/O (unit-tested there), and anything else in
//! the folder is that controller's alone. `replication` and `replication_class` are what the three
//! replication controllers share. They are started by `crate::manager::runner`, only while this manager leads.
pub mod cron_jobs;
pub mod jobs;
pub mod network_fence;
pub mod network_fence_class;
pub mod node;
pub mod pvc;
pub mod replication;
pub mod replication_class;
pub mod volume_group_replication;
pub mod volume_group_replication_content;
pub mod volume_health;
pub mod volume_replication;
