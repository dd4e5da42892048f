pub mod addons;
pub mod operator;
pub mod operator_credentials;
pub mod sanity;
pub mod volumes;
