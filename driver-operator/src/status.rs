//! The ReferenceCSIDriver's status: built from what a pass decided and observed (pure), written
//! with server-side apply under the operator's one field manager.
use api::driver::{GenerationStatus, ManagementState, OperandVersion, ReferenceCSIDriver, ReferenceCSIDriverStatus};
use kube::{Resource, ResourceExt};
use runtime_support::conditions::{condition, set_condition};

use crate::credentials::Credentials;
use crate::decide::{Backend, Rollout, conditions};
use crate::driver_set::errors::{DriverSetError, api_error};
use crate::names::FIELD_MANAGER;

/// The condition saying whether the credentials Secret was copied (set only when the spec names one
/// or named one before).
pub const CREDENTIALS_SYNCED: &str = "CredentialsSynced";

/// Sets the credentials' condition in `status`; drops it when the spec names no credentials.
pub fn with_credentials(status: &mut ReferenceCSIDriverStatus, credentials: &Credentials, generation: Option<i64>) {
    let next = match credentials {
        Credentials::NotAsked => {
            status.conditions.retain(|c| c.type_ != CREDENTIALS_SYNCED);
            return;
        }
        Credentials::Copied(keys) => condition(
            CREDENTIALS_SYNCED,
            true,
            "Copied",
            &format!("{keys} key(s) copied to the Secret {}", crate::credentials::COPY),
            generation,
        ),
        Credentials::Failed(why) => condition(CREDENTIALS_SYNCED, false, "NotCopied", why, generation),
    };
    status.conditions = set_condition(&status.conditions, next);
}

/// Whether condition `type_` is true now (`None` when not set).
pub fn condition_status(driver: &ReferenceCSIDriver, type_: &str) -> Option<bool> {
    let conditions = driver.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions.iter().find(|c| c.type_ == type_).map(|c| c.status == "True")
}

fn current(driver: &ReferenceCSIDriver) -> ReferenceCSIDriverStatus {
    driver.status.clone().unwrap_or_default()
}

/// The status of an object the operator does not manage: one condition saying why.
pub fn ignored(driver: &ReferenceCSIDriver, why: &str) -> ReferenceCSIDriverStatus {
    let mut status = current(driver);
    let generation = driver.meta().generation;
    status.conditions = set_condition(&status.conditions, condition("Degraded", true, "Ignored", why, generation));
    status.observed_generation = generation;
    status
}

/// The status of the managed driver after a pass.
pub fn managed(
    driver: &ReferenceCSIDriver,
    state: ManagementState,
    rollout: &Rollout,
    backend: &Backend,
    generations: Vec<GenerationStatus>,
    driver_image: Option<&str>,
) -> ReferenceCSIDriverStatus {
    let mut status = current(driver);
    let generation = driver.meta().generation;
    for verdict in conditions(state, rollout, backend) {
        let next = condition(verdict.type_, verdict.status, verdict.reason, &verdict.message, generation);
        status.conditions = set_condition(&status.conditions, next);
    }
    status.observed_generation = generation;
    if state == ManagementState::Managed {
        status.generations = generations;
        status.versions = vec![OperandVersion { name: "operator".into(), version: env!("CARGO_PKG_VERSION").into() }];
        if let Some(image) = driver_image {
            status.versions.push(OperandVersion { name: "reference-driver".into(), version: image.to_owned() });
        }
    }
    if let Backend::Profiles(profiles) = backend {
        status.profiles.clone_from(profiles);
    }
    status
}

/// Writes `status` unless it is what the object has (a write of the same status would wake this
/// controller again for nothing).
pub async fn write(
    client: &kube::Client,
    driver: &ReferenceCSIDriver,
    status: &ReferenceCSIDriverStatus,
) -> Result<(), DriverSetError> {
    if driver.status.as_ref() == Some(status) {
        return Ok(());
    }
    runtime_support::status::apply_status(client, driver, FIELD_MANAGER, serde_json::json!(status))
        .await
        .map_err(api_error("writing the status of", "ReferenceCSIDriver", &driver.name_any()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::driver::ReferenceCSIDriverSpec;

    #[test]
    fn a_pass_with_nothing_new_writes_the_same_status() {
        let mut driver = ReferenceCSIDriver::new(api::driver::DRIVER_NAME, ReferenceCSIDriverSpec::default());
        driver.metadata.generation = Some(3);
        let backend = Backend::Profiles(vec!["filesystem".into()]);
        let first = managed(&driver, ManagementState::Managed, &Rollout::Done, &backend, vec![], Some("img:v1"));
        assert_eq!(first.observed_generation, Some(3));
        assert_eq!(first.profiles, ["filesystem"]);
        assert_eq!(first.versions.len(), 2);
        driver.status = Some(first.clone());
        let again = managed(&driver, ManagementState::Managed, &Rollout::Done, &backend, vec![], Some("img:v1"));
        assert_eq!(again, first, "lastTransitionTime and everything else kept");
        assert_eq!(condition_status(&driver, "Available"), Some(true));
        let failed = Rollout::Failed("bad image".into());
        let degraded = managed(&driver, ManagementState::Managed, &failed, &backend, vec![], Some("img:v1"));
        assert_ne!(degraded, first);
    }

    #[test]
    fn the_credentials_condition_follows_the_sync_and_goes_when_none_are_named() {
        let mut status = ReferenceCSIDriverStatus::default();
        with_credentials(&mut status, &Credentials::Copied(2), Some(1));
        let synced = status.conditions.iter().find(|c| c.type_ == CREDENTIALS_SYNCED).unwrap();
        assert_eq!((synced.status.as_str(), synced.reason.as_str()), ("True", "Copied"));
        with_credentials(&mut status, &Credentials::Failed("the Secret is gone".into()), Some(2));
        let failed = status.conditions.iter().find(|c| c.type_ == CREDENTIALS_SYNCED).unwrap();
        assert_eq!((failed.status.as_str(), failed.message.as_str()), ("False", "the Secret is gone"));
        with_credentials(&mut status, &Credentials::NotAsked, Some(3));
        assert!(status.conditions.is_empty(), "{:?}", status.conditions);
    }

    #[test]
    fn an_ignored_object_is_told_why() {
        let driver = ReferenceCSIDriver::new("other", ReferenceCSIDriverSpec::default());
        let status = ignored(&driver, "ignored: create the one named reference.csi-addons-rs.io");
        let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "Ignored"));
        assert!(degraded.message.contains("reference.csi-addons-rs.io"));
    }
}
