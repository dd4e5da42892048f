//! The pure part of the driver operator: which object it manages, and the conditions it reports
//! from what it observed. No API calls here.
use api::driver::{DRIVER_NAME, ManagementState};

/// What the operator does with one ReferenceCSIDriver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The object named after the driver: managed as its spec says.
    Driver(ManagementState),
    /// Any other name: left alone, with a status saying why.
    Ignored(String),
}

/// The role of an object by its name.
pub fn role(name: &str, state: ManagementState) -> Role {
    if name == DRIVER_NAME {
        Role::Driver(state)
    } else {
        Role::Ignored(format!(
            "ignored: the operator manages only the ReferenceCSIDriver named {DRIVER_NAME}; create that one instead"
        ))
    }
}

/// Where the driver's workloads stand after the operator applied them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollout {
    /// Every Pod of the current spec is ready.
    Done,
    /// Pods of the current spec are starting; what is waited for.
    Waiting(String),
    /// The rollout cannot finish without a change (an image that cannot be pulled, a crash loop).
    Failed(String),
}

/// What the backend controller last learned from the driver's controller plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Not asked yet (the controller plugin is not running).
    Unknown,
    /// The storage profiles the driver can serve here; empty when it can serve none.
    Profiles(Vec<String>),
    /// The plugin did not answer: why.
    Unreachable(String),
}

/// One condition to set: type, status, reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

fn verdict(type_: &'static str, status: bool, reason: &'static str, message: impl Into<String>) -> Verdict {
    Verdict { type_, status, reason, message: message.into() }
}

