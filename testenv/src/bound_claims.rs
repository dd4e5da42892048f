//! Many bound PVCs at once, written directly as the PV binder would leave them (no volume behind
//! them): what the benchmarks and the cluster's fan-out load give a manager to watch. Each PV is
//! labelled with its claims' namespace, so the set can be removed again.
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::poll;

/// The label on each PV: the namespace of its claim.
pub const PV_LABEL: &str = "testenv.csi-addons-rs.io/claims-in";
/// Writes in flight at once: enough that the API server, not the writer, sets the pace.
const IN_FLIGHT: usize = 32;

/// PVC `data-<i>` bound to PV `<namespace>-pv-<i>` of `driver` with volume handle `handles[i]`
/// (both statuses Bound, as the PV binder would leave them).
pub async fn bound_pairs(client: &kube::Client, namespace: &str, class: &str, driver: &str, handles: &[String]) {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let bound = json!({"status": {"phase": "Bound"}});
    futures::stream::iter(handles.iter().enumerate())
        .map(|(i, handle)| {
            let (pvs, pvcs, bound) = (pvs.clone(), pvcs.clone(), bound.clone());
            async move {
                let (pv_name, pvc_name) = (format!("{namespace}-pv-{i}"), format!("data-{i}"));
                let pv: PersistentVolume = from_json(json!({
                    "metadata": {"name": pv_name, "labels": {PV_LABEL: namespace}},
                    "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                             "csi": {"driver": driver, "volumeHandle": handle},
                             "claimRef": {"namespace": namespace, "name": pvc_name}},
                }));
                let pvc: PersistentVolumeClaim = from_json(json!({
                    "metadata": {"name": pvc_name},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                             "storageClassName": class, "volumeName": pv_name},
                }));
                let created = PostParams::default();
                let status = PatchParams::default();
                persist("creating a PV", async || pvs.create(&created, &pv).await.map(drop)).await;
                persist("creating a PVC", async || pvcs.create(&created, &pvc).await.map(drop)).await;
                let bound = Patch::Merge(&bound);
                persist("binding a PV", async || pvs.patch_status(&pv_name, &status, &bound).await.map(drop)).await;
                persist("binding a PVC", async || pvcs.patch_status(&pvc_name, &status, &bound).await.map(drop)).await;
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// Removes what [`bound_pairs`] wrote into `namespace`, and waits until it is gone. The protection
/// finalizers are taken off here: a kube-controller-manager at its default 20 requests a second
/// would take minutes to release ten thousand of them.
pub async fn remove_bound_pairs(client: &kube::Client, namespace: &str) {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let labelled = ListParams::default().labels(&format!("{PV_LABEL}={namespace}"));
    let every = ListParams::default();
    let deleting = DeleteParams::default();
    // Claims and volumes side by side: the API server deletes a collection one object at a time.
    let claims = async {
        persist("deleting the claims", async || pvcs.delete_collection(&deleting, &every).await.map(drop)).await;
        release(&pvcs, &every, "claim").await;
    };
    let volumes = async {
        persist("deleting the volumes", async || pvs.delete_collection(&deleting, &labelled).await.map(drop)).await;
        release(&pvs, &labelled, "volume").await;
    };
    futures::join!(claims, volumes);
}

/// Takes the finalizers off every object that `params` lists (deleted already), until none is left.
async fn release<K>(api: &Api<K>, params: &ListParams, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let no_finalizers = json!({"metadata": {"finalizers": null}});
    let gone = poll::until(10 * poll::MINUTE, async || {
        let left = api.list_metadata(params).await.ok()?.items;
        if left.is_empty() {
            return Some(());
        }
        futures::stream::iter(left.into_iter().filter_map(|o| o.metadata.name))
            .map(|name| {
                let patch = Patch::Merge(&no_finalizers);
                // One that is already gone, or fails now, is listed again on the next round.
                async move { drop(api.patch_metadata(&name, &PatchParams::default(), &patch).await) }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
        None
    })
    .await;
    assert!(gone.is_some(), "every {what} of the bound pairs is removed within 10 minutes");
}

/// A PV or PVC from a literal above: each literal has every field its kind requires, with the
/// right types, so it always reads.
#[allow(clippy::expect_used)]
fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a literal object of its kind")
}

/// Runs a write until it succeeds or says the object exists (an earlier try got through before the
/// connection dropped): a busy API server under a benchmark's load may cut a connection.
async fn persist(what: &str, mut write: impl AsyncFnMut() -> Result<(), kube::Error>) {
    for attempt in 1..=10 {
        match write().await {
            Ok(()) => return,
            Err(kube::Error::Api(status)) if status.code == 409 => return,
            Err(e) if attempt < 10 => {
                eprintln!("{what}: {e}; trying again");
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}
