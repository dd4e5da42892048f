//! The manager's side of its connections to the sidecars: which sidecar serves a driver's call
//! (`pool`, its entries in `pool_entries`, the Leases that say who leads in `lease_holders`), the
//! gRPC channel to one (`client`: TLS, the bearer token, the timeouts), a channel closed while idle
//! and opened again on use (`idle_channel`), and the CAs a driver's sidecars are trusted by
//! (`driver_trust`).
pub mod client;
pub mod driver_trust;
pub mod idle_channel;
pub mod lease_holders;
pub mod pool;
pub mod pool_entries;
