//! The sidecar's command line: every flag of upstream's sidecar (same names, defaults and
//! meaning, Go single-dash forms too, each also settable from an environment variable), plus ours.
//! [differs: sidecar-flags]
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::filter::LevelFilter;

fn duration(text: &str) -> Result<Duration, go_flags::GoValueError> {
    go_flags::parse_go_duration(text)
}

fn boolean(text: &str) -> Result<bool, go_flags::GoValueError> {
    go_flags::parse_go_bool(text)
}

/// klog's `-v=N` as v0.14.0 took it, or a zap level name as upstream's main takes it.
fn log_level(text: &str) -> Result<LevelFilter, String> {
    if let Some(level) = runtime_support::logging::named_level(text) {
        return Ok(level);
    }
    match text.trim().parse::<u32>() {
        Ok(0..=3) => Ok(LevelFilter::INFO),
        Ok(4 | 5) => Ok(LevelFilter::DEBUG),
        Ok(_) => Ok(LevelFilter::TRACE),
        Err(_) => Err(format!("{text:?} is neither a verbosity number nor one of error, warn, info, debug")),
    }
}

/// Command line of `csi-addons-sidecar`.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-addons-sidecar", version = build_info::LONG_VERSION, about = "CSI-Addons sidecar")]
pub struct SidecarCli {
    /// Timeout of the sidecar's own calls to the driver (identity, probe).
    #[arg(long, env = "CSIADDONS_TIMEOUT", default_value = "3m", value_parser = duration)]
    pub timeout: Duration,
    /// The driver's CSI-Addons socket.
    #[arg(long, env = "CSIADDONS_ADDRESS", default_value = "/run/csi-addons/socket")]
    pub csi_addons_address: String,
    /// This node's ID (the Kubernetes node name).
    #[arg(long, env = "NODE_ID", default_value = "")]
    pub node_id: String,
    /// Base of computed staging paths.
    #[arg(long, env = "STAGING_PATH", default_value = "/var/lib/kubelet/plugins/kubernetes.io/csi/")]
    pub stagingpath: String,
    /// TCP port of the server the controller calls.
    #[arg(long, env = "CONTROLLER_PORT", default_value = "")]
    pub controller_port: String,
    /// IP to listen on; when set, the CSIAddonsNode endpoint is `ip:port`.
    #[arg(long, env = "CONTROLLER_IP", default_value = "")]
    pub controller_ip: String,
    /// This Pod's name (downward API).
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod: String,
    /// This Pod's namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pub namespace: String,
    /// This Pod's UID (downward API).
    #[arg(long, env = "POD_UID", default_value = "")]
    pub pod_uid: String,
    /// Namespace of the leader-election Lease (default: the Pod's).
    #[arg(long, env = "LEADER_ELECTION_NAMESPACE", default_value = "")]
    pub leader_election_namespace: String,
    /// How long a Lease holder is trusted without renewing.
    #[arg(long, env = "LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub leader_election_lease_duration: Duration,
    /// How long the holder tries to renew before giving up (renewal starts this long before expiry).
    #[arg(long, env = "LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = duration)]
    pub leader_election_renew_deadline: Duration,
    /// Accepted for compatibility: the Lease manager paces its retries from the two above.
    #[arg(long, env = "LEADER_ELECTION_RETRY_PERIOD", default_value = "5s", value_parser = duration)]
    pub leader_election_retry_period: Duration,
    /// TLS and a bearer token checked with TokenReview on every call; false serves plain TCP.
    #[arg(long, env = "ENABLE_AUTH", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub enable_auth: bool,
    /// Report abnormal volume conditions.
    #[arg(long, env = "ENABLE_VOLUME_CONDITION", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub enable_volume_condition: bool,
    /// How often volume conditions are checked.
    #[arg(long, env = "VOLUME_CONDITION_INTERVAL", default_value = "1m", value_parser = duration)]
    pub volume_condition_interval: Duration,
    /// Where volume conditions go: log, pvcEvent, pvcAnnotation.
    #[arg(
        long,
        env = "VOLUME_CONDITION_RECORDERS",
        default_value = "log,pvcEvent,pvcAnnotation",
        value_delimiter = ','
    )]
    pub volume_condition_recorders: Vec<String>,
    /// Minimum TLS version: VersionTLS12 or VersionTLS13.
    #[arg(long, env = "TLS_MIN_VERSION", default_value = "VersionTLS12")]
    pub tls_min_version: String,
    /// TLS 1.2 cipher suites (IANA names), comma-separated.
    #[arg(long, env = "TLS_CIPHER_SUITES", value_delimiter = ',')]
    pub tls_cipher_suites: Vec<String>,
    /// TLS curve preferences, comma-separated.
    #[arg(long, env = "TLS_CURVE_PREFERENCES", value_delimiter = ',')]
    pub tls_curve_preferences: Vec<String>,
    /// Accepted and ignored (Go runtime tuning).
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub automaxprocs: Option<bool>,

    // ---- logging: the union of upstream's two generations. v0.14.0 took klog's whole set
    // (klog.InitFlags), its main branch takes controller-runtime's zap flags with `-v` as an alias
    // of --zap-log-level, `--logtostderr` and `--alsologtostderr` as no-ops and `--log_file` as a
    // second destination. Projects that turn on log rotation (ceph-csi-operator, Rook) pass
    // `--logtostderr=false --alsologtostderr=true --log_file=…`: all of it must start us. ----
    /// Log level: klog's number (0–3 info, 4 and 5 debug, 6 and more trace) or zap's name (error,
    /// warn, info, debug); `--zap-log-level` is the same flag.
    #[arg(short = 'v', long = "v", alias = "zap-log-level", env = "LOG_VERBOSITY", default_value = "0", value_parser = log_level)]
    pub verbosity: LevelFilter,
    /// Also write the log to this file (appended; a relative path is from the working directory),
    /// as upstream's newest sidecar does; logrotate's `copytruncate` keeps working.
    #[arg(long = "log_file", env = "LOG_FILE")]
    pub log_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub klog: go_flags::KlogFlags,
    #[command(flatten)]
    pub zap: go_flags::ZapFlags,

    /// The kubeconfig to use (controller-runtime's flag, which v0.14.0 registers); without it
    /// KUBECONFIG (a list of files, merged), then the Pod's service account, then ~/.kube/config.
    #[arg(long, env = "CSI_ADDONS_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,

    // ---- ours ----
    /// Certificate to serve (a mounted Secret; reloaded when it changes). Without it and with
    /// auth on, a self-signed certificate is made at start, as upstream does.
    #[arg(long, env = "TLS_CERT_FILE")]
    pub tls_cert_file: Option<String>,
    #[arg(long, env = "TLS_KEY_FILE")]
    pub tls_key_file: Option<String>,
    /// Identities (TokenReview usernames) allowed to call, comma-separated. `*` may stand for
    /// the namespace of a ServiceAccount: the default admits the manager's ServiceAccount
    /// wherever it is installed (`csi-addons-system`, `openshift-storage`, …); name the exact
    /// identity to admit only the manager of one namespace.
    #[arg(
        long,
        env = "ALLOWED_IDENTITIES",
        value_delimiter = ',',
        default_value = "system:serviceaccount:*:csi-addons-controller-manager",
        value_parser = crate::guard::identity_entry
    )]
    pub allowed_identities: Vec<String>,
    /// The driver's CSI socket, for NodeGetCapabilities (staging) and volume conditions.
    #[arg(long, env = "CSI_ADDRESS")]
    pub csi_address: Option<String>,
    /// The kubelet's directory, for publish paths.
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: String,
    /// Address of /healthz, /readyz and /metrics (off when empty).
    #[arg(long, env = "HTTP_ADDRESS", default_value = "")]
    pub http_address: String,
    /// Exit when the driver connection is lost (upstream's behaviour) instead of reconnecting.
    #[arg(long, env = "EXIT_ON_DRIVER_LOSS", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub exit_on_driver_loss: bool,
    /// Log as JSON lines.
    #[arg(long, env = "LOG_JSON", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub log_json: bool,
}

