//! Scheduling by annotation: which cron job a PVC should have for reclaim space and for key
//! rotation, from the annotations on the PVC, its Namespace and its StorageClass, in either
//! precedence mode (`pvc`: the PVC's, then its Namespace's, then its StorageClass's;
//! `storageclass`: the class's alone), and what to do about the cron jobs it has. Pure.
use std::collections::BTreeMap;

use crate::flags::SchedulePrecedence;
use crate::schedule::Schedule;

/// The annotation marking cron jobs this controller manages; any other value means hands off.
pub const STATE: &str = "csiaddons.openshift.io/state";
pub const MANAGED: &str = "managed";
/// What an unusable schedule becomes, as upstream.
pub const FALLBACK_SCHEDULE: &str = "@weekly";

/// An operation scheduled by annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    ReclaimSpace,
    KeyRotation,
}

impl Feature {
    fn prefix(self) -> &'static str {
        match self {
            Feature::ReclaimSpace => "reclaimspace.csiaddons.openshift.io",
            Feature::KeyRotation => "keyrotation.csiaddons.openshift.io",
        }
    }

    pub fn schedule_key(self) -> String {
        format!("{}/schedule", self.prefix())
    }

    pub fn enable_key(self) -> String {
        format!("{}/enable", self.prefix())
    }

    /// The PVC annotation in which upstream's default mode names the child it made (read, so those
    /// children are adopted; we name ours deterministically and write nothing on the PVC).
    /// [differs: pvc-writes]
    pub fn cronjob_key(self) -> String {
        format!("{}/cronjob", self.prefix())
    }

    /// The Namespace annotation listing drivers, matched against the PV's driver name (upstream's
    /// against this key itself, which no list names). [differs: namespace-drivers]
    pub fn drivers_key(self) -> String {
        format!("{}/drivers", self.prefix())
    }

    fn suffix(self) -> &'static str {
        match self {
            Feature::ReclaimSpace => "reclaimspace",
            Feature::KeyRotation => "keyrotation",
        }
    }
}

/// Where the schedule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Pvc,
    Namespace,
    StorageClass,
}

/// The annotations that may schedule a PVC's operation.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    pub pvc: &'a BTreeMap<String, String>,
    pub namespace: Option<&'a BTreeMap<String, String>>,
    pub storage_class: Option<&'a BTreeMap<String, String>>,
    /// Whether a sidecar of the PV's driver offers the feature (a Namespace schedule counts only
    /// then, as upstream).
    pub driver_offers: bool,
}

/// The cron job a PVC should have for a feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Desired {
    Absent,
    Present {
        schedule: String,
        source: Source,
        /// Set when the annotated schedule was unusable and `@weekly` was used instead.
        warning: Option<String>,
    },
}

pub fn desired(feature: Feature, precedence: SchedulePrecedence, sources: &Sources<'_>) -> Desired {
    let ordered: Vec<(Source, &BTreeMap<String, String>)> = match precedence {
        // The StorageClass is the only source of truth in that mode: one that is gone is no
        // schedule, and the managed cron jobs go (upstream leaves them). [differs: storageclass-gone]
        SchedulePrecedence::StorageClass => {
            sources.storage_class.map(|sc| (Source::StorageClass, sc)).into_iter().collect()
        }
        SchedulePrecedence::Pvc => [
            Some((Source::Pvc, sources.pvc)),
            sources.namespace.filter(|_| sources.driver_offers).map(|ns| (Source::Namespace, ns)),
            sources.storage_class.map(|sc| (Source::StorageClass, sc)),
        ]
        .into_iter()
        .flatten()
        .collect(),
    };
    // `enable: "false"` on any source that counts turns the feature off, as upstream: a PVC's
    // "true" does not override an administrator's "false" on its Namespace or StorageClass. The
    // Namespace's counts whether or not the driver offers the feature (only its schedule waits
    // for that); in storage-class mode only the StorageClass counts.
    let enable_key = feature.enable_key();
    let disabled =
        |annotations: &BTreeMap<String, String>| annotations.get(&enable_key).is_some_and(|v| v.trim() == "false");
    let off = match precedence {
        SchedulePrecedence::StorageClass => sources.storage_class.is_some_and(disabled),
        SchedulePrecedence::Pvc => {
            [Some(sources.pvc), sources.namespace, sources.storage_class].into_iter().flatten().any(disabled)
        }
    };
    if off {
        return Desired::Absent;
    }
    let schedule_key = feature.schedule_key();
    let Some((source, schedule)) = ordered.iter().find_map(|(source, annotations)| {
        annotations.get(&schedule_key).filter(|s| !s.trim().is_empty()).map(|s| (*source, s))
    }) else {
        return Desired::Absent;
    };
    match Schedule::parse(schedule) {
        Ok(_) => Desired::Present { schedule: schedule.trim().to_owned(), source, warning: None },
        Err(e) => Desired::Present {
            schedule: FALLBACK_SCHEDULE.to_owned(),
            source,
            warning: Some(format!("{e}; using {FALLBACK_SCHEDULE} instead")),
        },
    }
}

