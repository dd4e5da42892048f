//! The manager's command line: upstream's flags with the same defaults (those of its main branch
//! included), in Go's forms too, and ours (`--watch-namespace`, `--metrics-cert-dir`,
//! `--sidecar-token-file`, `--log-json` among them), each also from an environment variable
//! [differs: manager-flags]; values are validated (upstream takes several unchecked).
//! [differs: manager-flag-checks]
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::filter::LevelFilter;

/// A flag or ConfigMap value the setting does not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    #[error(transparent)]
    Go(#[from] go_flags::GoValueError),
    #[error("must be longer than zero")]
    Zero,
    #[error("{0:?} is not a whole number")]
    NotWhole(String),
    #[error("{0:?} is not a whole number of at least 1")]
    NotPositive(String),
    #[error("{0:?} is not a whole number from 1 to 100")]
    NotGroupLimit(String),
    #[error("{0:?} is not one of pvc, storageclass")]
    NotPrecedence(String),
}

fn duration(text: &str) -> Result<Duration, BadValue> {
    Ok(go_flags::parse_go_duration(text)?)
}

/// A Go duration longer than zero.
pub fn positive_duration(text: &str) -> Result<Duration, BadValue> {
    match duration(text)? {
        d if d.is_zero() => Err(BadValue::Zero),
        d => Ok(d),
    }
}

fn boolean(text: &str) -> Result<bool, BadValue> {
    Ok(go_flags::parse_go_bool(text)?)
}

/// At least one worker.
fn workers(text: &str) -> Result<usize, BadValue> {
    match text.trim().parse::<usize>() {
        Ok(0) | Err(_) => Err(BadValue::NotPositive(text.to_owned())),
        Ok(n) => Ok(n),
    }
}

/// Group PVC limit: 1..=100, as upstream's ConfigMap key (its flag is not checked).
pub fn group_pvc_limit(text: &str) -> Result<u32, BadValue> {
    match text.trim().parse::<u32>() {
        Ok(n @ 1..=100) => Ok(n),
        _ => Err(BadValue::NotGroupLimit(text.to_owned())),
    }
}

/// A whole number, zero included.
pub fn whole_number(text: &str) -> Result<u64, BadValue> {
    text.trim().parse::<u64>().map_err(|_| BadValue::NotWhole(text.to_owned()))
}

/// A whole number of at least 1 (seconds or hours, per flag).
pub fn at_least_one(text: &str) -> Result<u64, BadValue> {
    match text.trim().parse::<u64>() {
        Ok(0) | Err(_) => Err(BadValue::NotPositive(text.to_owned())),
        Ok(n) => Ok(n),
    }
}

/// Which annotation wins when a PVC and its StorageClass both schedule an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulePrecedence {
    /// The PVC's (then its Namespace's) annotation; upstream's default.
    Pvc,
    /// Only the StorageClass's annotation.
    StorageClass,
}

impl SchedulePrecedence {
    /// `pvc`, `storageclass`, and upstream's legacy forms: `sc-only` and empty.
    pub fn parse(text: &str) -> Result<Self, BadValue> {
        match text.trim() {
            "" | "pvc" => Ok(SchedulePrecedence::Pvc),
            "storageclass" | "sc-only" => Ok(SchedulePrecedence::StorageClass),
            other => Err(BadValue::NotPrecedence(other.to_owned())),
        }
    }
}

