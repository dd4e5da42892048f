//! CSI-Addons capabilities as strings, `<capability field>.<ENUM VALUE>` (e.g.
//! `reclaim_space.OFFLINE`): what CSIAddonsNode status lists and what the controller matches on.
//! Built from the enum names, never from a protobuf text rendering (upstream's derives them from a text form its protobuf library says may change).
use crate::proto::identity::{Capability, capability};

/// The string of one capability, or `None` for an empty one.
pub fn to_string(capability: &Capability) -> Option<String> {
    use capability::Type;
    let (field, value) = match capability.r#type.as_ref()? {
        Type::Service(s) => ("service", s.r#type().as_str_name()),
        Type::ReclaimSpace(r) => ("reclaim_space", r.r#type().as_str_name()),
        Type::NetworkFence(n) => ("network_fence", n.r#type().as_str_name()),
        Type::VolumeReplication(v) => ("volume_replication", v.r#type().as_str_name()),
        Type::VolumeGroup(v) => ("volume_group", v.r#type().as_str_name()),
        Type::EncryptionKeyRotation(e) => ("encryption_key_rotation", e.r#type().as_str_name()),
    };
    Some(format!("{field}.{value}"))
}

/// The strings of all capabilities, in the driver's order, without empty ones.
pub fn to_strings(capabilities: &[Capability]) -> Vec<String> {
    capabilities.iter().filter_map(to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::identity::capability::{NetworkFence, ReclaimSpace, Service, Type};

    #[test]
    fn capabilities_render_as_field_dot_value() {
        let caps = [
            Capability {
                r#type: Some(Type::Service(Service { r#type: capability::service::Type::NodeService as i32 })),
            },
            Capability {
                r#type: Some(Type::ReclaimSpace(ReclaimSpace {
                    r#type: capability::reclaim_space::Type::Online as i32,
                })),
            },
            Capability {
                r#type: Some(Type::NetworkFence(NetworkFence {
                    r#type: capability::network_fence::Type::GetClientsToFence as i32,
                })),
            },
            Capability { r#type: None },
        ];
        assert_eq!(
            to_strings(&caps),
            ["service.NODE_SERVICE", "reclaim_space.ONLINE", "network_fence.GET_CLIENTS_TO_FENCE"]
        );
    }
}
