//! What the three replication controllers (VolumeReplication, VolumeGroupReplication and its
//! content) share, without I/O: the finalizer and annotation names, a class's parameters, the
//! subject of condition messages, gRPC errors in upstream's words, the `DestinationInfoAvailable`
//! condition, and PVC ownership between VolumeReplications and VolumeGroupReplications.
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::core::status::condition;

/// Upstream's finalizer on VolumeReplications.
pub const VR_FINALIZER: &str = "replication.storage.openshift.io";
/// Upstream's finalizer on a PVC a VolumeReplication replicates.
pub const PVC_FINALIZER: &str = "replication.storage.openshift.io/pvc-protection";
/// On a PVC: the VolumeReplication that replicates it.
pub const VR_OWNER: &str = "replication.storage.openshift.io/volume-replication-name";
/// On a PVC: the VolumeGroupReplication it is a member of.
pub const VGR_OWNER: &str = "replication.storage.openshift.io/volume-group-replication-name";
/// On a VolumeGroupReplication, its member PVCs and its content while it exists.
pub const VGR_FINALIZER: &str = "replication.storage.openshift.io/vgr-protection";
/// On a VolumeGroupReplicationContent and the VolumeReplication of a group: `<namespace>/<name>`
/// of the VolumeGroupReplication.
pub const GROUP_REF: &str = "replication.storage.openshift.io/volumegroupref";
/// On a VolumeGroupReplicationContent: the driver.
pub const PROVISIONED_BY: &str = "replication.storage.openshift.io/provisioned-by";
/// On a VolumeGroupReplication: its content.
pub const CONTENT_NAME: &str = "replication.storage.openshift.io/volume-group-replication-content-name";
pub const VOLUME_GROUP: &str = "volume_group.VOLUME_GROUP";
/// The API group of the replication kinds.
pub const GROUP_API: &str = "replication.storage.openshift.io";
pub const VOLUME_REPLICATION: &str = "volume_replication.VOLUME_REPLICATION";
pub const DESTINATION_INFO: &str = "volume_replication.GET_REPLICATION_DESTINATION_INFO";

const RESERVED_PREFIX: &str = "replication.storage.openshift.io/";
const SECRET_NAME: &str = "replication.storage.openshift.io/replication-secret-name";
const SECRET_NAMESPACE: &str = "replication.storage.openshift.io/replication-secret-namespace";
const GROUP_SECRET_NAME: &str = "replication.storage.openshift.io/group-replication-secret-name";
const GROUP_SECRET_NAMESPACE: &str = "replication.storage.openshift.io/group-replication-secret-namespace";

/// A replication class's parameters with the reserved keys taken out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassParameters {
    pub parameters: BTreeMap<String, String>,
    pub secret: Option<(String, String)>,
    pub group_secret: Option<(String, String)>,
}

/// What is wrong with a replication class's parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassParameterError {
    #[error("parameter {0} uses the reserved prefix {RESERVED_PREFIX} and is not a known key")]
    Unknown(String),
    #[error("parameter {0} is empty")]
    Empty(String),
    #[error("{0} and {1} must be set together")]
    HalfSecret(&'static str, &'static str),
}

/// Splits a class's parameters; only the four secret keys may use the reserved prefix.
pub fn class_parameters(parameters: Option<&BTreeMap<String, String>>) -> Result<ClassParameters, ClassParameterError> {
    let mut out = ClassParameters::default();
    let mut reserved = BTreeMap::new();
    for (key, value) in parameters.into_iter().flatten() {
        if !key.starts_with(RESERVED_PREFIX) {
            out.parameters.insert(key.clone(), value.clone());
            continue;
        }
        if ![SECRET_NAME, SECRET_NAMESPACE, GROUP_SECRET_NAME, GROUP_SECRET_NAMESPACE].contains(&key.as_str()) {
            return Err(ClassParameterError::Unknown(key.clone()));
        }
        if value.is_empty() {
            return Err(ClassParameterError::Empty(key.clone()));
        }
        reserved.insert(key.as_str(), value.clone());
    }
    let pair = |name: &'static str, namespace: &'static str| match (reserved.get(name), reserved.get(namespace)) {
        (Some(n), Some(ns)) => Ok(Some((n.clone(), ns.clone()))),
        (None, None) => Ok(None),
        _ => Err(ClassParameterError::HalfSecret(name, namespace)),
    };
    out.secret = pair(SECRET_NAME, SECRET_NAMESPACE)?;
    out.group_secret = pair(GROUP_SECRET_NAME, GROUP_SECRET_NAMESPACE)?;
    Ok(out)
}

/// "volume" or "volume group", the prefix of every condition message.
pub fn subject(source_kind: &str) -> &'static str {
    if source_kind == "VolumeGroupReplication" { "volume group" } else { "volume" }
}

/// A gRPC error as upstream's messages show it (Go's `err.Error()`):
/// `rpc error: code = <Code> desc = <message>`.
pub fn go_error(status: &tonic::Status) -> String {
    use tonic::Code;
    let code = match status.code() {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    };
    format!("rpc error: code = {code} desc = {}", status.message())
}

