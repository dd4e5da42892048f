//! The command line of `csi-addons`: upstream's flags (Go single-dash forms too) and operation names.
use clap::{Parser, ValueEnum};

/// Command line of `csi-addons`.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-addons", version = build_info::LONG_VERSION, about = "Call a CSI-Addons driver directly")]
pub struct Cli {
    /// The driver's CSI-Addons endpoint: `unix:///path` or `host:port`.
    #[arg(long, env = "CSIADDONS_ENDPOINT", default_value = "unix:///tmp/csi-addons.sock")]
    pub endpoint: String,
    /// The kubelet's CSI staging directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins/kubernetes.io/csi/")]
    pub stagingpath: String,
    /// The operation to run.
    #[arg(long, value_enum)]
    pub operation: Operation,
    /// The PersistentVolume to operate on.
    #[arg(long)]
    pub persistentvolume: Option<String>,
    /// The VolumeGroupReplicationContent to replicate (its group handle).
    #[arg(long)]
    pub volumegroupreplicationcontent: Option<String>,
    /// The driver name, for NodeReclaimSpace's staging path.
    #[arg(long)]
    pub drivername: Option<String>,
    /// A Secret as `namespace/name`.
    #[arg(long)]
    pub secret: Option<String>,
    /// CIDR blocks, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub cidrs: Vec<String>,
    /// Cluster ID, sent as parameter `clusterID`.
    #[arg(long)]
    pub clusterid: Option<String>,
    /// Use the pre-1.24 staging path `<stagingpath>/pv/<pv>/globalmount`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", value_parser = go_flags::parse_go_bool)]
    pub legacy: bool,
    /// Name of the volume group to create.
    #[arg(long)]
    pub volumegroupname: Option<String>,
    /// ID of the volume group.
    #[arg(long)]
    pub volumegroupid: Option<String>,
    /// Parameters, `k1=v1,k2=v2`.
    #[arg(long, value_delimiter = ',')]
    pub parameters: Vec<String>,
    /// Volume IDs, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub volumeids: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// The 18 operations, named as upstream names them.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    #[value(name = "GetIdentity")]
    GetIdentity,
    #[value(name = "GetCapabilities")]
    GetCapabilities,
    #[value(name = "Probe")]
    Probe,
    #[value(name = "ControllerReclaimSpace")]
    ControllerReclaimSpace,
    #[value(name = "NodeReclaimSpace")]
    NodeReclaimSpace,
    #[value(name = "NetworkFence")]
    NetworkFence,
    #[value(name = "NetworkUnFence")]
    NetworkUnFence,
    #[value(name = "EnableVolumeReplication")]
    EnableVolumeReplication,
    #[value(name = "DisableVolumeReplication")]
    DisableVolumeReplication,
    #[value(name = "PromoteVolume")]
    PromoteVolume,
    #[value(name = "DemoteVolume")]
    DemoteVolume,
    #[value(name = "ResyncVolume")]
    ResyncVolume,
    #[value(name = "GetVolumeReplicationInfo")]
    GetVolumeReplicationInfo,
    #[value(name = "CreateVolumeGroup")]
    CreateVolumeGroup,
    #[value(name = "ModifyVolumeGroupMembership")]
    ModifyVolumeGroupMembership,
    #[value(name = "DeleteVolumeGroup")]
    DeleteVolumeGroup,
    #[value(name = "ControllerGetVolumeGroup")]
    ControllerGetVolumeGroup,
    #[value(name = "EncryptionKeyRotation")]
    EncryptionKeyRotation,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

/// Parses the process's arguments, accepting Go-style single-dash flags.
pub fn parse() -> Cli {
    use clap::CommandFactory;
    Cli::parse_from(go_flags::normalize(&Cli::command(), std::env::args_os()))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn go_style_arguments_parse() {
        let args = [
            "csi-addons",
            "-endpoint=unix:///x.sock",
            "-operation",
            "NetworkFence",
            "-cidrs=10.0.0.0/8,192.0.2.1/32",
            "-legacy",
        ];
        let cli = Cli::try_parse_from(go_flags::normalize(&Cli::command(), args.map(Into::into))).unwrap();
        assert_eq!(cli.endpoint, "unix:///x.sock");
        assert_eq!(cli.operation, Operation::NetworkFence);
        assert_eq!(cli.cidrs, ["10.0.0.0/8", "192.0.2.1/32"]);
        assert!(cli.legacy);
    }

    #[test]
    fn an_unknown_operation_is_a_clear_error() {
        let err = Cli::try_parse_from(["csi-addons", "--operation", "Reclaim"]).unwrap_err().to_string();
        assert!(err.contains("invalid value 'Reclaim'") && err.contains("ControllerReclaimSpace"), "{err}");
    }

    #[test]
    fn eighteen_operations() {
        assert_eq!(Operation::value_variants().len(), 18);
    }
}
