//! The settings the controllers run with: the flags, overridden by the `csi-addons-config`
//! ConfigMap (its main branch's keys too). Unlike upstream, a change to the ConfigMap is applied
//! without a restart; a bad value is refused as a whole and the settings in force stay.
use std::collections::BTreeMap;
use std::time::Duration;

use crate::flags::{self, ManagerCli, SchedulePrecedence};

/// The ConfigMap's name (in `--namespace`).
pub const CONFIG_MAP: &str = "csi-addons-config";

/// Why a ConfigMap was refused; names the key so the user can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{CONFIG_MAP}: unknown key {0:?} (known: {known})", known = KEYS.join(", "))]
    UnknownKey(String),
    #[error("{CONFIG_MAP}: {key}={value:?}: {why}")]
    BadValue { key: &'static str, value: String, why: flags::BadValue },
}

const KEYS: [&str; 8] = [
    "reclaim-space-timeout",
    "max-concurrent-reconciles",
    "max-group-pvcs",
    "schedule-precedence",
    "csi-addons-node-retry-delay",
    "cronjob-stagger-window",
    "volume-health-cleanup-interval",
    "volume-health-stale-threshold",
];

/// The settings in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub reclaim_space_timeout: Duration,
    pub max_concurrent_reconciles: usize,
    pub max_group_pvcs: u32,
    pub schedule_precedence: SchedulePrecedence,
    pub csi_addons_node_retry_delay: Duration,
    pub cronjob_stagger_window: Duration,
    pub volume_health_cleanup_interval: Duration,
    pub volume_health_stale_threshold: Duration,
}

const HOUR: u64 = 3600;

impl Settings {
    /// The flags' values: what applies without a ConfigMap.
    pub fn from_flags(cli: &ManagerCli) -> Self {
        Settings {
            reclaim_space_timeout: cli.reclaim_space_timeout,
            max_concurrent_reconciles: cli.max_concurrent_reconciles,
            max_group_pvcs: cli.max_group_pvc,
            schedule_precedence: cli.schedule_precedence,
            csi_addons_node_retry_delay: Duration::from_secs(cli.csi_addons_node_retry_delay),
            cronjob_stagger_window: Duration::from_secs(cli.cronjob_stagger_window.saturating_mul(HOUR)),
            volume_health_cleanup_interval: cli.volume_health_cleanup_interval,
            volume_health_stale_threshold: cli.volume_health_stale_threshold,
        }
    }

    /// `base` (the flags) with the ConfigMap's values over it. Every key is checked before any is
    /// applied, so a ConfigMap with one bad value changes nothing.
    pub fn with_config_map(base: &Settings, data: &BTreeMap<String, String>) -> Result<Settings, ConfigError> {
        let mut settings = base.clone();
        for (key, value) in data {
            let bad =
                |key: &'static str, why: flags::BadValue| ConfigError::BadValue { key, value: value.clone(), why };
            match key.as_str() {
                "reclaim-space-timeout" => {
                    settings.reclaim_space_timeout =
                        flags::positive_duration(value).map_err(|why| bad("reclaim-space-timeout", why))?;
                }
                "max-concurrent-reconciles" => {
                    let workers = flags::at_least_one(value).map_err(|why| bad("max-concurrent-reconciles", why))?;
                    // A count past what the machine can address is no count of workers.
                    settings.max_concurrent_reconciles = usize::try_from(workers)
                        .map_err(|_| bad("max-concurrent-reconciles", flags::BadValue::NotPositive(value.clone())))?;
                }
                "max-group-pvcs" => {
                    settings.max_group_pvcs =
                        flags::group_pvc_limit(value).map_err(|why| bad("max-group-pvcs", why))?;
                }
                "schedule-precedence" => {
                    settings.schedule_precedence =
                        SchedulePrecedence::parse(value).map_err(|why| bad("schedule-precedence", why))?;
                }
                "csi-addons-node-retry-delay" => {
                    let seconds = flags::at_least_one(value).map_err(|why| bad("csi-addons-node-retry-delay", why))?;
                    settings.csi_addons_node_retry_delay = Duration::from_secs(seconds);
                }
                "cronjob-stagger-window" => {
                    // 0 turns the stagger off, as upstream documents.
                    let hours = flags::whole_number(value).map_err(|why| bad("cronjob-stagger-window", why))?;
                    settings.cronjob_stagger_window = Duration::from_secs(hours.saturating_mul(HOUR));
                }
                "volume-health-cleanup-interval" => {
                    settings.volume_health_cleanup_interval =
                        flags::positive_duration(value).map_err(|why| bad("volume-health-cleanup-interval", why))?;
                }
                "volume-health-stale-threshold" => {
                    settings.volume_health_stale_threshold =
                        flags::positive_duration(value).map_err(|why| bad("volume-health-stale-threshold", why))?;
                }
                other => return Err(ConfigError::UnknownKey(other.to_owned())),
            }
        }
        Ok(settings)
    }

