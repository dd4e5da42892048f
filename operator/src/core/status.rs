//! Conditions, as the "write status" step sets them (shared with the driver operator).
pub use api::conditions::{condition, set_condition};