/// Command line of `csi-addons-manager`.
#[derive(Parser, Debug, Clone)]
#[command(name = "csi-addons-manager", version = build_info::LONG_VERSION, about = "CSI-Addons controller manager")]
pub struct ManagerCli {
    /// Metrics address (`:8443` HTTPS, `:8080` HTTP); `0` turns metrics off.
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = "0")]
    pub metrics_bind_address: String,
    /// Serve metrics over HTTPS, authorized by TokenReview + SubjectAccessReview; false = plain HTTP.
    #[arg(long, env = "METRICS_SECURE", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub metrics_secure: bool,
    /// Allow HTTP/2 on the metrics server (off by default, as upstream).
    #[arg(long, env = "ENABLE_HTTP2", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub enable_http2: bool,
    /// Address of /healthz and /readyz.
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    pub health_probe_bind_address: String,
    /// Run controllers only while holding the manager's Lease.
    #[arg(long, env = "LEADER_ELECT", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub leader_elect: bool,
    #[arg(long, env = "LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = positive_duration)]
    pub leader_election_lease_duration: Duration,
    #[arg(long, env = "LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = positive_duration)]
    pub leader_election_renew_deadline: Duration,
    #[arg(long, env = "LEADER_ELECTION_RETRY_PERIOD", default_value = "5s", value_parser = positive_duration)]
    pub leader_election_retry_period: Duration,
    /// Timeout of one reclaim-space call to a sidecar.
    #[arg(long, env = "RECLAIM_SPACE_TIMEOUT", default_value = "3m", value_parser = positive_duration)]
    pub reclaim_space_timeout: Duration,
    /// How long a sidecar connection that nothing calls stays open (the next call dials again);
    /// 0 keeps every connection open for good.
    #[arg(long, env = "SIDECAR_IDLE_TIMEOUT", default_value = "2m", value_parser = duration)]
    pub sidecar_idle_timeout: Duration,
    /// Workers per controller.
    #[arg(long, env = "MAX_CONCURRENT_RECONCILES", default_value = "100", value_parser = workers)]
    pub max_concurrent_reconciles: usize,
    /// Namespace of the `csi-addons-config` ConfigMap (and of the manager's Lease).
    #[arg(long, env = "MANAGER_NAMESPACE", default_value = "csi-addons-system")]
    pub namespace: String,
    /// `pvc` or `storageclass` (legacy `sc-only` too).
    #[arg(long, env = "SCHEDULE_PRECEDENCE", default_value = "pvc", value_parser = SchedulePrecedence::parse)]
    pub schedule_precedence: SchedulePrecedence,
    /// TLS and a bearer token towards sidecars.
    #[arg(long, env = "ENABLE_AUTH", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub enable_auth: bool,
    /// Most PVCs in one volume group (1–100). `--max-group-pvcs` (the ConfigMap key's spelling)
    /// is accepted too.
    #[arg(long, alias = "max-group-pvcs", env = "MAX_GROUP_PVCS", default_value = "100", value_parser = group_pvc_limit)]
    pub max_group_pvc: u32,
    /// Deprecated and without effect, as upstream (a warning is logged).
    #[arg(long, env = "ENABLE_ADMISSION_WEBHOOKS", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub enable_admission_webhooks: bool,
    /// Seconds before a CSIAddonsNode whose sidecar could not be reached is tried again.
    #[arg(long, env = "CSI_ADDONS_NODE_RETRY_DELAY", default_value = "5", value_parser = at_least_one)]
    pub csi_addons_node_retry_delay: u64,
    /// Hours over which the start times of the ReclaimSpace and EncryptionKeyRotation cron jobs are
    /// spread, each by an offset from its UID; 0 turns the stagger off (every run starts at its
    /// scheduled time).
    #[arg(long, env = "CRONJOB_STAGGER_WINDOW", default_value = "2", value_parser = whole_number)]
    pub cronjob_stagger_window: u64,
    /// Remove stale volume-health annotations from PVCs.
    #[arg(long, env = "ENABLE_VOLUME_HEALTH_CLEANUP", default_value = "true", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub enable_volume_health_cleanup: bool,
    #[arg(long, env = "VOLUME_HEALTH_CLEANUP_INTERVAL", default_value = "30m", value_parser = positive_duration)]
    pub volume_health_cleanup_interval: Duration,
    /// A volume-health annotation not checked for this long is removed.
    #[arg(long, env = "VOLUME_HEALTH_STALE_THRESHOLD", default_value = "2h", value_parser = positive_duration)]
    pub volume_health_stale_threshold: Duration,

    // ---- logging: zap's flags; -v is an alias of --zap-log-level ----
    /// debug, info, error, or a number (higher is more verbose).
    #[arg(long = "zap-log-level", short = 'v', alias = "v", env = "ZAP_LOG_LEVEL", default_value = "info")]
    pub zap_log_level: String,
    #[command(flatten)]
    pub zap: go_flags::ZapFlags,
    /// Accepted and ignored (Go runtime tuning).
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub automaxprocs: Option<bool>,

    /// The kubeconfig to use (controller-runtime's flag); without it KUBECONFIG (a list of
    /// files, merged), then the Pod's service account, then ~/.kube/config.
    #[arg(long, env = "CSI_ADDONS_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,

    // ---- ours ----
    /// The token sent to sidecars (a Pod's projected ServiceAccount token by default).
    #[arg(long, env = "SIDECAR_TOKEN_FILE", default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token")]
    pub sidecar_token_file: String,
    /// CA that signs the sidecars' certificates; without it the sidecars' certificates are not
    /// verified (upstream's behaviour, for sidecars with a self-signed certificate).
    #[arg(long, env = "SIDECAR_CA_FILE")]
    pub sidecar_ca_file: Option<String>,
    /// Log as JSON lines (also `--zap-encoder=json`).
    #[arg(long, env = "LOG_JSON", default_value = "false", num_args = 0..=1, default_missing_value = "true", value_parser = boolean)]
    pub log_json: bool,
    /// Watch the namespaced CSI-Addons kinds and PVCs of this namespace only (all namespaces
    /// when unset): for a manager per tenant, and for tests sharing one API server.
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Directory with `tls.crt` and `tls.key` for HTTPS metrics (re-read when they change);
    /// without it a self-signed certificate is made and renewed in time.
    #[arg(long, env = "METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<String>,
}

