pub mod crs;
pub mod input;
