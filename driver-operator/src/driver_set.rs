//! The driver set controller: the driver's Namespace, CSIDriver, RBAC, controller StatefulSet and
//! node DaemonSet, applied from the ReferenceCSIDriver's spec, and their rollout reported in its
//! status. `Removed`, or deleting the object, removes them once no volume of the driver is attached
//! any more, so mounted volumes can still be unmounted; `Unmanaged` leaves everything alone.
//!
//! Pipeline: read the object → decide its role (pure) → render the objects (pure) → apply or
//! remove them → observe the rollout (pure) → write the status.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::{CSIAddonsNode, NetworkFenceClass};
use api::replication::{VolumeGroupReplicationClass, VolumeReplicationClass};

use api::driver::{DRIVER_NAME, GenerationStatus, ManagementState, ReferenceCSIDriver};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::assets::{self, Assets, MANAGED_BY, Placement};
use crate::credentials::{self, Credentials};
use crate::decide::{Backend, Role, Rollout, role};
use crate::rollout::{attached_volumes, rollout};
use crate::status;
use crate::{backend, classes};

/// The field manager of every write, status included.
pub const FIELD_MANAGER: &str = "reference-driver-operator";
/// Holds the object until its driver is removed.
pub const FINALIZER: &str = "driver.csi-addons-rs.io/driver-removal";
/// The driver's Pods, controller and node.
const DRIVER_PODS: &str = "app.kubernetes.io/name=reference-driver";
/// While a rollout or a removal is under way, look again this often (the watches wake it sooner).
const BUSY: Duration = Duration::from_secs(10);
/// Resync a settled driver this often: the backend's profiles are asked again, and an edit by
/// hand that no watch reports (of a class, say) is undone within it.
const SETTLED: Duration = Duration::from_secs(60);

/// What the controller shares between reconciles.
pub struct Context {
    pub client: kube::Client,
    pub placement: Placement,
    pub recorder: Recorder,
    pub metrics: crate::metrics::Metrics,
}

impl Context {
    pub fn new(client: kube::Client, placement: Placement, metrics: crate::metrics::Metrics) -> Self {
        let reporter = Reporter { controller: FIELD_MANAGER.to_owned(), instance: std::env::var("POD_NAME").ok() };
        Context { recorder: Recorder::new(client.clone(), reporter), client, placement, metrics }
    }
}

