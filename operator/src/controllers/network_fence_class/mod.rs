//! NetworkFenceClass: name the class in the `networkfenceclass-names` annotation of every
//! CSIAddonsNode of its driver that can list fence clients (the CSIAddonsNode reconciler then
//! fills `networkFenceClientStatus`), and take it out again when the class goes. fetch (class,
//! the driver's CSIAddonsNodes from the node controller's cache) → validate (reserved
//! parameters) → decide (`annotation_change`) → act (patch the annotations) → finalizer. It
//! honours `max-concurrent-reconciles` (upstream's runs one worker).
pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use api::csiaddons::{CSIADDONSNODE_FINALIZER, CSIAddonsNode, NetworkFenceClass};
use futures::{Future, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use self::decide::{CLASS_NAMES_ANNOTATION, GET_CLIENTS_TO_FENCE, annotation_change, class_names, class_parameters};
use crate::cache_ready::Ready;
use crate::core::action::Action;
use crate::core::run::Context;

const NAME: &str = "networkfenceclass";
/// A CSIAddonsNode whose capabilities are not known yet is looked at again after this.
const CAPABILITIES_PENDING: Duration = Duration::from_secs(10);

/// The CSIAddonsNodes as the node controller's watch caches them, and when that cache has its
/// first full list.
pub struct Nodes {
    pub store: Store<CSIAddonsNode>,
    pub ready: Ready,
}

pub type ClassContext = Context<Nodes>;

/// Runs until `stop`; `node_changes` is every CSIAddonsNode the node watch applies.
pub async fn run(
    core: Arc<crate::core::Core>,
    nodes: Nodes,
    node_changes: mpsc::UnboundedReceiver<CSIAddonsNode>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (store, ready, changes) = crate::core::watch::trimmed_watch(Api::<NetworkFenceClass>::all(core.client.clone()));
    core.caches.follow(NAME, ready);
    // A CSIAddonsNode that can list fence clients but lacks a class of its driver (a new sidecar,
    // or an annotation edited by hand) brings that class back.
    let node_changes =
        futures::stream::unfold(
            node_changes,
            |mut changes| async move { changes.recv().await.map(|node| (node, changes)) },
        );
    let classes = store.clone();
    let controller = crate::core::queue::Triggers::new(changes)
        .watches(node_changes.map(Ok::<_, std::convert::Infallible>), move |node: CSIAddonsNode| {
            missing_classes(&classes, &node)
        })
        .controller(store);
    let ctx = Arc::new(Context::new(core, nodes));
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

pub(crate) async fn reconcile(class: Arc<NetworkFenceClass>, ctx: Arc<ClassContext>) -> Result<Action, kube::Error> {
    let name = class.name_any();
    let deleting = class.metadata.deletion_timestamp.is_some();
    let driver = &class.spec.provisioner;
    // Before its first list the cache would read as "no node of this driver".
    if ctx.state.ready.wait().await.is_err() {
        return Ok(Action::requeue(CAPABILITIES_PENDING));
    }
    // A node the cache still holds but the API server no longer has (its CRD deleted, as when the
    // operator is uninstalled) takes a patch as done: `patch_merge` reads 404 as nothing to undo.
    let nodes: Vec<Arc<CSIAddonsNode>> =
        ctx.state.store.state().into_iter().filter(|n| &n.spec.driver.name == driver).collect();
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
            crate::core::patch::patch_merge(&ctx, node.as_ref(), &patch).await?;
        }
    }
    if deleting {
        crate::core::patch::set_finalizer(&ctx, class.as_ref(), CSIADDONSNODE_FINALIZER, false).await?;
        return Ok(Action::await_change());
    }
    Ok(if pending { Action::requeue(CAPABILITIES_PENDING) } else { Action::await_change() })
}