    /// What changed from `self` to `next`, as `key: old → new` lines for the log and the event.
    pub fn changes(&self, next: &Settings) -> Vec<String> {
        let mut changes = Vec::new();
        let mut note = |key: &str, old: String, new: String| {
            if old != new {
                changes.push(format!("{key}: {old} → {new}"));
            }
        };
        note(
            "reclaim-space-timeout",
            format!("{:?}", self.reclaim_space_timeout),
            format!("{:?}", next.reclaim_space_timeout),
        );
        note(
            "max-concurrent-reconciles",
            self.max_concurrent_reconciles.to_string(),
            next.max_concurrent_reconciles.to_string(),
        );
        note("max-group-pvcs", self.max_group_pvcs.to_string(), next.max_group_pvcs.to_string());
        note(
            "schedule-precedence",
            format!("{:?}", self.schedule_precedence),
            format!("{:?}", next.schedule_precedence),
        );
        note(
            "csi-addons-node-retry-delay",
            format!("{:?}", self.csi_addons_node_retry_delay),
            format!("{:?}", next.csi_addons_node_retry_delay),
        );
        note(
            "cronjob-stagger-window",
            format!("{:?}", self.cronjob_stagger_window),
            format!("{:?}", next.cronjob_stagger_window),
        );
        note(
            "volume-health-cleanup-interval",
            format!("{:?}", self.volume_health_cleanup_interval),
            format!("{:?}", next.volume_health_cleanup_interval),
        );
        note(
            "volume-health-stale-threshold",
            format!("{:?}", self.volume_health_stale_threshold),
            format!("{:?}", next.volume_health_stale_threshold),
        );
        changes
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn base() -> Settings {
        Settings::from_flags(&ManagerCli::try_parse_from(["csi-addons-manager"]).unwrap())
    }

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn the_config_map_overrides_the_flags() {
        let settings = Settings::with_config_map(
            &base(),
            &data(&[
                ("reclaim-space-timeout", "10m"),
                ("max-concurrent-reconciles", "5"),
                ("max-group-pvcs", "20"),
                ("schedule-precedence", "storageclass"),
                ("csi-addons-node-retry-delay", "30"),
                ("cronjob-stagger-window", "6"),
                ("volume-health-cleanup-interval", "1h"),
                ("volume-health-stale-threshold", "4h"),
            ]),
        )
        .unwrap();
        assert_eq!(settings.reclaim_space_timeout, Duration::from_secs(600));
        assert_eq!(settings.max_concurrent_reconciles, 5);
        assert_eq!(settings.max_group_pvcs, 20);
        assert_eq!(settings.schedule_precedence, SchedulePrecedence::StorageClass);
        assert_eq!(settings.csi_addons_node_retry_delay, Duration::from_secs(30));
        assert_eq!(settings.cronjob_stagger_window, Duration::from_secs(6 * 3600));
        assert_eq!(settings.volume_health_cleanup_interval, Duration::from_secs(3600));
        assert_eq!(settings.volume_health_stale_threshold, Duration::from_secs(4 * 3600));
        assert_eq!(base().changes(&settings).len(), 8);
        assert!(base().changes(&base()).is_empty());
    }

    #[test]
    fn a_stagger_window_of_zero_turns_the_stagger_off() {
        let off = Settings::with_config_map(&base(), &data(&[("cronjob-stagger-window", "0")])).unwrap();
        assert_eq!(off.cronjob_stagger_window, Duration::ZERO);
    }

    #[test]
    fn upstreams_legacy_values_still_work() {
        let sc = Settings::with_config_map(&base(), &data(&[("schedule-precedence", "sc-only")])).unwrap();
        assert_eq!(sc.schedule_precedence, SchedulePrecedence::StorageClass);
        let empty = Settings::with_config_map(&sc, &data(&[("schedule-precedence", "")])).unwrap();
        assert_eq!(empty.schedule_precedence, SchedulePrecedence::Pvc);
    }

    #[test]
    fn a_bad_value_changes_nothing_and_names_the_key() {
        for (key, value) in [
            ("max-group-pvcs", "0"),
            ("max-group-pvcs", "101"),
            ("max-concurrent-reconciles", "many"),
            ("reclaim-space-timeout", "0s"),
            ("schedule-precedence", "namespace"),
            ("cronjob-stagger-window", "-1"),
            ("volume-health-stale-threshold", "2 hours"),
        ] {
            // The good key first: it must not be applied either.
            let err = Settings::with_config_map(&base(), &data(&[("csi-addons-node-retry-delay", "9"), (key, value)]))
                .unwrap_err();
            assert!(matches!(&err, ConfigError::BadValue { key: k, .. } if *k == key), "{key}={value}: {err}");
            assert!(err.to_string().contains(key) && err.to_string().contains(value), "{err}");
        }
        let err = Settings::with_config_map(&base(), &data(&[("max-group-pvc", "5")])).unwrap_err();
        assert_eq!(err, ConfigError::UnknownKey("max-group-pvc".into()));
        assert!(err.to_string().contains("max-group-pvcs"), "the message lists the known keys: {err}");
    }
}
