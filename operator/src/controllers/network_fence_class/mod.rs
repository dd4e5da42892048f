//! NetworkFenceClass: name the class in the `networkfenceclass-names` annotation of every
//! CSIAddonsNode of its driver that can list fence clients (the CSIAddonsNode reconciler then
//! fills `networkFenceClientStatus`), and take it out again when the class goes. fetch (class,
//! the driver's CSIAddonsNodes) → validate (reserved parameters) → decide (`annotation_change`)
//! → act (patch the annotations) → finalizer. It honours `max-concurrent-reconciles` (upstream's
//! runs one worker).
pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::{CSIADDONSNODE_FINALIZER, CSIAddonsNode, NetworkFenceClass};
use futures::Future;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

use self::decide::{CLASS_NAMES_ANNOTATION, GET_CLIENTS_TO_FENCE, annotation_change, class_names, class_parameters};
use crate::core::Core;

const NAME: &str = "networkfenceclass";
/// A CSIAddonsNode whose capabilities are not known yet is looked at again after this.
const CAPABILITIES_PENDING: Duration = Duration::from_secs(10);

pub async fn run(ctx: Arc<Core>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let (store, ready, changes) = crate::core::watch::trimmed_watch(Api::<NetworkFenceClass>::all(ctx.client.clone()));
    ctx.caches.follow(NAME, ready);
    // A CSIAddonsNode that can list fence clients but lacks a class of its driver (a new sidecar,
    // or an annotation edited by hand) brings that class back.
    let nodes =
        watcher(ctx.watched::<CSIAddonsNode>(), crate::core::watch::list_config()).default_backoff().applied_objects();
    let classes = store.clone();
    let controller = Controller::for_stream(changes, store)
        .watches_stream(nodes, move |node: CSIAddonsNode| missing_classes(&classes, &node));
    crate::core::run::run_controller(controller, ctx, NAME, stop, reconcile).await;
}

/// The classes of `node`'s driver its annotation should name but does not.
fn missing_classes(classes: &Store<NetworkFenceClass>, node: &CSIAddonsNode) -> Vec<ObjectRef<NetworkFenceClass>> {
    if !offers_clients(node) || node.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let named = class_names(node.annotations().get(CLASS_NAMES_ANNOTATION).map(String::as_str));
    classes
        .state()
        .iter()
        .filter(|c| c.spec.provisioner == node.spec.driver.name && !named.contains(&c.name_any()))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

fn offers_clients(node: &CSIAddonsNode) -> bool {
    node.status.as_ref().is_some_and(|s| s.capabilities.iter().any(|c| c == GET_CLIENTS_TO_FENCE))
}

pub(crate) async fn reconcile(class: Arc<NetworkFenceClass>, ctx: Arc<Core>) -> Result<Action, kube::Error> {
    let name = class.name_any();
    let deleting = class.metadata.deletion_timestamp.is_some();
    let driver = &class.spec.provisioner;
    let listed = match ctx.watched::<CSIAddonsNode>().list(&ListParams::default()).await {
        Ok(list) => list.items,
        // The CSIAddonsNode kind is no longer served (its CRD deleted, as when the operator is
        // uninstalled): no node carries this class's name, so a deletion has nothing to undo.
        Err(kube::Error::Api(status)) if deleting && status.code == 404 => Vec::new(),
        Err(error) => return Err(error),
    };
    let nodes: Vec<CSIAddonsNode> = listed.into_iter().filter(|n| &n.spec.driver.name == driver).collect();
    // With --watch-namespace, a class whose driver has no sidecar here is another manager's.
    if ctx.watch_namespace.is_some() && nodes.is_empty() {
        return Ok(Action::await_change());
    }
    if !deleting && let Err(why) = class_parameters(class.spec.parameters.as_ref()) {
        // Parameters are immutable: only a new class helps.
        ctx.event(class.as_ref(), true, "InvalidParameters", format!("NetworkFenceClass {name}: {why}")).await;
        return Ok(Action::await_change());
    }
    if !deleting {
        crate::core::patch::set_finalizer(&ctx, class.as_ref(), CSIADDONSNODE_FINALIZER, true).await?;
    }
    let mut pending = false;
    for node in nodes.iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
        let capabilities_known = node.status.as_ref().is_some_and(|s| !s.capabilities.is_empty());
        if !deleting && !capabilities_known {
            pending = true;
            continue;
        }
        let present = !deleting && offers_clients(node);
        let current = node.annotations().get(CLASS_NAMES_ANNOTATION).map(String::as_str);
        if let Some(value) = annotation_change(current, &name, present) {
            let patch = json!({"metadata": {
                "annotations": {CLASS_NAMES_ANNOTATION: value},
                "resourceVersion": node.resource_version(),
            }});
            crate::core::patch::patch_merge(&ctx, node, &patch).await?;
        }
    }
    if deleting {
        crate::core::patch::set_finalizer(&ctx, class.as_ref(), CSIADDONSNODE_FINALIZER, false).await?;
        return Ok(Action::await_change());
    }
    Ok(if pending { Action::requeue(CAPABILITIES_PENDING) } else { Action::await_change() })
}
