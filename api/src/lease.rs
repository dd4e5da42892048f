//! Lease naming shared by the sidecar (which holds the Lease) and the manager (which reads its
//! holder to find a driver's leader).

/// Replaces every character outside `[a-zA-Z0-9-]` with `-` and appends `X` when the result ends
/// in `-`, as csi-lib-utils does for lease names and identities. An empty input stays empty
/// (upstream panics on it).
pub fn normalize_lease_name(name: &str) -> String {
    let mut out: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// The Lease a driver's sidecars compete for: `<normalized driver name>-csi-addons`, lowercased.
/// CSI allows upper case in driver names but Kubernetes object names do not; upstream keeps the
/// case and so cannot create the Lease for such a driver. For lowercase names (every driver with
/// a CSIDriver object) the name is upstream's. [differs: lease-name]
pub fn driver_lease_name(driver: &str) -> String {
    format!("{}-csi-addons", normalize_lease_name(driver).to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_as_csi_lib_utils_does() {
        assert_eq!(driver_lease_name("rook-ceph.rbd.csi.ceph.com"), "rook-ceph-rbd-csi-ceph-com-csi-addons");
        assert_eq!(driver_lease_name("Example.CSI.io"), "example-csi-io-csi-addons");
        assert_eq!(normalize_lease_name("csi_rbd.plugin-"), "csi-rbd-plugin-X");
        assert_eq!(normalize_lease_name("a/b"), "a-b");
        assert_eq!(normalize_lease_name("é"), "-X");
        assert_eq!(normalize_lease_name(""), "");
    }
}