/// Whether any source names a schedule for the feature, whatever the precedence and whether the
/// driver offers it: without one, `desired` is `Absent` in every case (so the PV's driver, which
/// only decides between sources, need not be looked up).
pub fn names_a_schedule(feature: Feature, sources: &Sources<'_>) -> bool {
    let key = feature.schedule_key();
    [Some(sources.pvc), sources.namespace, sources.storage_class]
        .into_iter()
        .flatten()
        .any(|annotations| annotations.get(&key).is_some_and(|s| !s.trim().is_empty()))
}

/// The managed cron job's name: `<pvc>-reclaimspace` / `<pvc>-keyrotation` (upstream's
/// storage-class mode names) in both modes, shortened with a hash past 253 characters.
/// [differs: pvc-cron-names]
pub fn child_name(pvc: &str, feature: Feature) -> String {
    crate::names::fit(&format!("{pvc}-{}", feature.suffix()))
}

/// A cron job of the feature owned by the PVC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    pub name: String,
    pub managed: bool,
    pub schedule: String,
}

/// What to do with the PVC's cron jobs of one feature.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChildPlan {
    pub create: Option<(String, String)>,
    /// (name, new schedule).
    pub update: Option<(String, String)>,
    pub delete: Vec<String>,
    /// An unmanaged cron job is there: nothing is touched.
    pub hands_off: bool,
}

