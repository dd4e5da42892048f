//! What the annotation controller keeps of a PVC: its metadata, class, volume and phase. Decoded
//! straight into this shape, a PVC costs about 440 bytes plus its strings in the cache instead of
//! k8s-openapi's 1,008 (ten thousand PVCs: some 6 MB less), and the rest of each object is never
//! built. Events and API paths are a PVC's (`kube::Resource` inherited).
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::core::slim::Slimmable;

#[derive(kube::Resource, Clone, Debug, Default, Deserialize, Serialize)]
#[resource(inherit = PersistentVolumeClaim)]
pub struct Claim {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ClaimSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ClaimStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, Hash, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, Hash, PartialEq, Eq)]
pub struct ClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// A PVC's class, volume and phase: what the slim PVC cache keeps beside the metadata
/// (`core::slim`).
#[derive(Clone, Debug, Default)]
pub struct ClaimBody {
    pub spec: Option<ClaimSpec>,
    pub status: Option<ClaimStatus>,
}

fn storage_class(spec: Option<&ClaimSpec>) -> Option<&str> {
    spec.and_then(|s| s.storage_class_name.as_deref())
}

fn bound_volume<'a>(spec: Option<&'a ClaimSpec>, status: Option<&ClaimStatus>) -> Option<&'a str> {
    let bound = status.and_then(|s| s.phase.as_deref()) == Some("Bound");
    spec.and_then(|s| s.volume_name.as_deref()).filter(|v| bound && !v.is_empty())
}

impl ClaimBody {
    pub fn storage_class(&self) -> Option<&str> {
        storage_class(self.spec.as_ref())
    }

    /// The PV of a Bound PVC.
    pub fn bound_volume(&self) -> Option<&str> {
        bound_volume(self.spec.as_ref(), self.status.as_ref())
    }
}

impl Slimmable for Claim {
    type Rest = ClaimBody;
    fn split(self) -> (ObjectMeta, ClaimBody) {
        (self.metadata, ClaimBody { spec: self.spec, status: self.status })
    }
    fn join(metadata: ObjectMeta, body: &ClaimBody) -> Self {
        Claim { metadata, spec: body.spec.clone(), status: body.status.clone() }
    }
}

impl Claim {
    pub fn storage_class(&self) -> Option<&str> {
        storage_class(self.spec.as_ref())
    }

    /// The PV of a Bound PVC.
    pub fn bound_volume(&self) -> Option<&str> {
        bound_volume(self.spec.as_ref(), self.status.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use serde_json::json;

    #[test]
    fn a_pvc_decodes_into_what_scheduling_reads() {
        let claim: Claim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"storageClassName": "fast", "volumeName": "pv-1", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}},
        }))
        .unwrap();
        assert_eq!((claim.storage_class(), claim.bound_volume()), (Some("fast"), Some("pv-1")));
        assert_eq!(
            (Claim::kind(&()), Claim::api_version(&()), Claim::plural(&())),
            ("PersistentVolumeClaim".into(), "v1".into(), "persistentvolumeclaims".into())
        );
        assert!(std::mem::size_of::<Claim>() < std::mem::size_of::<PersistentVolumeClaim>() / 2);
        let pending: Claim = serde_json::from_value(
            json!({"metadata": {"name": "q"}, "spec": {"volumeName": "pv-2"}, "status": {"phase": "Pending"}}),
        )
        .unwrap();
        assert_eq!(pending.bound_volume(), None);
        let bare: Claim = serde_json::from_value(json!({"metadata": {"name": "r"}})).unwrap();
        assert_eq!((bare.storage_class(), bare.bound_volume()), (None, None));
    }
}
