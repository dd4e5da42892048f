//! The pure part of a VolumeGroupReplication's reconcile: the members and their limit, the
//! children's names, the selector as upstream records it, and what the content says.
use std::collections::BTreeSet;

use api::replication::{VolumeGroupReplication, VolumeGroupReplicationContent};
use kube::ResourceExt;
use kube::core::Selector;

use crate::controllers::replication as rep;

/// The PVCs the group's status lists as members.
pub fn members(vgr: &VolumeGroupReplication) -> BTreeSet<String> {
    let status = vgr.status.as_ref();
    status.map(|s| s.persistent_volume_claims_ref_list.iter().map(|r| r.name.clone()).collect()).unwrap_or_default()
}

/// The content's and the VolumeReplication's names: the spec's, else upstream's defaults.
pub fn child_names(vgr: &VolumeGroupReplication) -> (String, String) {
    let uid = vgr.uid().unwrap_or_default();
    let content = vgr.spec.volume_group_replication_content_name.clone().filter(|n| !n.is_empty());
    let replication = vgr.spec.volume_replication_name.clone().filter(|n| !n.is_empty());
    (content.unwrap_or_else(|| format!("vgrcontent-{uid}")), replication.unwrap_or_else(|| format!("vr-{uid}")))
}

/// A label selector as Kubernetes prints one (`app=foo,tier in (a,b)`), its requirements sorted
/// by key as Go sorts them; empty for a selector that selects everything.
pub fn selector_text(selector: Selector) -> String {
    use kube::core::Expression;
    let mut parts: Vec<(String, String)> = selector
        .into_iter()
        .map(|e| {
            let key = match &e {
                Expression::In(k, _)
                | Expression::NotIn(k, _)
                | Expression::Equal(k, _)
                | Expression::NotEqual(k, _)
                | Expression::Exists(k)
                | Expression::DoesNotExist(k) => k.clone(),
            };
            (key, e.to_string())
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, text)| text).collect::<Vec<_>>().join(",")
}

/// The previous members to release, given the selected ones.
pub fn released(selected: &BTreeSet<String>, previous: &BTreeSet<String>) -> Vec<String> {
    previous.difference(selected).cloned().collect()
}

/// More PVCs than a group may hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the selector matches {count} PVCs, more than the {limit} a group may hold (max-group-pvcs)")]
pub struct TooManyPvcs {
    count: usize,
    limit: u32,
}

/// Upstream's limit, with the number printed as a number (upstream's message prints a character).
/// [differs: max-group-pvcs-message]
pub fn check_count(count: usize, limit: u32) -> Result<(), TooManyPvcs> {
    if count > limit as usize {
        return Err(TooManyPvcs { count, limit });
    }
    Ok(())
}

/// The content's `Ready=False` message, if any.
pub fn content_error(content: &VolumeGroupReplicationContent) -> Option<String> {
    let conditions = content.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions.iter().find(|c| c.type_ == "Ready" && c.status == "False").map(|c| c.message.clone())
}

/// Whether every member's destination is known to the content (upstream's main branch's rule for the
/// group's `DestinationInfoAvailable`, which it applies to a copy of the content it has not read
/// yet, so its group's condition never becomes True). [differs: group-destination-info]
pub fn group_destination(content: &VolumeGroupReplicationContent, members: usize) -> rep::Destination {
    let mapped = content.status.as_ref().map(|s| s.persistent_volume_mapping_list.as_slice()).unwrap_or_default();
    let known = mapped.iter().filter(|m| m.destination_volume_handle.as_deref().is_some_and(|d| !d.is_empty())).count();
    if known >= members { rep::Destination::Available } else { rep::Destination::Pending }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_printed_as_a_number() {
        assert_eq!(check_count(100, 100), Ok(()));
        assert_eq!(
            check_count(101, 100).unwrap_err().to_string(),
            "the selector matches 101 PVCs, more than the 100 a group may hold (max-group-pvcs)"
        );
    }

    #[test]
    fn the_selector_is_printed_as_kubernetes_prints_it() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
        let selector = LabelSelector {
            match_labels: Some([("tier".to_owned(), "db".to_owned()), ("app".to_owned(), "shop".to_owned())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "env".into(),
                operator: "In".into(),
                values: Some(vec!["prod".into(), "dev".into()]),
            }]),
        };
        let text = selector_text(Selector::try_from(selector).unwrap());
        assert_eq!(text, "app=shop,env in (dev,prod),tier=db");
        assert_eq!(selector_text(Selector::try_from(LabelSelector::default()).unwrap()), "");
    }

    #[test]
    fn members_are_the_selected_and_the_rest_are_released() {
        let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
        assert_eq!(released(&set(&["a", "b"]), &set(&["b", "c"])), vec!["c".to_owned()]);
    }

    #[test]
    fn children_are_named_after_the_uid_unless_the_spec_names_them() {
        let mut vgr = VolumeGroupReplication::new("g", Default::default());
        vgr.metadata.uid = Some("u1".into());
        assert_eq!(child_names(&vgr), ("vgrcontent-u1".to_owned(), "vr-u1".to_owned()));
        vgr.spec.volume_replication_name = Some("mine".into());
        assert_eq!(child_names(&vgr).1, "mine");
    }
}