pub fn plan_children(pvc: &str, feature: Feature, desired: &Desired, children: &[Child]) -> ChildPlan {
    if children.iter().any(|c| !c.managed) {
        return ChildPlan { hands_off: true, ..ChildPlan::default() };
    }
    let Desired::Present { schedule, .. } = desired else {
        return ChildPlan { delete: children.iter().map(|c| c.name.clone()).collect(), ..ChildPlan::default() };
    };
    let name = child_name(pvc, feature);
    // Keep ours if present (else the first, e.g. an upstream `<pvc>-<unix time>` child).
    let kept = children.iter().find(|c| c.name == name).or_else(|| children.first());
    let delete = children.iter().filter(|c| Some(*c) != kept).map(|c| c.name.clone()).collect();
    match kept {
        None => ChildPlan { create: Some((name, schedule.clone())), delete, ..ChildPlan::default() },
        Some(child) if child.schedule != *schedule => {
            ChildPlan { update: Some((child.name.clone(), schedule.clone())), delete, ..ChildPlan::default() }
        }
        Some(_) => ChildPlan { delete, ..ChildPlan::default() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    const RS: &str = "reclaimspace.csiaddons.openshift.io/schedule";
    const KR: &str = "keyrotation.csiaddons.openshift.io/schedule";
    const KR_ENABLE: &str = "keyrotation.csiaddons.openshift.io/enable";

    fn present(schedule: &str, source: Source) -> Desired {
        Desired::Present { schedule: schedule.into(), source, warning: None }
    }

    #[test]
    fn pvc_precedence_pvc_then_namespace_then_storageclass() {
        let (pvc, ns, sc) = (map(&[(RS, "@daily")]), map(&[(RS, "@hourly")]), map(&[(RS, "@monthly")]));
        let empty = map(&[]);
        let all = Sources { pvc: &pvc, namespace: Some(&ns), storage_class: Some(&sc), driver_offers: true };
        assert_eq!(desired(Feature::ReclaimSpace, SchedulePrecedence::Pvc, &all), present("@daily", Source::Pvc));
        let no_pvc = Sources { pvc: &empty, ..all };
        assert_eq!(
            desired(Feature::ReclaimSpace, SchedulePrecedence::Pvc, &no_pvc),
            present("@hourly", Source::Namespace)
        );
        // The Namespace counts only where the driver offers the feature.
        let not_offered = Sources { driver_offers: false, ..no_pvc };
        assert_eq!(
            desired(Feature::ReclaimSpace, SchedulePrecedence::Pvc, &not_offered),
            present("@monthly", Source::StorageClass)
        );
        assert_eq!(desired(Feature::KeyRotation, SchedulePrecedence::Pvc, &all), Desired::Absent);
    }

    #[test]
    fn storageclass_precedence_reads_only_the_class() {
        let (pvc, sc) = (map(&[(KR, "@daily")]), map(&[(KR, "@weekly")]));
        let sources = Sources { pvc: &pvc, namespace: None, storage_class: Some(&sc), driver_offers: true };
        assert_eq!(
            desired(Feature::KeyRotation, SchedulePrecedence::StorageClass, &sources),
            present("@weekly", Source::StorageClass)
        );
        let no_class = Sources { storage_class: None, ..sources };
        assert_eq!(desired(Feature::KeyRotation, SchedulePrecedence::StorageClass, &no_class), Desired::Absent);
    }

    #[test]
    fn enable_false_anywhere_turns_the_feature_off_in_pvc_mode() {
        let enable = Feature::ReclaimSpace.enable_key();
        let (on, off) = (map(&[(RS, "@daily"), (&enable, "true")]), map(&[(&enable, "false")]));
        let sc = map(&[(RS, "@weekly")]);
        // A PVC's "true" does not override a Namespace's "false", even where the driver does not
        // offer the feature (the Namespace's schedule would not count there; its "false" does).
        for driver_offers in [true, false] {
            let sources = Sources { pvc: &on, namespace: Some(&off), storage_class: Some(&sc), driver_offers };
            assert_eq!(desired(Feature::ReclaimSpace, SchedulePrecedence::Pvc, &sources), Desired::Absent);
        }
        // Nor a StorageClass's "false".
        let sources = Sources { pvc: &on, namespace: None, storage_class: Some(&off), driver_offers: true };
        assert_eq!(desired(Feature::ReclaimSpace, SchedulePrecedence::Pvc, &sources), Desired::Absent);
        // In storage-class mode, the class's own "false" alone counts.
        let class = map(&[(RS, "@weekly"), (&enable, "false")]);
        let sources = Sources { pvc: &on, namespace: None, storage_class: Some(&class), driver_offers: true };
        assert_eq!(desired(Feature::ReclaimSpace, SchedulePrecedence::StorageClass, &sources), Desired::Absent);
        let sources = Sources { pvc: &off, namespace: Some(&off), storage_class: Some(&sc), driver_offers: true };
        assert_eq!(
            desired(Feature::ReclaimSpace, SchedulePrecedence::StorageClass, &sources),
            present("@weekly", Source::StorageClass)
        );
    }

    #[test]
    fn a_pvcs_enable_false_wins_and_bad_schedules_fall_back() {
        let pvc = map(&[(KR_ENABLE, "false")]);
        let sc = map(&[(KR, "@daily"), (KR_ENABLE, "true")]);
        let sources = Sources { pvc: &pvc, namespace: None, storage_class: Some(&sc), driver_offers: true };
        assert_eq!(desired(Feature::KeyRotation, SchedulePrecedence::Pvc, &sources), Desired::Absent);
        // In storage-class mode the PVC's `enable` does not count.
        assert_eq!(
            desired(Feature::KeyRotation, SchedulePrecedence::StorageClass, &sources),
            present("@daily", Source::StorageClass)
        );
        let bad = map(&[(RS, "every tuesday")]);
        let sources = Sources { pvc: &bad, namespace: None, storage_class: None, driver_offers: true };
        let Desired::Present { schedule, warning, .. } =
            desired(Feature::ReclaimSpace, SchedulePrecedence::Pvc, &sources)
        else {
            panic!("a bad schedule must still schedule")
        };
        assert_eq!(schedule, "@weekly");
        assert!(warning.is_some_and(|w| w.contains("every tuesday")));
    }

    #[test]
    fn without_a_named_schedule_nothing_is_desired_in_any_mode() {
        let schedule = Feature::ReclaimSpace.schedule_key();
        let (enable, blank, named) = (
            map(&[(&Feature::ReclaimSpace.enable_key(), "true")]),
            map(&[(&schedule, "  ")]),
            map(&[(&schedule, "@daily")]),
        );
        for (pvc, namespace, class) in [(&enable, &blank, &enable), (&blank, &enable, &blank)] {
            for driver_offers in [false, true] {
                let sources = Sources { pvc, namespace: Some(namespace), storage_class: Some(class), driver_offers };
                assert!(!names_a_schedule(Feature::ReclaimSpace, &sources));
                for precedence in [SchedulePrecedence::Pvc, SchedulePrecedence::StorageClass] {
                    assert_eq!(desired(Feature::ReclaimSpace, precedence, &sources), Desired::Absent);
                }
            }
        }
        // Any one source naming one is enough, even one that this mode or driver would not read.
        let sources = Sources { pvc: &enable, namespace: Some(&named), storage_class: None, driver_offers: false };
        assert!(names_a_schedule(Feature::ReclaimSpace, &sources));
        assert!(!names_a_schedule(Feature::KeyRotation, &sources));
    }

    #[test]
    fn children_are_created_updated_deleted_and_unmanaged_ones_left_alone() {
        let want = present("@daily", Source::Pvc);
        let child =
            |name: &str, managed, schedule: &str| Child { name: name.into(), managed, schedule: schedule.into() };
        let plan = plan_children("data", Feature::ReclaimSpace, &want, &[]);
        assert_eq!(plan.create, Some(("data-reclaimspace".into(), "@daily".into())));
        let plan = plan_children("data", Feature::ReclaimSpace, &want, &[child("data-1700000000", true, "@weekly")]);
        assert_eq!(plan.update, Some(("data-1700000000".into(), "@daily".into())), "upstream's child is adopted");
        let plan = plan_children(
            "data",
            Feature::ReclaimSpace,
            &want,
            &[child("data-1700000000", true, "@daily"), child("data-reclaimspace", true, "@daily")],
        );
        assert_eq!((plan.create, plan.update, plan.delete), (None, None, vec!["data-1700000000".to_owned()]));
        let plan = plan_children(
            "data",
            Feature::ReclaimSpace,
            &Desired::Absent,
            &[child("data-reclaimspace", true, "@daily")],
        );
        assert_eq!(plan.delete, ["data-reclaimspace"]);
        let plan = plan_children("data", Feature::ReclaimSpace, &Desired::Absent, &[child("mine", false, "@daily")]);
        assert!(plan.hands_off && plan.delete.is_empty());
    }

    #[test]
    fn long_pvc_names_give_valid_child_names() {
        let name = child_name(&"p".repeat(253), Feature::KeyRotation);
        assert_eq!(name.len(), 253);
        assert_ne!(name, child_name(&"p".repeat(252), Feature::KeyRotation));
    }
}