/// The five conditions of a managed driver. `Available` holds once the driver rolled out, and
/// stays true while the backend is away: the running driver is left alone so Pods can still
/// unmount, and `BackendUnavailable` says what is missing.
pub fn conditions(state: ManagementState, rollout: &Rollout, backend: &Backend) -> Vec<Verdict> {
    let mut out = Vec::with_capacity(5);
    match state {
        ManagementState::Unmanaged => {
            let message = "managementState is Unmanaged: the operator changes nothing";
            out.push(verdict("Progressing", false, "Unmanaged", message));
            out.push(verdict("Degraded", false, "Unmanaged", message));
            out.push(verdict("Upgradeable", true, "Unmanaged", message));
            return out;
        }
        ManagementState::Removed => {
            let removed = *rollout == Rollout::Done;
            // What the removal waits for, when it waits.
            let message = match rollout {
                Rollout::Done => "the driver is removed",
                Rollout::Waiting(what) | Rollout::Failed(what) => what.as_str(),
            };
            out.push(verdict("Available", false, "Removed", message));
            out.push(verdict("Progressing", !removed, "Removed", message));
            out.push(verdict("Degraded", false, "Removed", message));
            out.push(verdict("Upgradeable", true, "Removed", message));
            return out;
        }
        ManagementState::Managed => {}
    }
    match rollout {
        Rollout::Done => {
            out.push(verdict("Available", true, "AsExpected", "the driver's Pods are ready"));
            out.push(verdict("Progressing", false, "AsExpected", ""));
            out.push(verdict("Degraded", false, "AsExpected", ""));
        }
        Rollout::Waiting(what) => {
            out.push(verdict("Available", false, "Deploying", what.clone()));
            out.push(verdict("Progressing", true, "Deploying", what.clone()));
            out.push(verdict("Degraded", false, "AsExpected", ""));
        }
        Rollout::Failed(why) => {
            out.push(verdict("Available", false, "RolloutFailed", why.clone()));
            out.push(verdict("Progressing", false, "RolloutFailed", why.clone()));
            out.push(verdict("Degraded", true, "RolloutFailed", why.clone()));
        }
    }
    // An upgrade of the operator rolls the driver: not while a rollout is unfinished.
    let settled = *rollout == Rollout::Done;
    out.push(verdict(
        "Upgradeable",
        settled,
        if settled { "AsExpected" } else { "RolloutInProgress" },
        if settled { "" } else { "the driver is rolling out" },
    ));
    out.push(match backend {
        Backend::Profiles(profiles) if !profiles.is_empty() => {
            verdict("BackendUnavailable", false, "ProfilesFound", format!("profiles: {}", profiles.join(", ")))
        }
        Backend::Profiles(_) => verdict(
            "BackendUnavailable",
            true,
            "NoProfiles",
            "the driver can serve no storage profile on this cluster; the running driver is left alone",
        ),
        Backend::Unreachable(why) => verdict(
            "BackendUnavailable",
            true,
            "Unreachable",
            format!("the driver's controller plugin did not answer: {why}; the running driver is left alone"),
        ),
        Backend::Unknown => verdict("BackendUnavailable", false, "NotAskedYet", "waiting for the controller plugin"),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status<'a>(verdicts: &'a [Verdict], type_: &str) -> Option<&'a Verdict> {
        verdicts.iter().find(|v| v.type_ == type_)
    }

    #[test]
    fn only_the_driver_named_object_is_managed() {
        assert_eq!(role(DRIVER_NAME, ManagementState::Removed), Role::Driver(ManagementState::Removed));
        let Role::Ignored(why) = role("my-driver", ManagementState::Managed) else { panic!("ignored") };
        assert!(why.contains(DRIVER_NAME), "{why}");
    }

    #[test]
    fn a_rolled_out_driver_is_available_and_upgradeable() {
        let verdicts = conditions(ManagementState::Managed, &Rollout::Done, &Backend::Profiles(vec!["block".into()]));
        assert_eq!(verdicts.len(), 5);
        assert!(status(&verdicts, "Available").unwrap().status);
        assert!(!status(&verdicts, "Degraded").unwrap().status);
        assert!(status(&verdicts, "Upgradeable").unwrap().status);
        assert!(!status(&verdicts, "BackendUnavailable").unwrap().status);
    }

    #[test]
    fn a_lost_backend_leaves_the_running_driver_available() {
        for backend in [Backend::Profiles(vec![]), Backend::Unreachable("connection refused".into())] {
            let verdicts = conditions(ManagementState::Managed, &Rollout::Done, &backend);
            let unavailable = status(&verdicts, "BackendUnavailable").unwrap();
            assert!(unavailable.status, "{backend:?}");
            assert!(unavailable.message.contains("left alone"), "{}", unavailable.message);
            assert!(status(&verdicts, "Available").unwrap().status, "the driver keeps running");
        }
    }

    #[test]
    fn a_failed_rollout_is_degraded_with_its_reason_and_blocks_upgrades() {
        let why = "container driver: image ghcr.io/x:v9 cannot be pulled".to_owned();
        let verdicts = conditions(ManagementState::Managed, &Rollout::Failed(why.clone()), &Backend::Unknown);
        let degraded = status(&verdicts, "Degraded").unwrap();
        assert!(degraded.status);
        assert_eq!(degraded.message, why);
        assert!(!status(&verdicts, "Upgradeable").unwrap().status);
        let waiting = conditions(ManagementState::Managed, &Rollout::Waiting("1 of 2 Pods".into()), &Backend::Unknown);
        assert!(status(&waiting, "Progressing").unwrap().status);
        assert!(!status(&waiting, "Degraded").unwrap().status);
    }

    #[test]
    fn unmanaged_and_removed_say_so() {
        let unmanaged = conditions(ManagementState::Unmanaged, &Rollout::Waiting("x".into()), &Backend::Unknown);
        assert!(unmanaged.iter().all(|v| v.reason == "Unmanaged"));
        assert!(
            status(&unmanaged, "Available").is_none(),
            "an unmanaged driver's availability is not the operator's to say"
        );
        let removing = conditions(ManagementState::Removed, &Rollout::Waiting("node Pods".into()), &Backend::Unknown);
        assert!(status(&removing, "Progressing").unwrap().status);
        assert_eq!(status(&removing, "Progressing").unwrap().message, "node Pods", "what removal waits for");
        let removed = conditions(ManagementState::Removed, &Rollout::Done, &Backend::Unknown);
        assert!(!status(&removed, "Progressing").unwrap().status);
        assert!(!status(&removed, "Available").unwrap().status);
    }
}
