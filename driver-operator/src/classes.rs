//! The classes users pick. One StorageClass per storage profile the backend reports: applied
//! while the profile is reported, never deleted (a backend that is away for a while is no reason
//! to break claims). And the CSI-Addons classes, each only once a sidecar of the driver
//! advertises the capability it needs (from the CSIAddonsNodes' status) and the spec asks for it.
use std::collections::{BTreeMap, BTreeSet};

use api::csiaddons::{NetworkFenceClass, NetworkFenceClassSpec};
use api::driver::{AddonsClasses, DRIVER_NAME};
use api::replication::{
    VolumeGroupReplicationClass, VolumeGroupReplicationClassSpec, VolumeReplicationClass, VolumeReplicationClassSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::credentials::{Credentials, secret_parameters};
use crate::names::MANAGED_BY;

/// The annotation the CSI-Addons manager reads a StorageClass's reclaim-space schedule from.
pub const RECLAIM_SCHEDULE: &str = "reclaimspace.csiaddons.openshift.io/schedule";

fn meta(name: String, annotations: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        labels: Some(BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())])),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..Default::default()
    }
}

/// The StorageClass of `profile`: `reference-csi-<profile>`, asking the driver for that profile,
/// with the reclaim-space schedule when one is set.
pub fn storage_class(profile: &str, schedule: Option<&str>) -> StorageClass {
    let annotations = schedule.map(|s| (RECLAIM_SCHEDULE.to_owned(), s.to_owned())).into_iter().collect();
    StorageClass {
        metadata: meta(format!("reference-csi-{profile}"), annotations),
        provisioner: DRIVER_NAME.to_owned(),
        parameters: Some(BTreeMap::from([("profile".to_owned(), profile.to_owned())])),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
        allow_volume_expansion: Some(true),
        ..Default::default()
    }
}

/// The CSI-Addons classes to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct AddonsClassSet {
    pub replication: Option<VolumeReplicationClass>,
    pub group_replication: Option<VolumeGroupReplicationClass>,
    pub network_fence: Option<NetworkFenceClass>,
}

/// The classes `wanted` asks for whose capability some sidecar advertises (`capabilities`: the
/// union of the driver's CSIAddonsNodes' lists), naming the copied credentials in `namespace`
/// when there are any.
pub fn addons_classes(
    capabilities: &BTreeSet<String>,
    wanted: &AddonsClasses,
    credentials: &Credentials,
    namespace: &str,
) -> AddonsClassSet {
    let offers = |capability: &str| capabilities.contains(capability);
    let provisioner = DRIVER_NAME.to_owned();
    let replication_parameters = |secret_prefix: &str| {
        let mut parameters = BTreeMap::from([("schedulingInterval".to_owned(), "1m".to_owned())]);
        parameters.extend(secret_parameters(secret_prefix, namespace, credentials));
        Some(parameters)
    };
    let fence_parameters = secret_parameters("csiaddons.openshift.io/networkfence-secret", namespace, credentials);
    AddonsClassSet {
        replication: (wanted.volume_replication && offers("volume_replication.VOLUME_REPLICATION")).then(|| {
            VolumeReplicationClass {
                metadata: meta("reference-csi-replication".into(), BTreeMap::new()),
                spec: VolumeReplicationClassSpec {
                    provisioner: provisioner.clone(),
                    parameters: replication_parameters("replication.storage.openshift.io/replication-secret"),
                },
                status: None,
            }
        }),
        group_replication: (wanted.volume_group_replication && offers("volume_group.VOLUME_GROUP")).then(|| {
            VolumeGroupReplicationClass {
                metadata: meta("reference-csi-group-replication".into(), BTreeMap::new()),
                spec: VolumeGroupReplicationClassSpec {
                    provisioner: provisioner.clone(),
                    parameters: replication_parameters("replication.storage.openshift.io/group-replication-secret"),
                },
                status: None,
            }
        }),
        network_fence: (wanted.network_fence && offers("network_fence.NETWORK_FENCE")).then(|| NetworkFenceClass {
            metadata: meta("reference-csi-fence".into(), BTreeMap::new()),
            spec: NetworkFenceClassSpec {
                provisioner,
                parameters: (!fence_parameters.is_empty()).then_some(fence_parameters),
            },
            status: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storage_class_per_profile_with_the_schedule() {
        let class = storage_class("block", Some("@weekly"));
        assert_eq!(class.metadata.name.as_deref(), Some("reference-csi-block"));
        assert_eq!(class.parameters.as_ref().unwrap()["profile"], "block");
        assert_eq!(class.metadata.annotations.as_ref().unwrap()[RECLAIM_SCHEDULE], "@weekly");
        assert!(storage_class("filesystem", None).metadata.annotations.is_none());
    }

    /// The capabilities of a sidecar offering every class.
    fn every_capability() -> BTreeSet<String> {
        ["volume_replication.VOLUME_REPLICATION", "volume_group.VOLUME_GROUP", "network_fence.NETWORK_FENCE"]
            .map(str::to_owned)
            .into()
    }

    #[test]
    fn addons_classes_need_the_capability_and_the_spec() {
        let all = every_capability();
        let (none_asked, ns) = (&Credentials::NotAsked, "csi-addons-reference");
        let set = addons_classes(&all, &AddonsClasses::default(), none_asked, ns);
        assert!(set.replication.is_some() && set.group_replication.is_some() && set.network_fence.is_some());
        assert!(set.network_fence.unwrap().spec.parameters.is_none(), "no credentials: no secret parameters");
        let no_fence = AddonsClasses { network_fence: false, ..Default::default() };
        assert!(addons_classes(&all, &no_fence, none_asked, ns).network_fence.is_none());
        let node_only: BTreeSet<String> = ["reclaim_space.ONLINE".to_owned()].into();
        let none = addons_classes(&node_only, &AddonsClasses::default(), none_asked, ns);
        assert_eq!(none, AddonsClassSet { replication: None, group_replication: None, network_fence: None });
    }

    #[test]
    fn with_credentials_every_addons_class_names_the_copy() {
        let all = every_capability();
        let set = addons_classes(&all, &AddonsClasses::default(), &Credentials::Copied(2), "csi-addons-reference");
        let replication = set.replication.unwrap().spec.parameters.unwrap();
        assert_eq!(replication["replication.storage.openshift.io/replication-secret-name"], crate::credentials::COPY);
        assert_eq!(replication["schedulingInterval"], "1m");
        let group = set.group_replication.unwrap().spec.parameters.unwrap();
        assert_eq!(
            group["replication.storage.openshift.io/group-replication-secret-namespace"],
            "csi-addons-reference"
        );
        let fence = set.network_fence.unwrap().spec.parameters.unwrap();
        assert_eq!(fence["csiaddons.openshift.io/networkfence-secret-name"], crate::credentials::COPY);
    }
}