/// Why a pass failed. `Assets` is a broken build and `Certificates` a clock out of range: not
/// retried soon. The rest are the API server's answers, retried.
#[derive(Debug, thiserror::Error)]
pub enum DriverSetError {
    #[error(transparent)]
    Assets(#[from] assets::AssetError),
    #[error(transparent)]
    Certificates(#[from] crate::certificates::CertError),
    #[error("{action} {kind} {name}: {source}")]
    Api {
        action: &'static str,
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

pub(crate) fn api_error(action: &'static str, kind: &str, name: &str) -> impl FnOnce(kube::Error) -> DriverSetError {
    let (kind, name) = (kind.to_owned(), name.to_owned());
    move |source| DriverSetError::Api { action, kind, name, source }
}

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

/// Events for the transitions a user watches for: a rollout that failed (Warning), and one that
/// recovered (Normal). Sent when the Degraded condition turns.
async fn announce(
    ctx: &Context,
    driver: &ReferenceCSIDriver,
    state: ManagementState,
    rollout: &Rollout,
    before: Option<bool>,
) {
    let event = match (state, rollout) {
        (ManagementState::Managed, Rollout::Failed(why)) if before != Some(true) => Event {
            type_: EventType::Warning,
            reason: "RolloutFailed".into(),
            note: Some(why.clone()),
            action: "Rollout".into(),
            secondary: None,
        },
        (ManagementState::Managed, Rollout::Done) if before == Some(true) => Event {
            type_: EventType::Normal,
            reason: "RolledOut".into(),
            note: Some("the driver's Pods are ready".into()),
            action: "Rollout".into(),
            secondary: None,
        },
        _ => return,
    };
    send(ctx, driver, &event).await;
}

async fn publish(ctx: &Context, driver: &ReferenceCSIDriver, type_: EventType, reason: &str, note: String) {
    let event = Event { type_, reason: reason.into(), note: Some(note), action: "Sync".into(), secondary: None };
    send(ctx, driver, &event).await;
}

async fn send(ctx: &Context, driver: &ReferenceCSIDriver, event: &Event) {
    if let Err(e) = ctx.recorder.publish(event, &driver.object_ref(&())).await {
        tracing::warn!(error = %e, "sending an event");
    }
}

/// Adds (`hold`) or removes the finalizer, if needed; the resourceVersion guards against a
/// concurrent change of the list.
async fn finalizer(client: &kube::Client, driver: &ReferenceCSIDriver, hold: bool) -> Result<(), DriverSetError> {
    let mut finalizers = driver.finalizers().to_vec();
    let has = finalizers.iter().any(|f| f == FINALIZER);
    if has == hold {
        return Ok(());
    }
    if hold {
        finalizers.push(FINALIZER.to_owned());
    } else {
        finalizers.retain(|f| f != FINALIZER);
    }
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": driver.resource_version()}
    });
    Api::<ReferenceCSIDriver>::all(client.clone())
        .patch(&driver.name_any(), &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(api_error("updating the finalizers of", "ReferenceCSIDriver", &driver.name_any()))?;
    Ok(())
}

/// The kinds the operator writes: static ones, Kubernetes' and the CSI-Addons classes.
trait Kind: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug {}
impl<K> Kind for K where K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug {}

async fn apply<K: Kind>(api: &Api<K>, object: &K) -> Result<(), DriverSetError> {
    let name = object.meta().name.clone().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(object)).await.map_err(api_error("applying", &K::kind(&()), &name))?;
    Ok(())
}

/// Every object, in dependency order: the namespace and identities before the Pods that use them.
async fn apply_all(client: &kube::Client, assets: &Assets) -> Result<(), DriverSetError> {
    let namespace = assets.namespace.name_any();
    apply(&Api::<Namespace>::all(client.clone()), &assets.namespace).await?;
    apply(&Api::<CSIDriver>::all(client.clone()), &assets.csi_driver).await?;
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &namespace);
    for account in &assets.service_accounts {
        apply(&accounts, account).await?;
    }
    for role in &assets.cluster_roles {
        apply(&Api::<ClusterRole>::all(client.clone()), role).await?;
    }
    for binding in &assets.cluster_role_bindings {
        apply(&Api::<ClusterRoleBinding>::all(client.clone()), binding).await?;
    }
    apply(&Api::<StatefulSet>::namespaced(client.clone(), &namespace), &assets.controller).await?;
    apply(&Api::<DaemonSet>::namespaced(client.clone(), &namespace), &assets.node).await?;
    Ok(())
}

/// What a pass saw of the applied workloads.
#[derive(Debug)]
struct Observed {
    rollout: Rollout,
    generations: Vec<GenerationStatus>,
    driver_image: Option<String>,
    /// The driver's Pods, read once for the rollout and the backend query.
    pods: Vec<Pod>,
}

fn generation_of<K: Resource<DynamicType = ()>>(object: &K, group: &str, resource: &str) -> GenerationStatus {
    let meta = object.meta();
    GenerationStatus {
        group: group.to_owned(),
        resource: resource.to_owned(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        last_generation: meta.generation.unwrap_or_default(),
    }
}

/// The sidecars' CA and serving certificate, the Namespace applied first to hold them (see
/// `keep_certificates`).
async fn certificates(ctx: &Context) -> Result<String, DriverSetError> {
    apply(&Api::<Namespace>::all(ctx.client.clone()), &assets::namespace(&ctx.placement)?).await?;
    keep_certificates(&ctx.client, &ctx.placement.namespace).await
}

/// The sidecars' CA and serving certificate in `namespace`, (re)issued when due; the CA bundle the
/// manager is to trust. On a CA renewal the new serving certificate is written before the CSIDriver
/// names the new CA, but the kubelet takes far longer to update a Secret volume than this pass
/// takes to apply the CSIDriver, so no sidecar serves a certificate the manager does not trust yet.
pub async fn keep_certificates(client: &kube::Client, namespace: &str) -> Result<String, DriverSetError> {
    use crate::certificates::{self as certs, CA_SECRET, SERVING_SECRET};
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let read = |name: &'static str| {
        let secrets = secrets.clone();
        async move { secrets.get_opt(name).await.map_err(api_error("reading", "Secret", name)) }
    };
    let ca_now = read(CA_SECRET).await?.as_ref().and_then(certs::read_ca);
    let serving_now = read(SERVING_SECRET).await?.as_ref().and_then(certs::read_serving);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let renewal = certs::renewal(ca_now.as_ref(), serving_now.as_ref(), now);
    let ca = match ca_now {
        Some(ca) if !renewal.ca => ca,
        previous => {
            let ca = certs::new_ca(previous.as_ref(), now)?;
            apply(&secrets, &certs::ca_secret(&ca, namespace)).await?;
            tracing::info!(generation = ca.generation, "issued the sidecars' CA");
            ca
        }
    };
    if renewal.serving {
        let (cert, key, serving) = certs::issue_serving(&ca, now)?;
        apply(&secrets, &certs::serving_secret(cert, key, serving, namespace)).await?;
        tracing::info!(not_after = serving.not_after, "issued the sidecars' serving certificate");
    }
    Ok(certs::bundle(&ca, now))
}

/// Copies the credentials Secret the spec names, if any, into the driver's namespace.
async fn sync_credentials(ctx: &Context, driver: &ReferenceCSIDriver) -> Result<Credentials, DriverSetError> {
    let Some(reference) = driver.spec.credentials_secret.as_ref() else { return Ok(Credentials::NotAsked) };
    let placement = &ctx.placement;
    match credentials::copy_for(&ctx.client, reference, &placement.operator_namespace, &placement.namespace).await? {
        Ok(copy) => {
            apply(&Api::<Secret>::namespaced(ctx.client.clone(), &placement.namespace), &copy).await?;
            Ok(Credentials::Copied(copy.data.as_ref().map_or(0, std::collections::BTreeMap::len)))
        }
        Err(why) => Ok(Credentials::Failed(why)),
    }
}

/// The StorageClasses of the profiles the backend reports, and the CSI-Addons classes the
/// driver's sidecars advertise capabilities for. None is ever deleted here.
async fn apply_classes(
    ctx: &Context,
    driver: &ReferenceCSIDriver,
    backend: &Backend,
    credentials: &Credentials,
) -> Result<(), DriverSetError> {
    let schedule = driver.spec.csi_addons.reclaim_space_schedule.as_deref().filter(|_| driver.spec.csi_addons.enabled);
    if let Backend::Profiles(profiles) = backend {
        for profile in profiles {
            apply(&Api::<StorageClass>::all(ctx.client.clone()), &classes::storage_class(profile, schedule)).await?;
        }
    }
    if !driver.spec.csi_addons.enabled {
        return Ok(());
    }
    let nodes = Api::<CSIAddonsNode>::namespaced(ctx.client.clone(), &ctx.placement.namespace)
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing", "CSIAddonsNodes", &ctx.placement.namespace))?;
    let capabilities: BTreeSet<String> = nodes
        .items
        .into_iter()
        .filter(|n| n.spec.driver.name == DRIVER_NAME)
        .flat_map(|n| n.status.map(|s| s.capabilities).unwrap_or_default())
        .collect();
    let wanted = &driver.spec.csi_addons.classes;
    let set = classes::addons_classes(&capabilities, wanted, credentials, &ctx.placement.namespace);
    if let Some(class) = &set.replication {
        apply_class(ctx, driver, &Api::<VolumeReplicationClass>::all(ctx.client.clone()), class).await?;
    }
    if let Some(class) = &set.group_replication {
        apply_class(ctx, driver, &Api::<VolumeGroupReplicationClass>::all(ctx.client.clone()), class).await?;
    }
    if let Some(class) = &set.network_fence {
        apply_class(ctx, driver, &Api::<NetworkFenceClass>::all(ctx.client.clone()), class).await?;
    }
    Ok(())
}

/// Applies a CSI-Addons class. Their parameters are immutable: a class made before the spec named
/// credentials keeps its parameters, and a Warning says how to have it made again.
async fn apply_class<K: Kind>(
    ctx: &Context,
    driver: &ReferenceCSIDriver,
    api: &Api<K>,
    class: &K,
) -> Result<(), DriverSetError> {
    match apply(api, class).await {
        Err(DriverSetError::Api { source: kube::Error::Api(e), kind, name, .. }) if e.code == 422 => {
            let note = format!(
                "{kind} {name} keeps its parameters, which cannot change ({}); delete it to have it made again \
                 with the credentials",
                e.message
            );
            tracing::warn!(%note);
            publish(ctx, driver, EventType::Warning, "ClassKept", note).await;
            Ok(())
        }
        other => other,
    }
}

/// The rollout as the workloads and their Pods show it.
async fn observe(ctx: &Context, assets: &Assets) -> Result<Observed, DriverSetError> {
    let namespace = &ctx.placement.namespace;
    let client = &ctx.client;
    let (controller_name, node_name) = (assets.controller.name_any(), assets.node.name_any());
    let controller = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get_opt(&controller_name)
        .await
        .map_err(api_error("reading", "StatefulSet", &controller_name))?;
    let node = Api::<DaemonSet>::namespaced(client.clone(), namespace).get_opt(&node_name).await.map_err(api_error(
        "reading",
        "DaemonSet",
        &node_name,
    ))?;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(DRIVER_PODS))
        .await
        .map_err(api_error("listing", "Pods", DRIVER_PODS))?;
    let mut generations = Vec::new();
    generations.extend(controller.iter().map(|s| generation_of(s, "apps", "statefulsets")));
    generations.extend(node.iter().map(|s| generation_of(s, "apps", "daemonsets")));
    Ok(Observed {
        rollout: rollout(controller.as_ref(), node.as_ref(), &pods.items),
        generations,
        driver_image: assets::driver_image(assets),
        pods: pods.items,
    })
}

