//! Kubernetes object names. A name taken from a spec, an endpoint or a request goes into an API URL
//! path: it is checked first, so that a malformed one is the caller's error with a reason, not an
//! API failure retried for ever (or, with `..`, a request for another resource).

/// What is wrong with `name` as a DNS-1123 subdomain (`label`: a DNS-1123 label, as namespaces
/// are), or None when it is a valid one.
pub fn dns1123_problem(name: &str, label: bool) -> Option<&'static str> {
    let max = if label { 63 } else { 253 };
    if name.is_empty() {
        return Some("empty");
    }
    if name.len() > max {
        return Some(if label { "longer than 63 characters" } else { "longer than 253 characters" });
    }
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (!label && b == b'.');
    if !name.bytes().all(allowed) {
        return Some(if label {
            "only lowercase letters, digits and '-' are allowed"
        } else {
            "only lowercase letters, digits, '-' and '.' are allowed"
        });
    }
    let alphanumeric = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    // A subdomain is labels joined by dots: each starts and ends with a letter or digit.
    let bad_part = |part: &str| !alphanumeric(part.bytes().next()) || !alphanumeric(part.bytes().last());
    if bad_part(name) {
        return Some("must start and end with a letter or digit");
    }
    if name.split('.').any(bad_part) {
        return Some("each part between dots must start and end with a letter or digit");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::dns1123_problem;

    #[test]
    fn names_are_checked_as_kubernetes_does() {
        assert_eq!(dns1123_problem("data-1.example", false), None);
        assert_eq!(dns1123_problem(&"a".repeat(253), false), None);
        assert!(dns1123_problem(&"a".repeat(254), false).is_some());
        assert!(dns1123_problem("data.1", true).is_some());
        assert!(dns1123_problem(&"a".repeat(64), true).is_some());
        assert_eq!(dns1123_problem("rook-ceph.rbd.csi.ceph.com-nodeplugin-7xk2p", false), None);
        for bad in ["", "../../etc", "数据", "Data", "-a", "a-", "a b", "a..b", "a.-b", "a-.b"] {
            assert!(dns1123_problem(bad, false).is_some(), "{bad:?}");
        }
    }
}
