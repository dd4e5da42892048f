pub mod idle;
pub mod jobs;
pub mod manager;
pub mod report;
pub mod sidecar;
