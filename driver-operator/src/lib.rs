//! The reference driver's lifecycle operator, modelled on the Manila CSI driver operator: one
//! cluster-scoped `ReferenceCSIDriver` (api::driver) says how the driver runs, and controllers side
//! by side keep the backend's profiles, the driver's workloads, its StorageClasses, its CSI-Addons
//! classes and its credentials in line with it.
//!
//! So far: the pure decisions (`decide`): which object is managed and the conditions reported.
pub mod decide;
