//! Version information shared by every binary of the project.

#![forbid(unsafe_code)]

/// The workspace version, e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binaries were built from (`unknown` outside a git checkout unless the
/// `GIT_COMMIT` environment variable was set at build time).
pub const GIT_COMMIT: &str = env!("CSI_ADDONS_GIT_COMMIT");

/// What `--version` prints after the binary name: `0.1.0 (commit 0123456789ab)`.
pub const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CSI_ADDONS_GIT_COMMIT"), ")");

#[cfg(test)]
mod tests {
    #[test]
    fn long_version_carries_the_commit() {
        assert_eq!(super::LONG_VERSION, format!("{} (commit {})", super::VERSION, super::GIT_COMMIT));
        // Built from this repository, the commit is a 12-digit hash.
        assert!(
            super::GIT_COMMIT.len() == 12 && super::GIT_COMMIT.chars().all(|c| c.is_ascii_hexdigit()),
            "{}",
            super::GIT_COMMIT
        );
    }
}
