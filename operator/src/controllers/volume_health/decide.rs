//! Volume-health annotation cleanup: the sidecars' reporters write
//! `csiaddons.openshift.io/volumehealth.<node uid>` on PVCs; a node that stopped checking (gone,
//! or its sidecar no longer reporting) leaves a stale one, removed once its `lastChecked` is older
//! than the threshold. Pure: what the PVC cache keeps of them, and which keys of one PVC to remove.

pub const PREFIX: &str = "csiaddons.openshift.io/volumehealth.";

/// Keeps a volume-health annotation in the PVC cache in the form `stale_keys` reads: its
/// `lastChecked` in seconds (a few bytes where the reporter's JSON is some 150). False, and the
/// key is not cached, for any other annotation and for a value without a readable `lastChecked`:
/// such a value was not written by a reporter, so whoever wrote it owns it, as upstream keeps it.
pub fn keep_checked(key: &str, value: &mut String) -> bool {
    match last_checked(value).filter(|_| key.starts_with(PREFIX)) {
        Some(checked) => {
            *value = checked.to_string();
            true
        }
        None => false,
    }
}

/// The volume-health keys of a cached PVC's `annotations` (see `keep_checked`) to remove at `now`
/// (seconds): those checked longer than the threshold ago.
pub fn stale_keys<'a>(
    annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
    now: i64,
    threshold_secs: i64,
) -> Vec<String> {
    annotations
        .into_iter()
        .filter(|(key, _)| key.starts_with(PREFIX))
        .filter(|(_, checked)| checked.parse::<i64>().is_ok_and(|checked| now - checked > threshold_secs))
        .map(|(key, _)| key.to_owned())
        .collect()
}

fn last_checked(value: &str) -> Option<i64> {
    let json: serde_json::Value = serde_json::from_str(value).ok()?;
    let text = json.get("lastChecked")?.as_str()?;
    let at: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(at.as_second())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn only_stale_health_annotations_go() {
        // 2026-11-23T12:00:00Z.
        let now = 1_795_435_200;
        let value = |checked: &str| {
            format!(r#"{{"state":"healthy","lastChecked":"{checked}","since":"{checked}","node":"n"}}"#)
        };
        let annotations: BTreeMap<String, String> = [
            (format!("{PREFIX}fresh-uid"), value("2026-11-23T11:30:00Z")),
            (format!("{PREFIX}stale-uid"), value("2026-11-23T09:00:00Z")),
            (format!("{PREFIX}garbage-uid"), "not json".to_owned()),
            ("reclaimspace.csiaddons.openshift.io/schedule".to_owned(), "@weekly".to_owned()),
        ]
        .into_iter()
        .collect();
        let mut cached = annotations.clone();
        cached.retain(|key, value| keep_checked(key, value));
        assert_eq!(cached.len(), 2, "only the reporter's values are cached: {cached:?}");
        assert_eq!(cached[&format!("{PREFIX}fresh-uid")], "1795433400");
        let mut stale = stale_keys(cached.iter().map(|(k, v)| (k.as_str(), v.as_str())), now, 2 * 3600);
        stale.sort();
        assert_eq!(stale, [format!("{PREFIX}stale-uid")], "a value that is not the reporter's is kept");
    }
}
