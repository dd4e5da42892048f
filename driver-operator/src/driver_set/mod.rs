//! The driver set controller: the driver's Namespace, CSIDriver, RBAC, controller StatefulSet and
//! node DaemonSet, applied from the ReferenceCSIDriver's spec, and their rollout reported in its
//! status. `Removed`, or deleting the object, removes them once no volume of the driver is attached
//! any more, so mounted volumes can still be unmounted; `Unmanaged` leaves everything alone.
//!
//! Pipeline: read the object → decide its role (pure) → render the objects (pure) → apply or
//! remove them → observe the rollout (pure) → write the status.
//!
//! `mod.rs` runs the controller and one pass of it; the steps are `apply` (apply or remove),
//! `observe`, `events` and `errors`.
use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::CSIAddonsNode;
use api::driver::{DRIVER_NAME, ManagementState, ReferenceCSIDriver};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

mod apply;
mod context;
pub mod errors;
mod events;
mod observe;

pub use apply::keep_certificates;
pub use context::Context;
pub use errors::DriverSetError;

use self::apply::{apply_all, apply_classes, certificates, finalizer, remove, sync_credentials};
use self::events::{announce, publish};
use self::observe::{Observed, observe};
use crate::credentials::Credentials;
use crate::decide::{Backend, Role, Rollout, role};
use crate::names::{DRIVER_PODS, MANAGED_BY};
use crate::{assets, backend, status};

/// While a rollout or a removal is under way, look again this often (the watches wake it sooner).
const BUSY: Duration = Duration::from_secs(10);
/// Resync a settled driver this often: the backend's profiles are asked again, and an edit by
/// hand that no watch reports (of a class, say) is undone within it.
const SETTLED: Duration = Duration::from_secs(60);

/// Runs the controller until `stop` resolves.
pub async fn run(ctx: Arc<Context>, stop: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let client = ctx.client.clone();
    let namespace = ctx.placement.namespace.clone();
    let managed = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    Controller::new(Api::<ReferenceCSIDriver>::all(client.clone()), watcher::Config::default())
        .watches(Api::<StatefulSet>::namespaced(client.clone(), &namespace), managed.clone(), to_driver)
        .watches(Api::<DaemonSet>::namespaced(client.clone(), &namespace), managed, to_driver)
        // The sidecars' capabilities decide the CSI-Addons classes.
        .watches(Api::<CSIAddonsNode>::namespaced(client.clone(), &namespace), watcher::Config::default(), to_driver)
        .watches(
            Api::<Pod>::namespaced(client.clone(), &namespace),
            watcher::Config::default().labels(DRIVER_PODS),
            to_driver,
        )
        // The user's credentials Secret: a change is copied at once.
        .watches(
            Api::<Secret>::namespaced(client.clone(), &ctx.placement.operator_namespace),
            watcher::Config::default(),
            to_driver,
        )
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn error_policy(_: Arc<ReferenceCSIDriver>, error: &DriverSetError, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_errors.inc();
    tracing::warn!(%error, "driver set");
    match error {
        DriverSetError::Assets(_) | DriverSetError::Certificates(_) => Action::requeue(SETTLED),
        DriverSetError::Api { .. } => Action::requeue(Duration::from_secs(5)),
    }
}

/// Every change of the driver's workloads or Pods concerns the one driver object.
fn to_driver<T>(_: T) -> Option<ObjectRef<ReferenceCSIDriver>> {
    Some(ObjectRef::new(DRIVER_NAME))
}

async fn reconcile(driver: Arc<ReferenceCSIDriver>, ctx: Arc<Context>) -> Result<Action, DriverSetError> {
    ctx.metrics.reconciles.inc();
    let name = driver.name_any();
    let deleting = driver.meta().deletion_timestamp.is_some();
    let state = match role(&name, driver.spec.management_state) {
        Role::Ignored(why) => {
            if !deleting {
                status::write(&ctx.client, &driver, &status::ignored(&driver, &why)).await?;
            }
            return Ok(Action::await_change());
        }
        Role::Driver(_) if deleting => ManagementState::Removed,
        Role::Driver(state) => state,
    };
    let mut backend = Backend::Unknown;
    let mut credentials = None;
    let mut observed: Option<Observed> = None;
    let (rollout, next) = match state {
        ManagementState::Unmanaged => (Rollout::Done, Action::await_change()),
        ManagementState::Removed => {
            let removal = remove(&ctx).await?;
            if removal == Rollout::Done {
                if deleting {
                    finalizer(&ctx.client, &driver, false).await?;
                    return Ok(Action::await_change());
                }
                (removal, Action::await_change())
            } else {
                (removal, Action::requeue(BUSY))
            }
        }
        ManagementState::Managed => {
            finalizer(&ctx.client, &driver, true).await?;
            let sidecar_ca = if driver.spec.csi_addons.enabled { Some(certificates(&ctx).await?) } else { None };
            let assets = assets::render(&driver.spec, &ctx.placement, sidecar_ca.as_deref())?;
            apply_all(&ctx.client, &assets).await?;
            let copied = sync_credentials(&ctx, &driver).await?;
            let seen = observe(&ctx, &assets).await?;
            backend = backend::ask(&seen.pods).await;
            apply_classes(&ctx, &driver, &backend, &copied).await?;
            credentials = Some(copied);
            let rollout = seen.rollout.clone();
            observed = Some(seen);
            let next = if rollout == Rollout::Done { SETTLED } else { BUSY };
            (rollout, Action::requeue(next))
        }
    };
    let before = status::condition_status(&driver, "Degraded");
    let (generations, driver_image) = observed.map(|o| (o.generations, o.driver_image)).unwrap_or_default();
    let mut written = status::managed(&driver, state, &rollout, &backend, generations, driver_image.as_deref());
    let synced_before = status::condition_status(&driver, status::CREDENTIALS_SYNCED);
    if let Some(credentials) = &credentials {
        status::with_credentials(&mut written, credentials, driver.meta().generation);
    }
    status::write(&ctx.client, &driver, &written).await?;
    announce(&ctx, &driver, state, &rollout, before).await;
    if let Some(Credentials::Failed(why)) = &credentials
        && synced_before != Some(false)
    {
        publish(&ctx, &driver, EventType::Warning, "CredentialsNotSynced", why.clone()).await;
    }
    Ok(next)
}