impl SidecarCli {
    /// Whether logs are JSON: `--log-json`, or zap's `--zap-encoder=json`.
    pub fn json_logs(&self) -> bool {
        self.log_json || self.zap.json()
    }

    /// Parses the process's arguments, accepting Go-style single-dash flags.
    pub fn parse_args() -> Self {
        use clap::CommandFactory;
        Self::parse_from(go_flags::normalize(&Self::command(), std::env::args_os()))
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<SidecarCli, clap::Error> {
        let args = std::iter::once("csi-addons-sidecar").chain(args.iter().copied()).map(std::ffi::OsString::from);
        SidecarCli::try_parse_from(go_flags::normalize(&SidecarCli::command(), args))
    }

    #[test]
    fn a_rook_style_argument_list_parses_unchanged() {
        // As Rook and ceph-csi write them for upstream's image.
        let cli = parse(&[
            "--node-id=$(NODE_ID)",
            "--v=0",
            "--csi-addons-address=$(CSIADDONS_ENDPOINT)",
            "--controller-port=9070",
            "--pod=$(POD_NAME)",
            "--namespace=$(POD_NAMESPACE)",
            "--pod-uid=$(POD_UID)",
            "--stagingpath=/var/lib/kubelet/plugins/kubernetes.io/csi/",
            "--leader-election-namespace=rook-ceph",
            "--leader-election-lease-duration=137s",
            "--leader-election-renew-deadline=107s",
            "--leader-election-retry-period=26s",
            "-logtostderr=false",
            "-enable-auth=false",
        ])
        .unwrap();
        assert_eq!(cli.controller_port, "9070");
        assert_eq!(cli.leader_election_lease_duration, Duration::from_secs(137));
        assert!(!cli.enable_auth);
        assert_eq!(cli.verbosity, LevelFilter::INFO);
    }

    /// Every flag of upstream's two sidecars, v0.14.0's (`-help`: klog's and zap's whole sets) and
    /// its main branch's (`sidecar/main.go`: zap's, the TLS settings and the kept klog ones), each
    /// with a value of its type, as Go would take it.
    #[test]
    fn every_flag_of_upstreams_v0_14_0_and_main_branch_sidecars_is_accepted() {
        let booleans = ["add_dir_header", "alsologtostderr", "automaxprocs", "enable-auth", "enable-volume-condition"];
        let booleans =
            booleans.iter().chain(&["logtostderr", "one_output", "skip_headers", "skip_log_headers", "zap-devel"]);
        let durations = ["leader-election-lease-duration", "leader-election-renew-deadline"];
        let durations =
            durations.iter().chain(&["leader-election-retry-period", "timeout", "volume-condition-interval"]);
        let valued = [
            ("controller-ip", "10.0.0.1"),
            ("controller-port", "9070"),
            ("csi-addons-address", "/csi/csi-addons.sock"),
            ("kubeconfig", "/etc/kubeconfig"),
            ("leader-election-namespace", "rook-ceph"),
            ("log_backtrace_at", "main.go:42"),
            ("log_dir", "/var/log/csi"),
            ("log_file", "csi-logs/csi-addons.log"),
            ("log_file_max_size", "1800"),
            ("namespace", "rook-ceph"),
            ("node-id", "worker-1"),
            ("pod", "csi-rbdplugin-x2x7m"),
            ("pod-uid", "0b6c2f0e-6f7d-4c2e-9d8c-2b8a6f0e1c3d"),
            ("stagingpath", "/var/lib/kubelet/plugins/kubernetes.io/csi/"),
            ("stderrthreshold", "ERROR"),
            ("tls-cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
            ("tls-curve-preferences", "X25519"),
            ("tls-min-version", "VersionTLS12"),
            ("v", "5"),
            ("vmodule", "server=4"),
            ("volume-condition-recorders", "log,pvcEvent"),
            ("zap-encoder", "json"),
            ("zap-log-level", "debug"),
            ("zap-stacktrace-level", "error"),
            ("zap-time-encoding", "iso8601"),
        ];
        let lines = booleans
            .map(|name| format!("-{name}=true"))
            .chain(durations.map(|name| format!("-{name}=30s")))
            .chain(valued.iter().map(|(name, value)| format!("-{name}={value}")));
        for line in lines {
            assert!(parse(&[&line]).is_ok(), "{line}: {}", parse(&[&line]).unwrap_err());
        }
    }

    #[test]
    fn ceph_csi_operators_log_rotation_arguments_log_to_the_file_and_zap_level_names_set_the_level() {
        let args = ["--v=5", "--logtostderr=false", "--alsologtostderr=true", "--log_file=csi-logs/csi-addons.log"];
        let cli = parse(&args).unwrap();
        assert_eq!(cli.log_file.as_deref(), Some(std::path::Path::new("csi-logs/csi-addons.log")));
        assert_eq!(cli.verbosity, LevelFilter::DEBUG);
        assert_eq!(parse(&["-v=debug"]).unwrap().verbosity, LevelFilter::DEBUG);
        assert_eq!(parse(&["--zap-log-level=error"]).unwrap().verbosity, LevelFilter::ERROR);
        assert_eq!(parse(&["-v=7"]).unwrap().verbosity, LevelFilter::TRACE);
        assert!(parse(&["-zap-encoder=json"]).unwrap().json_logs());
        let refused = parse(&["-v=loud"]).unwrap_err().to_string();
        assert!(refused.contains("neither a verbosity number nor one of error, warn, info, debug"), "{refused}");
    }

    #[test]
    fn defaults_are_upstreams() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.timeout, Duration::from_secs(180));
        assert_eq!(cli.csi_addons_address, "/run/csi-addons/socket");
        assert!(cli.enable_auth);
        assert!(!cli.enable_volume_condition);
        assert_eq!(cli.volume_condition_interval, Duration::from_secs(60));
        assert_eq!(cli.leader_election_retry_period, Duration::from_secs(5));
        assert!(cli.http_address.is_empty(), "no extra port unless asked");
    }

    #[test]
    fn every_flag_that_does_something_can_be_set_from_the_environment() {
        let missing = go_flags::flags_without_env(&SidecarCli::command());
        assert!(missing.is_empty(), "flags without an environment variable: {missing:?}");
    }

    #[test]
    fn bad_values_are_rejected_with_the_flag_named() {
        let err = parse(&["-timeout=soon"]).unwrap_err().to_string();
        assert!(err.contains("--timeout") && err.contains("not a duration"), "{err}");
        let err = parse(&["-enable-auth=maybe"]).unwrap_err().to_string();
        assert!(err.contains("--enable-auth"), "{err}");
    }
}