/// One step of removal; `Done` once every object of the driver is gone. Never a StorageClass, a
/// PV or the namespace (it may hold the user's Secrets).
async fn remove(ctx: &Context) -> Result<Rollout, DriverSetError> {
    let client = &ctx.client;
    let attachments = Api::<VolumeAttachment>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing", "VolumeAttachments", ""))?;
    let attached = attached_volumes(&attachments.items, DRIVER_NAME);
    if !attached.is_empty() {
        return Ok(Rollout::Waiting(format!(
            "{} volume(s) of the driver are still attached ({}); the driver stays until their Pods are gone and \
             they are unmounted and detached",
            attached.len(),
            attached.join(", ")
        )));
    }
    // Rendered from the default spec: only names and namespaces matter here.
    let assets = assets::render(&Default::default(), &ctx.placement, None)?;
    let namespace = &ctx.placement.namespace;
    let mut left = Vec::new();
    left.extend(
        delete(&Api::<StatefulSet>::namespaced(client.clone(), namespace), &assets.controller.name_any()).await?,
    );
    left.extend(delete(&Api::<DaemonSet>::namespaced(client.clone(), namespace), &assets.node.name_any()).await?);
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list_metadata(&ListParams::default().labels(DRIVER_PODS))
        .await
        .map_err(api_error("listing", "Pods", DRIVER_PODS))?;
    if !left.is_empty() || !pods.items.is_empty() {
        return Ok(Rollout::Waiting(format!("removing the driver's Pods ({} left)", pods.items.len())));
    }
    left.extend(delete(&Api::<CSIDriver>::all(client.clone()), &assets.csi_driver.name_any()).await?);
    for binding in &assets.cluster_role_bindings {
        left.extend(delete(&Api::<ClusterRoleBinding>::all(client.clone()), &binding.name_any()).await?);
    }
    for role in &assets.cluster_roles {
        left.extend(delete(&Api::<ClusterRole>::all(client.clone()), &role.name_any()).await?);
    }
    for account in &assets.service_accounts {
        left.extend(delete(&Api::<ServiceAccount>::namespaced(client.clone(), namespace), &account.name_any()).await?);
    }
    for secret in [crate::certificates::SERVING_SECRET, crate::certificates::CA_SECRET, credentials::COPY] {
        left.extend(delete(&Api::<Secret>::namespaced(client.clone(), namespace), secret).await?);
    }
    if left.is_empty() { Ok(Rollout::Done) } else { Ok(Rollout::Waiting(format!("removing {}", left.join(", ")))) }
}

/// Deletes `name` (its Pods go after it, by the garbage collector); `Some(kind/name)` while it
/// still exists.
async fn delete<K: Kind>(api: &Api<K>, name: &str) -> Result<Option<String>, DriverSetError> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(Some(format!("{}/{name}", K::kind(&())))),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(source) => Err(DriverSetError::Api {
            action: "deleting",
            kind: K::kind(&()).into_owned(),
            name: name.to_owned(),
            source,
        }),
    }
}
