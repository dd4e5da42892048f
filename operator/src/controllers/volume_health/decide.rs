//! Volume-health annotation cleanup: the sidecars' reporters write
//! `csiaddons.openshift.io/volumehealth.<node uid>` on PVCs; a node that stopped checking (gone,
//! or its sidecar no longer reporting) leaves a stale one, removed once its `lastChecked` is older
//! than the threshold. Pure: which keys of one PVC to remove.
use std::collections::BTreeMap;

pub const PREFIX: &str = "csiaddons.openshift.io/volumehealth.";

/// The volume-health keys of `annotations` to remove at `now` (seconds): those whose
/// `lastChecked` is older than the threshold. A value that is not the reporter's JSON, or has no
/// readable `lastChecked`, is kept, as upstream keeps it: it was not written by a reporter, so
/// whoever wrote it owns it.
pub fn stale_keys(annotations: &BTreeMap<String, String>, now: i64, threshold_secs: i64) -> Vec<String> {
    annotations
        .iter()
        .filter(|(key, _)| key.starts_with(PREFIX))
        .filter(|(_, value)| last_checked(value).is_some_and(|checked| now - checked > threshold_secs))
        .map(|(key, _)| key.clone())
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
        let mut stale = stale_keys(&annotations, now, 2 * 3600);
        stale.sort();
        assert_eq!(stale, [format!("{PREFIX}stale-uid")], "a value that is not the reporter's is kept");
    }
}
