//! What a VolumeReplication replicates: a PVC (its PV's CSI handle) or a VolumeGroupReplication
//! (its content's group handle), and how the source is marked as taken and released.
use api::replication::{VolumeGroupReplication, VolumeGroupReplicationContent, VolumeReplication};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::compact::CsiPv;
use crate::controllers::replication::{self as rep, PVC_FINALIZER, VR_FINALIZER, VR_OWNER};
use crate::core::Core;
use crate::core::patch::patch_merge;

/// What is wrong with a source: the message of the status, and (`transient`) whether waiting may
/// help.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("reading PVC {pvc}: {source}")]
    ReadPvc {
        pvc: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("PVC {0} not found")]
    NoPvc(String),
    #[error("PVC {0} is being deleted: a terminating PVC is not replicated")]
    Terminating(String),
    #[error("PVC {pvc}: {conflict}")]
    Taken { pvc: String, conflict: String },
    #[error("reading VolumeGroupReplication {group}: {source}")]
    ReadGroup {
        group: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("VolumeGroupReplication {0} not found")]
    NoGroup(String),
    #[error("reading VolumeGroupReplicationContent {content}: {source}")]
    ReadContent {
        content: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("the group {0} has no VolumeGroupReplicationContent yet")]
    NoContent(String),
    #[error("the volume group of {0} is not created yet")]
    NoVolumeGroup(String),
    #[error("unsupported datasource {kind}/{name}: PersistentVolumeClaim or {}/VolumeGroupReplication", rep::GROUP_API)]
    Unsupported { kind: String, name: String },
    #[error("PVC {0} is not bound yet")]
    NotBound(String),
    #[error("reading PV {pv}: {source}")]
    ReadPv {
        pv: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("PV {pv} of PVC {pvc} not found")]
    NoPv { pv: String, pvc: String },
    #[error("PV {pv} of PVC {pvc} is not a CSI volume")]
    NotCsi { pv: String, pvc: String },
    #[error("PV {pv} of PVC {pvc} belongs to driver {driver}, the class to {class_driver}")]
    OtherDriver { pv: String, pvc: String, driver: String, class_driver: String },
}

impl SourceError {
    /// Whether waiting may help (the source may yet appear, bind, or be let go).
    pub fn transient(&self) -> bool {
        !matches!(
            self,
            SourceError::Terminating(_)
                | SourceError::Unsupported { .. }
                | SourceError::NotCsi { .. }
                | SourceError::OtherDriver { .. }
        )
    }
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
pub async fn fetch(ctx: &Core, vr: &VolumeReplication, driver: &str) -> Result<(Source, String), SourceError> {
    let namespace = vr.namespace().unwrap_or_default();
    let source = &vr.spec.data_source;
    let full = format!("{namespace}/{}", source.name);
    match source.kind.as_str() {
        "PersistentVolumeClaim" => {
            let pvc = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace)
                .get_opt(&source.name)
                .await
                .map_err(|e| SourceError::ReadPvc { pvc: full.clone(), source: Box::new(e) })?
                .ok_or_else(|| SourceError::NoPvc(full.clone()))?;
            // As upstream: a terminating PVC is not taken on; one replicated already (the
            // finalizer) stays until its VolumeReplication goes.
            if pvc.metadata.deletion_timestamp.is_some() && !pvc.finalizers().iter().any(|f| f == PVC_FINALIZER) {
                return Err(SourceError::Terminating(full));
            }
            if let Some(conflict) = rep::ownership_conflict(pvc.annotations(), &vr.name_any()) {
                return Err(SourceError::Taken { pvc: full, conflict });
            }
            let handle = csi_handle(ctx, &pvc, driver).await?;
            Ok((Source::Pvc(Box::new(pvc)), handle))
        }
        "VolumeGroupReplication" => {
            let vgr = Api::<VolumeGroupReplication>::namespaced(ctx.client.clone(), &namespace)
                .get_opt(&source.name)
                .await
                .map_err(|e| SourceError::ReadGroup { group: full.clone(), source: Box::new(e) })?
                .ok_or_else(|| SourceError::NoGroup(full.clone()))?;
            let content_name = vgr.spec.volume_group_replication_content_name.clone().unwrap_or_default();
            let content = Api::<VolumeGroupReplicationContent>::all(ctx.client.clone())
                .get_opt(&content_name)
                .await
                .map_err(|e| SourceError::ReadContent { content: content_name.clone(), source: Box::new(e) })?
                .ok_or_else(|| SourceError::NoContent(source.name.clone()))?;
            let handle = content.spec.volume_group_replication_handle.clone().filter(|h| !h.is_empty());
            let handle = handle.ok_or_else(|| SourceError::NoVolumeGroup(source.name.clone()))?;
            Ok((Source::Group { vgr: Box::new(vgr), content: Box::new(content) }, handle))
        }
        _ => {
            let group = source.api_group.as_deref().filter(|g| !g.is_empty());
            let kind = group.map_or_else(|| source.kind.clone(), |g| format!("{g}/{}", source.kind));
            Err(SourceError::Unsupported { kind, name: source.name.clone() })
        }
    }
}