/// The `DestinationInfoAvailable` condition type.
pub const DESTINATION_CONDITION: &str = "DestinationInfoAvailable";

/// Where the destination of a volume or group stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Available,
    Pending,
    Failed(String),
    /// The sidecar has no GetReplicationDestinationInfo (upstream's v0.14.0): nothing to wait for.
    NotSupported,
}

/// The `DestinationInfoAvailable` condition for `destination`, with upstream's reasons and
/// messages (NotSupported is ours).
pub fn destination_condition(subject: &str, destination: &Destination, generation: Option<i64>) -> Condition {
    let (status, reason, message) = match destination {
        Destination::Available => (true, "DestinationInfoUpdated", format!("{subject} destination info is available")),
        Destination::Pending => {
            (false, "DestinationInfoPending", format!("{subject} destination info is pending update"))
        }
        Destination::Failed(why) => {
            (false, "FailedToGetDestinationInfo", format!("{subject} failed to get destination info: {why}"))
        }
        Destination::NotSupported => (
            false,
            "NotSupported",
            format!(
                "{subject} destination info is not available: the sidecar does not support GetReplicationDestinationInfo"
            ),
        ),
    };
    condition(DESTINATION_CONDITION, status, reason, &message, generation)
}

/// Why the PVC may not be replicated by VolumeReplication `vr`: replicated by another one, or a
/// member of a VolumeGroupReplication. Both directions are checked, whatever is already set
/// (upstream's check fires only when both annotations are there). [differs: pvc-one-owner]
pub fn ownership_conflict(annotations: &BTreeMap<String, String>, vr: &str) -> Option<String> {
    if let Some(owner) = annotations.get(VR_OWNER).filter(|o| o.as_str() != vr) {
        return Some(format!("the PVC is already replicated by VolumeReplication {owner}"));
    }
    annotations.get(VGR_OWNER).map(|group| {
        format!("the PVC is a member of VolumeGroupReplication {group}; a PVC is replicated by one VolumeReplication or one group, not both")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_parameters_become_secrets_and_unknown_ones_are_refused() {
        let params: BTreeMap<String, String> = [
            (SECRET_NAME.to_owned(), "s".to_owned()),
            (SECRET_NAMESPACE.to_owned(), "ns".to_owned()),
            ("mirroringMode".to_owned(), "snapshot".to_owned()),
        ]
        .into();
        let split = class_parameters(Some(&params)).unwrap();
        assert_eq!(split.secret, Some(("s".into(), "ns".into())));
        assert_eq!(split.parameters.keys().collect::<Vec<_>>(), ["mirroringMode"]);
        let bad: BTreeMap<String, String> =
            [("replication.storage.openshift.io/other".to_owned(), "x".to_owned())].into();
        assert!(class_parameters(Some(&bad)).unwrap_err().to_string().contains("not a known key"));
        let half: BTreeMap<String, String> = [(SECRET_NAME.to_owned(), "s".to_owned())].into();
        assert!(class_parameters(Some(&half)).unwrap_err().to_string().contains("set together"));
    }

    #[test]
    fn destination_conditions_say_the_subject() {
        let available = destination_condition("volume group", &Destination::Available, Some(1));
        assert_eq!((available.status.as_str(), available.reason.as_str()), ("True", "DestinationInfoUpdated"));
        assert_eq!(available.message, "volume group destination info is available");
        let pending = destination_condition("volume", &Destination::Pending, Some(1));
        assert_eq!(pending.message, "volume destination info is pending update");
        let failed = destination_condition("volume", &Destination::Failed("gone".into()), Some(1));
        assert_eq!(
            (failed.reason.as_str(), failed.message.as_str()),
            ("FailedToGetDestinationInfo", "volume failed to get destination info: gone")
        );
    }

    #[test]
    fn grpc_errors_read_as_gos() {
        assert_eq!(go_error(&tonic::Status::cancelled("stop")), "rpc error: code = Canceled desc = stop");
        assert_eq!(go_error(&tonic::Status::not_found("gone")), "rpc error: code = NotFound desc = gone");
    }

    #[test]
    fn a_pvc_belongs_to_one_replication_either_way() {
        let owned_by =
            |key: &str, value: &str| -> BTreeMap<String, String> { [(key.to_owned(), value.to_owned())].into() };
        assert_eq!(ownership_conflict(&BTreeMap::new(), "vr1"), None);
        assert_eq!(ownership_conflict(&owned_by(VR_OWNER, "vr1"), "vr1"), None);
        assert!(ownership_conflict(&owned_by(VR_OWNER, "vr2"), "vr1").unwrap().contains("VolumeReplication vr2"));
        assert!(ownership_conflict(&owned_by(VGR_OWNER, "g1"), "vr1").unwrap().contains("VolumeGroupReplication g1"));
    }
}
