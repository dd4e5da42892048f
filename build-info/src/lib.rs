//! Version information shared by every binary of the project.

/// The workspace version, e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binaries were built from (`unknown` outside a git checkout unless the
/// `GIT_COMMIT` environment variable was set at build time).
pub const GIT_COMMIT: &str = env!("CSI_ADDONS_GIT_COMMIT");

/// What `--version` prints after the binary name: `0.1.0 (commit 0123456789ab)`.
pub const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CSI_ADDONS_GIT_COMMIT"), ")");
