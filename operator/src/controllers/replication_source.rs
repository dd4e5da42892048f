//! What a VolumeReplication replicates: a PVC (its PV's CSI handle) or a VolumeGroupReplication
//! (its content's group handle), and how the source is marked as taken and released.
use api::replication::{VolumeGroupReplication, VolumeGroupReplicationContent, VolumeReplication};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::patch_merge;
use crate::compact::CsiPv;
use crate::context::{Context, ReconcileError};
use crate::replication::{self as rep, PVC_FINALIZER, VR_FINALIZER, VR_OWNER};

/// A problem with the source: the message, and whether waiting may help.
pub struct SourceProblem {
    pub message: String,
    pub transient: bool,
}

fn transient(message: String) -> SourceProblem {
    SourceProblem { message, transient: true }
}

fn permanent(message: String) -> SourceProblem {
    SourceProblem { message, transient: false }
}

pub enum Source {
    Pvc(Box<PersistentVolumeClaim>),
    Group { vgr: Box<VolumeGroupReplication>, content: Box<VolumeGroupReplicationContent> },
}

impl Source {
    pub fn is_group(&self) -> bool {
        matches!(self, Source::Group { .. })
    }
}

/// The source named by the VolumeReplication's dataSource and its handle at `driver`. The kind
/// decides, whatever `apiGroup` says, as upstream: orchestrators write `apiGroup: ""` or leave it
/// out for either kind.
pub async fn fetch(ctx: &Context, vr: &VolumeReplication, driver: &str) -> Result<(Source, String), SourceProblem> {
    let namespace = vr.namespace().unwrap_or_default();
    let source = &vr.spec.data_source;
    let group = source.api_group.as_deref().unwrap_or_default();
    match source.kind.as_str() {
        "PersistentVolumeClaim" => {
            let pvc = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace)
                .get_opt(&source.name)
                .await
                .map_err(|e| transient(format!("reading PVC {namespace}/{}: {e}", source.name)))?
                .ok_or_else(|| transient(format!("PVC {namespace}/{} not found", source.name)))?;
            if pvc.metadata.deletion_timestamp.is_some() && !pvc.finalizers().iter().any(|f| f == PVC_FINALIZER) {
                return Err(permanent(format!(
                    "PVC {namespace}/{} is being deleted: a terminating PVC is not replicated",
                    source.name
                )));
            }
            if let Some(conflict) = rep::ownership_conflict(pvc.annotations(), &vr.name_any()) {
                return Err(transient(format!("PVC {namespace}/{}: {conflict}", source.name)));
            }
            let handle = csi_handle(ctx, &pvc, driver).await?;
            Ok((Source::Pvc(Box::new(pvc)), handle))
        }
        "VolumeGroupReplication" => {
            let vgr = Api::<VolumeGroupReplication>::namespaced(ctx.client.clone(), &namespace)
                .get_opt(&source.name)
                .await
                .map_err(|e| transient(format!("reading VolumeGroupReplication {namespace}/{}: {e}", source.name)))?
                .ok_or_else(|| transient(format!("VolumeGroupReplication {namespace}/{} not found", source.name)))?;
            let content_name = vgr.spec.volume_group_replication_content_name.clone().unwrap_or_default();
            let content = Api::<VolumeGroupReplicationContent>::all(ctx.client.clone())
                .get_opt(&content_name)
                .await
                .map_err(|e| transient(format!("reading VolumeGroupReplicationContent {content_name}: {e}")))?
                .ok_or_else(|| {
                    transient(format!("the group {} has no VolumeGroupReplicationContent yet", source.name))
                })?;
            let handle = content.spec.volume_group_replication_handle.clone().filter(|h| !h.is_empty());
            let handle =
                handle.ok_or_else(|| transient(format!("the volume group of {} is not created yet", source.name)))?;
            Ok((Source::Group { vgr: Box::new(vgr), content: Box::new(content) }, handle))
        }
        _ => Err(permanent(format!(
            "unsupported datasource {}{}/{}: PersistentVolumeClaim or {}/VolumeGroupReplication",
            if group.is_empty() { String::new() } else { format!("{group}/") },
            source.kind,
            source.name,
            rep::GROUP_API
        ))),
    }
}

