//! A PersistentVolume as the sidecar reads it: the CSI source, volume mode, access modes and
//! claim. k8s-openapi's type brings the deserialisers of every in-tree volume source, code that
//! would stay mapped in every driver Pod for the process's life, for reads that need these alone.
//! Its identity (group, version, kind, plural, scope) comes from k8s-openapi's type: constants,
//! none of that type's code.
use std::collections::HashMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

#[derive(kube::Resource, Clone, Debug, Deserialize)]
#[resource(inherit = PersistentVolume)]
pub struct CsiPv {
    pub metadata: ObjectMeta,
    pub spec: Option<CsiPvSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiPvSpec {
    pub csi: Option<CsiSource>,
    pub volume_mode: Option<String>,
    pub access_modes: Option<Vec<String>>,
    pub claim_ref: Option<Reference>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiSource {
    pub driver: String,
    pub volume_handle: String,
    pub volume_attributes: Option<HashMap<String, String>>,
    pub node_stage_secret_ref: Option<Reference>,
}

/// A Secret reference or a claim reference: the parts the sidecar uses.
#[derive(Clone, Debug, Deserialize)]
pub struct Reference {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pv_reads_its_csi_source_and_claim_and_ignores_the_rest() {
        let pv: CsiPv = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1"},
            "spec": {
                "capacity": {"storage": "1Gi"}, "volumeMode": "Block", "accessModes": ["ReadWriteOnce"],
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "data", "uid": "u-1"},
                "csi": {"driver": "d.example.com", "volumeHandle": "h-1", "fsType": "ext4",
                        "volumeAttributes": {"pool": "fast"},
                        "nodeStageSecretRef": {"namespace": "s-ns", "name": "s"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": []}}
            },
            "status": {"phase": "Bound"}
        }))
        .unwrap();
        let spec = pv.spec.unwrap();
        let csi = spec.csi.unwrap();
        assert_eq!((csi.driver.as_str(), csi.volume_handle.as_str()), ("d.example.com", "h-1"));
        assert_eq!(csi.volume_attributes.unwrap()["pool"], "fast");
        assert_eq!(csi.node_stage_secret_ref.unwrap().name.as_deref(), Some("s"));
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce"]);
        assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some("u-1"));
        let in_tree: CsiPv = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-2"}, "spec": {"hostPath": {"path": "/data"}}
        }))
        .unwrap();
        assert!(in_tree.spec.unwrap().csi.is_none());
    }
}