impl ManagerCli {
    /// Parses the process's arguments, accepting Go-style single-dash flags.
    pub fn parse_args() -> Self {
        use clap::CommandFactory;
        Self::parse_from(go_flags::normalize(&Self::command(), std::env::args_os()))
    }

    /// The tracing level for `--zap-log-level` / `-v`: zap's names, or a number (0 info,
    /// 1–4 debug, ≥ 5 trace); `None` for anything else.
    pub fn log_level(&self) -> Option<LevelFilter> {
        runtime_support::logging::named_level(&self.zap_log_level).or_else(|| {
            match self.zap_log_level.trim().parse::<u8>().ok()? {
                0 => Some(LevelFilter::INFO),
                1..=4 => Some(LevelFilter::DEBUG),
                _ => Some(LevelFilter::TRACE),
            }
        })
    }

    /// Whether logs are JSON: `--log-json`, or zap's `--zap-encoder=json`.
    pub fn json_logs(&self) -> bool {
        self.log_json || self.zap.json()
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<ManagerCli, clap::Error> {
        let args = std::iter::once("csi-addons-manager").chain(args.iter().copied()).map(std::ffi::OsString::from);
        ManagerCli::try_parse_from(go_flags::normalize(&ManagerCli::command(), args))
    }

    #[test]
    fn upstreams_manifest_arguments_parse() {
        // As upstream's deployment and Rook write them.
        let cli = parse(&[
            "--leader-elect",
            "--health-probe-bind-address=:8081",
            "--metrics-bind-address=:8443",
            "-automaxprocs=true",
            "-max-group-pvc=50",
            "--enable-admission-webhooks=false",
            "-zap-log-level=debug",
        ])
        .unwrap();
        assert!(cli.leader_elect);
        assert_eq!(cli.metrics_bind_address, ":8443");
        assert_eq!(cli.max_group_pvc, 50);
        assert_eq!(cli.log_level(), Some(LevelFilter::DEBUG));
    }

    #[test]
    fn defaults_are_upstreams() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.metrics_bind_address, "0");
        assert!(cli.metrics_secure && cli.enable_auth && !cli.enable_http2 && !cli.leader_elect);
        assert_eq!(cli.health_probe_bind_address, ":8081");
        assert_eq!(cli.reclaim_space_timeout, Duration::from_secs(180));
        assert_eq!(cli.sidecar_idle_timeout, Duration::from_secs(120));
        assert_eq!(cli.max_concurrent_reconciles, 100);
        assert_eq!(cli.namespace, "csi-addons-system");
        assert_eq!(cli.schedule_precedence, SchedulePrecedence::Pvc);
        assert_eq!(cli.max_group_pvc, 100);
        assert_eq!(cli.csi_addons_node_retry_delay, 5);
        assert_eq!(cli.cronjob_stagger_window, 2);
        assert_eq!(cli.volume_health_cleanup_interval, Duration::from_secs(1800));
        assert_eq!(cli.volume_health_stale_threshold, Duration::from_secs(7200));
        assert_eq!(cli.log_level(), Some(LevelFilter::INFO));
    }

    #[test]
    fn values_upstream_leaves_unchecked_are_checked() {
        for (args, flag) in [
            (&["--max-concurrent-reconciles=0"][..], "--max-concurrent-reconciles"),
            (&["--schedule-precedence=namespace"][..], "--schedule-precedence"),
            (&["--max-group-pvc=101"][..], "--max-group-pvc"),
            (&["--csi-addons-node-retry-delay=0"][..], "--csi-addons-node-retry-delay"),
            (&["--volume-health-stale-threshold=0s"][..], "--volume-health-stale-threshold"),
            (&["-reclaim-space-timeout=soon"][..], "--reclaim-space-timeout"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        // The ConfigMap key's plural spelling works as a flag too; legacy precedence values too.
        assert_eq!(parse(&["--max-group-pvcs=7"]).unwrap().max_group_pvc, 7);
        assert_eq!(parse(&["-max-group-pvcs=8"]).unwrap().max_group_pvc, 8);
        assert_eq!(
            parse(&["--schedule-precedence=sc-only"]).unwrap().schedule_precedence,
            SchedulePrecedence::StorageClass
        );
        assert_eq!(parse(&["-v=3"]).unwrap().log_level(), Some(LevelFilter::DEBUG));
        // Zero is upstream's documented way to turn the stagger off.
        assert_eq!(parse(&["--cronjob-stagger-window=0"]).unwrap().cronjob_stagger_window, 0);
        assert!(parse(&["--cronjob-stagger-window=-1"]).is_err());
    }

    #[test]
    fn every_flag_that_does_something_can_be_set_from_the_environment() {
        let missing = go_flags::flags_without_env(&ManagerCli::command());
        assert!(missing.is_empty(), "flags without an environment variable: {missing:?}");
    }
}