/// The CSI handle of a bound PVC's PV, which must belong to `driver`.
pub async fn csi_handle(ctx: &Core, pvc: &PersistentVolumeClaim, driver: &str) -> Result<String, SourceError> {
    let name = format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any());
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|_| bound);
    let Some(pv_name) = pv_name else {
        return Err(SourceError::NotBound(name));
    };
    let pv = Api::<CsiPv>::all(ctx.client.clone())
        .get_opt(&pv_name)
        .await
        .map_err(|e| SourceError::ReadPv { pv: pv_name.clone(), source: Box::new(e) })?
        .ok_or_else(|| SourceError::NoPv { pv: pv_name.clone(), pvc: name.clone() })?;
    let Some(csi) = pv.spec.and_then(|s| s.csi) else {
        return Err(SourceError::NotCsi { pv: pv_name, pvc: name });
    };
    if csi.driver != driver {
        return Err(SourceError::OtherDriver {
            pv: pv_name,
            pvc: name,
            driver: csi.driver,
            class_driver: driver.to_owned(),
        });
    }
    Ok(csi.volume_handle)
}

/// Marks the source as this VolumeReplication's: a PVC gets the owner annotation and the
/// `pvc-protection` finalizer; a group's VGR the owner annotation and its content our finalizer.
pub async fn claim(ctx: &Core, vr: &VolumeReplication, source: &Source) -> Result<(), kube::Error> {
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
            crate::core::patch::set_finalizer(ctx, content.as_ref(), VR_FINALIZER, true).await?;
        }
    }
    Ok(())
}

/// The source as it stands, when a VolumeReplication that cannot be served (its class or driver is
/// gone) still has something to release: its PVC, or its group and the group's content.
pub async fn fetch_claimed(ctx: &Core, vr: &VolumeReplication) -> Result<Option<Source>, kube::Error> {
    let namespace = vr.namespace().unwrap_or_default();
    let name = &vr.spec.data_source.name;
    match vr.spec.data_source.kind.as_str() {
        "PersistentVolumeClaim" => {
            let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace);
            Ok(pvcs.get_opt(name).await?.map(|pvc| Source::Pvc(Box::new(pvc))))
        }
        "VolumeGroupReplication" => {
            let groups = Api::<VolumeGroupReplication>::namespaced(ctx.client.clone(), &namespace);
            let Some(vgr) = groups.get_opt(name).await? else { return Ok(None) };
            let content_name = vgr.spec.volume_group_replication_content_name.clone().unwrap_or_default();
            if content_name.is_empty() {
                return Ok(None);
            }
            let contents = Api::<VolumeGroupReplicationContent>::all(ctx.client.clone());
            let content = contents.get_opt(&content_name).await?;
            Ok(content.map(|content| Source::Group { vgr: Box::new(vgr), content: Box::new(content) }))
        }
        _ => Ok(None),
    }
}

/// Undoes `claim` where the source is still this VolumeReplication's.
pub async fn release(ctx: &Core, vr: &VolumeReplication, source: Option<&Source>) -> Result<(), kube::Error> {
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
            crate::core::patch::set_finalizer(ctx, content.as_ref(), VR_FINALIZER, false).await?;
            if vgr.annotations().get(VR_OWNER) == Some(&name) {
                patch_merge(ctx, vgr.as_ref(), &json!({"metadata": {"annotations": {VR_OWNER: null}}})).await?;
            }
        }
        _ => {}
    }
    Ok(())
}
