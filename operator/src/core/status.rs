//! Conditions, as the "write status" step sets them (shared with the driver operator).
pub use runtime_support::conditions::{condition, set_condition};
