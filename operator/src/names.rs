//! Names built from other names. Kubernetes caps object names at 253 characters (DNS-1123
//! subdomains: dot-separated labels that start and end with a letter or digit).
use sha2::{Digest, Sha256};

const MAX: usize = 253;
/// 16 hex characters of hash and a `-` follow the kept part.
const KEPT: usize = MAX - 17;

/// `full` when it fits; otherwise its first 236 characters, cut back to end on a letter or digit
/// (a cut right after a `.` or `-` is not a valid name), `-`, and 16 hex characters of
/// SHA-256(`full`): deterministic, and distinct for distinct names in practice.
pub fn fit(full: &str) -> String {
    if full.len() <= MAX {
        return full.to_owned();
    }
    let hash: String = Sha256::digest(full.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let cut = (0..=KEPT).rev().find(|i| full.is_char_boundary(*i)).unwrap_or(0);
    format!("{}-{hash}", full[..cut].trim_end_matches(['.', '-']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_cut_to_a_valid_name_with_a_hash() {
        assert_eq!(fit("pvc-1-reclaimspace"), "pvc-1-reclaimspace");
        let long = format!("{}.{}", "a".repeat(235), "b".repeat(40));
        let fitted = fit(&long);
        assert_eq!(fitted.len(), 235 + 17);
        assert!(fitted.starts_with(&"a".repeat(235)) && !fitted.contains(".-"), "{fitted}");
        assert_ne!(fit(&format!("{long}x")), fitted);
        assert_eq!(fit(&"p".repeat(300)).len(), MAX);
    }
}