/// The CSI handle of a bound PVC's PV, which must belong to `driver`.
pub async fn csi_handle(ctx: &Context, pvc: &PersistentVolumeClaim, driver: &str) -> Result<String, SourceProblem> {
    let name = format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any());
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|_| bound);
    let Some(pv_name) = pv_name else {
        return Err(transient(format!("PVC {name} is not bound yet")));
    };
    let pv = Api::<CsiPv>::all(ctx.client.clone())
        .get_opt(&pv_name)
        .await
        .map_err(|e| transient(format!("reading PV {pv_name}: {e}")))?
        .ok_or_else(|| transient(format!("PV {pv_name} of PVC {name} not found")))?;
    let Some(csi) = pv.spec.and_then(|s| s.csi) else {
        return Err(permanent(format!("PV {pv_name} of PVC {name} is not a CSI volume")));
    };
    if csi.driver != driver {
        return Err(permanent(format!(
            "PV {pv_name} of PVC {name} belongs to driver {}, the class to {driver}",
            csi.driver
        )));
    }
    Ok(csi.volume_handle)
}

/// Marks the source as this VolumeReplication's: a PVC gets the owner annotation and the
/// `pvc-protection` finalizer; a group's VGR the owner annotation and its content our finalizer.
pub async fn claim(ctx: &Context, vr: &VolumeReplication, source: &Source) -> Result<(), ReconcileError> {
    let name = vr.name_any();
    match source {
        Source::Pvc(pvc) => {
            if pvc.annotations().get(VR_OWNER) != Some(&name) || !pvc.finalizers().iter().any(|f| f == PVC_FINALIZER) {
                let mut finalizers: Vec<String> =
                    pvc.finalizers().iter().filter(|f| *f != PVC_FINALIZER).cloned().collect();
                finalizers.push(PVC_FINALIZER.to_owned());
                let patch = json!({"metadata": {
                    "annotations": {VR_OWNER: name}, "finalizers": finalizers, "resourceVersion": pvc.resource_version(),
                }});
                patch_merge(ctx, pvc.as_ref(), &patch).await?;
            }
        }
        Source::Group { vgr, content } => {
            if vgr.annotations().get(VR_OWNER) != Some(&name) {
                patch_merge(ctx, vgr.as_ref(), &json!({"metadata": {"annotations": {VR_OWNER: name}}})).await?;
            }
            super::set_finalizer(ctx, content.as_ref(), VR_FINALIZER, true).await?;
        }
    }
    Ok(())
}

/// Undoes `claim` where the source is still this VolumeReplication's.
pub async fn release(ctx: &Context, vr: &VolumeReplication, source: Option<&Source>) -> Result<(), ReconcileError> {
    let name = vr.name_any();
    match source {
        Some(Source::Pvc(pvc)) if pvc.annotations().get(VR_OWNER) == Some(&name) => {
            let finalizers: Vec<String> = pvc.finalizers().iter().filter(|f| *f != PVC_FINALIZER).cloned().collect();
            let patch = json!({"metadata": {
                "annotations": {VR_OWNER: null}, "finalizers": finalizers, "resourceVersion": pvc.resource_version(),
            }});
            patch_merge(ctx, pvc.as_ref(), &patch).await?;
        }
        Some(Source::Group { vgr, content }) => {
            super::set_finalizer(ctx, content.as_ref(), VR_FINALIZER, false).await?;
            if vgr.annotations().get(VR_OWNER) == Some(&name) {
                patch_merge(ctx, vgr.as_ref(), &json!({"metadata": {"annotations": {VR_OWNER: null}}})).await?;
            }
        }
        _ => {}
    }
    Ok(())
}
