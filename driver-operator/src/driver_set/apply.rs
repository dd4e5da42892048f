//! Apply or remove: the rendered objects written by server-side apply, in dependency order, the
//! sidecars' certificates and the credentials kept, the classes made; and the driver's objects
//! deleted step by step on removal.
use std::collections::BTreeSet;

use api::csiaddons::{CSIAddonsNode, NetworkFenceClass};
use api::driver::{DRIVER_NAME, ReferenceCSIDriver};
use api::replication::{VolumeGroupReplicationClass, VolumeReplicationClass};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::context::Context;
use super::errors::{DriverSetError, api_error};
use super::events::publish;
use crate::assets::{self, Assets};
use crate::classes;
use crate::credentials::{self, Credentials};
use crate::decide::{Backend, Rollout};
use crate::names::{DRIVER_PODS, FIELD_MANAGER, FINALIZER, SERVING_SECRET};
use crate::rollout::attached_volumes;

/// Adds (`hold`) or removes the finalizer, if needed (a compare-and-swap on the resourceVersion).
pub(super) async fn finalizer(
    client: &kube::Client,
    driver: &ReferenceCSIDriver,
    hold: bool,
) -> Result<(), DriverSetError> {
    runtime_support::finalizer::set_finalizer(client, driver, FINALIZER, hold).await.map_err(api_error(
        "updating the finalizers of",
        "ReferenceCSIDriver",
        &driver.name_any(),
    ))
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
pub(super) async fn apply_all(client: &kube::Client, assets: &Assets) -> Result<(), DriverSetError> {
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

/// The sidecars' CA and serving certificate, the Namespace applied first to hold them (see
/// `keep_certificates`).
pub(super) async fn certificates(ctx: &Context) -> Result<String, DriverSetError> {
    apply(&Api::<Namespace>::all(ctx.client.clone()), &assets::namespace(&ctx.placement)?).await?;
    keep_certificates(&ctx.client, &ctx.placement.namespace).await
}

/// The sidecars' CA and serving certificate in `namespace`, (re)issued when due; the CA bundle the
/// manager is to trust. On a CA renewal the new serving certificate is written before the CSIDriver
/// names the new CA, but the kubelet takes far longer to update a Secret volume than this pass
/// takes to apply the CSIDriver, so no sidecar serves a certificate the manager does not trust yet.
pub async fn keep_certificates(client: &kube::Client, namespace: &str) -> Result<String, DriverSetError> {
    use crate::certificates::{self as certs, CA_SECRET};
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
pub(super) async fn sync_credentials(
    ctx: &Context,
    driver: &ReferenceCSIDriver,
) -> Result<Credentials, DriverSetError> {
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
pub(super) async fn apply_classes(
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

/// One step of removal; `Done` once every object of the driver is gone. Never a StorageClass, a
/// PV or the namespace (it may hold the user's Secrets).
pub(super) async fn remove(ctx: &Context) -> Result<Rollout, DriverSetError> {
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
    for secret in [SERVING_SECRET, crate::certificates::CA_SECRET, credentials::COPY] {
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
