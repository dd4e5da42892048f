//! The operator's command line: every flag also from an environment variable, the images from
//! the ones the CSV sets (and lists as `relatedImages`).
use std::time::Duration;

use clap::Parser;

use crate::assets::{DEFAULT_NAMESPACE, DefaultImages};

fn duration(text: &str) -> Result<Duration, go_flags::GoValueError> {
    go_flags::parse_go_duration(text)
}

fn boolean(text: &str) -> Result<bool, go_flags::GoValueError> {
    go_flags::parse_go_bool(text)
}

/// reference-driver-operator: one ReferenceCSIDriver object gives the reference CSI driver with
/// CSI-Addons wired up.
#[derive(Parser, Debug, Clone)]
#[command(name = "reference-driver-operator", version = build_info::LONG_VERSION)]
pub struct Cli {
    /// Kubeconfig file (else KUBECONFIG, the Pod's ServiceAccount, ~/.kube/config).
    #[arg(long, env = "OPERATOR_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The operator's namespace: where its Lease lives.
    #[arg(long, env = "POD_NAMESPACE", default_value = "reference-driver-operator")]
    pub namespace: String,
    /// Where the driver runs (a namespace the operator creates, Pod Security `privileged`).
    #[arg(long, env = "DRIVER_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub driver_namespace: String,
    /// The one caller the driver's CSI-Addons sidecars admit: the CSI-Addons manager's ServiceAccount.
    #[arg(
        long,
        env = "MANAGER_IDENTITY",
        default_value = "system:serviceaccount:csi-addons-system:csi-addons-controller-manager"
    )]
    pub manager_identity: String,
    /// Issue (or renew, when due) the CSI-Addons sidecars' CA and serving certificate in
    /// --driver-namespace, publish the CA on the driver's CSIDriver, and exit: how a driver
    /// installed by hand (deploy/reference-driver/) gets sidecars the manager verifies.
    #[arg(long, env = "ISSUE_SIDECAR_CERTIFICATES", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub issue_sidecar_certificates: bool,
    /// Compete for a Lease so that one replica acts at a time.
    #[arg(long, env = "LEADER_ELECT", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub leader_elect: bool,
    #[arg(long, env = "LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub leader_election_lease_duration: Duration,
    #[arg(long, env = "LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = duration)]
    pub leader_election_renew_deadline: Duration,
    #[arg(long, env = "LEADER_ELECTION_RETRY_PERIOD", default_value = "5s", value_parser = duration)]
    pub leader_election_retry_period: Duration,
    /// Where `/metrics` is served (`0` turns it off).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = ":8080")]
    pub metrics_bind_address: String,
    /// Where `/healthz` and `/readyz` are served.
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    pub health_probe_bind_address: String,
    /// Log as JSON lines.
    #[arg(long, env = "LOG_JSON", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub log_json: bool,
    /// Log verbosity: 0 info, ≥ 4 debug, ≥ 6 trace.
    #[arg(short = 'v', long = "v", env = "LOG_VERBOSITY", default_value_t = 0)]
    pub verbosity: u8,
    #[arg(long, env = "DRIVER_IMAGE")]
    pub driver_image: Option<String>,
    #[arg(long, env = "CSI_ADDONS_SIDECAR_IMAGE")]
    pub csi_addons_sidecar_image: Option<String>,
    #[arg(long, env = "PROVISIONER_IMAGE")]
    pub provisioner_image: Option<String>,
    #[arg(long, env = "ATTACHER_IMAGE")]
    pub attacher_image: Option<String>,
    #[arg(long, env = "RESIZER_IMAGE")]
    pub resizer_image: Option<String>,
    #[arg(long, env = "NODE_REGISTRAR_IMAGE")]
    pub node_registrar_image: Option<String>,
}

impl Cli {
    /// The command line, Go's single-dash forms accepted.
    pub fn parse_args() -> Self {
        use clap::CommandFactory;
        Self::parse_from(go_flags::normalize(&Self::command(), std::env::args_os()))
    }

    /// The images the environment gives; empty values count as unset.
    pub fn images(&self) -> DefaultImages {
        let set = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
        DefaultImages {
            driver: set(&self.driver_image),
            csi_addons_sidecar: set(&self.csi_addons_sidecar_image),
            provisioner: set(&self.provisioner_image),
            attacher: set(&self.attacher_image),
            resizer: set(&self.resizer_image),
            node_registrar: set(&self.node_registrar_image),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_forms_and_defaults() {
        use clap::CommandFactory;
        let args = ["op", "-leader-elect", "-driver-namespace=drivers", "--driver-image=", "--attacher-image=a:1"];
        let cli =
            Cli::try_parse_from(go_flags::normalize(&Cli::command(), args.map(std::ffi::OsString::from))).unwrap();
        assert!(cli.leader_elect);
        assert_eq!(cli.driver_namespace, "drivers");
        assert_eq!(cli.images(), DefaultImages { attacher: Some("a:1".into()), ..Default::default() });
        assert_eq!(cli.leader_election_lease_duration, Duration::from_secs(15));
    }
}
