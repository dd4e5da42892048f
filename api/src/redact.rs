//! Redaction of secret values in `Debug` output. The generated protocol types use [`Redacted`] for
//! every field the protos mark `csi_secret` (see build.rs). [differs: secret-redaction]
use std::collections::HashMap;
use std::fmt;

/// What a secret value prints as.
pub const REDACTED: &str = "<redacted>";

/// Formats a secret field without its value: map keys stay visible (they name which secrets were
/// sent, which helps debugging), values never do.
pub struct Redacted<'a, T: ?Sized>(pub &'a T);

impl fmt::Debug for Redacted<'_, HashMap<String, String>> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        f.debug_map().entries(keys.into_iter().map(|k| (k, Placeholder))).finish()
    }
}

impl fmt::Debug for Redacted<'_, String> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An empty value is shown as empty: it says "no key was sent" and reveals nothing.
        if self.0.is_empty() { f.write_str("\"\"") } else { f.write_str(REDACTED) }
    }
}

/// Prints [`REDACTED`] without quotes.
struct Placeholder;

impl fmt::Debug for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Test support: puts `sentinel` into a secret field of any supported type.
#[cfg(test)]
pub(crate) trait SentinelFill {
    fn fill(&mut self, sentinel: &str);
}

#[cfg(test)]
impl SentinelFill for HashMap<String, String> {
    fn fill(&mut self, sentinel: &str) {
        self.insert("key".to_owned(), sentinel.to_owned());
    }
}

#[cfg(test)]
impl SentinelFill for String {
    fn fill(&mut self, sentinel: &str) {
        *self = sentinel.to_owned();
    }
}

#[cfg(test)]
pub(crate) fn fill_with_sentinel(field: &mut impl SentinelFill, sentinel: &str) {
    field.fill(sentinel);
}
