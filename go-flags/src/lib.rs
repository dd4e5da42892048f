//! Upstream's binaries parse flags with Go's `flag` package, where `-name=value`, `-name value`,
//! `--name=value` and `--name value` all mean the same. Pod specs written for them use the
//! single-dash forms. [`normalize`] rewrites `-name…` into `--name…` for the long flags a clap
//! command declares, leaving everything else (short flags, values, positionals) untouched.
#![forbid(unsafe_code)]

use std::ffi::OsString;

/// `args` (program name first) with Go-style single-dash long flags of `command` rewritten to
/// clap's double-dash form. Stops rewriting after a bare `--`, as Go's parser does.
pub fn normalize(command: &clap::Command, args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let longs: Vec<String> = command
        .get_arguments()
        .flat_map(|a| a.get_long().into_iter().chain(a.get_all_aliases().into_iter().flatten()))
        .map(str::to_owned)
        .chain(["help".to_owned(), "version".to_owned()])
        .collect();
    let mut rest_are_values = false;
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| {
            if i == 0 || rest_are_values {
                return arg;
            }
            let Some(text) = arg.to_str() else { return arg };
            if text == "--" {
                rest_are_values = true;
                return arg;
            }
            match text.strip_prefix('-') {
                Some(flag) if !flag.starts_with('-') => {
                    let name = flag.split_once('=').map_or(flag, |(n, _)| n);
                    if longs.iter().any(|l| l == name) { OsString::from(format!("-{text}")) } else { arg }
                }
                _ => arg,
            }
        })
        .collect()
}

/// The visible flags of `command` that cannot be set from an environment variable (hidden
/// compatibility flags, `--help` and `--version` aside): for tests that every flag can be.
pub fn flags_without_env(command: &clap::Command) -> Vec<String> {
    command
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .filter(|a| a.get_env().is_none())
        .map(|a| a.get_id().to_string())
        .collect()
}

/// controller-runtime's zap flags besides the level (which each binary reads its own way), as
/// upstream's manager and sidecar register them; flattened into both command lines. Only
/// `--zap-encoder=json` changes anything (JSON lines); the rest are accepted without effect.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ZapFlags {
    #[arg(long = "zap-devel", hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool)]
    pub zap_devel: Option<bool>,
    #[arg(long = "zap-encoder", hide = true)]
    pub zap_encoder: Option<String>,
    #[arg(long = "zap-stacktrace-level", hide = true)]
    pub zap_stacktrace_level: Option<String>,
    #[arg(long = "zap-time-encoding", hide = true)]
    pub zap_time_encoding: Option<String>,
}

impl ZapFlags {
    /// `--zap-encoder=json`.
    pub fn json(&self) -> bool {
        self.zap_encoder.as_deref() == Some("json")
    }
}

/// klog's flags (`klog.InitFlags`) but `-v` and `--log_file`, which the sidecar reads itself:
/// upstream's v0.14.0 sidecar registers them all, its main branch keeps `--logtostderr` and
/// `--alsologtostderr` as no-ops. Accepted without effect: the log always goes to stderr, and the
/// rotation klog's file flags set up is logrotate's job.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KlogFlags {
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool)]
    pub logtostderr: Option<bool>,
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool)]
    pub alsologtostderr: Option<bool>,
    #[arg(long = "log_dir", hide = true)]
    pub log_dir: Option<String>,
    #[arg(long = "log_file_max_size", hide = true)]
    pub log_file_max_size: Option<u64>,
    #[arg(long = "log_backtrace_at", hide = true)]
    pub log_backtrace_at: Option<String>,
    #[arg(long, hide = true)]
    pub vmodule: Option<String>,
    #[arg(long, hide = true)]
    pub stderrthreshold: Option<String>,
    #[arg(long = "skip_headers", hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool)]
    pub skip_headers: Option<bool>,
    #[arg(long = "skip_log_headers", hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool)]
    pub skip_log_headers: Option<bool>,
    #[arg(long = "one_output", hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool)]
    pub one_output: Option<bool>,
    #[arg(long = "add_dir_header", hide = true, num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool)]
    pub add_dir_header: Option<bool>,
}

/// A flag value that is not what Go's flag package would take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoValueError {
    #[error("{0:?} is not a boolean (true or false)")]
    NotABool(String),
    #[error("{0:?} is not a duration like 30s, 1m30s or 300ms")]
    NotADuration(String),
}

/// Parses Go's boolean flag values: `1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False`.
pub fn parse_go_bool(value: &str) -> Result<bool, GoValueError> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(GoValueError::NotABool(value.to_owned())),
    }
}

/// Parses a Go duration (`300ms`, `1.5h`, `2h45m`, `15s`, `0`): a sequence of decimal numbers
/// each with a unit `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`.
pub fn parse_go_duration(text: &str) -> Result<std::time::Duration, GoValueError> {
    let bad = || GoValueError::NotADuration(text.to_owned());
    if text == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let mut rest = text;
    let mut nanos: f64 = 0.0;
    if rest.is_empty() || rest.starts_with('-') {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        nanos += number * scale;
        rest = &rest[unit_end..];
    }
    if !nanos.is_finite() || nanos > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(std::time::Duration::from_nanos(nanos as u64))
}

/// A Go listen address as a socket address: Go's `:8081` means every interface.
pub fn listen_address(flag: &str) -> String {
    if flag.starts_with(':') { format!("0.0.0.0{flag}") } else { flag.to_owned() }
}

#[cfg(test)]
mod tests {
    use clap::{Arg, ArgAction, Command};

    use super::*;

    fn command() -> Command {
        Command::new("x")
            .arg(Arg::new("endpoint").long("endpoint"))
            .arg(
                Arg::new("enable-auth")
                    .long("enable-auth")
                    .num_args(0..=1)
                    .default_missing_value("true")
                    .value_parser(parse_go_bool),
            )
            .arg(Arg::new("verbose").short('v').action(ArgAction::SetTrue))
            .arg(Arg::new("rest").num_args(0..))
    }

    fn norm(args: &[&str]) -> Vec<String> {
        normalize(&command(), args.iter().map(OsString::from)).into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn go_listen_addresses() {
        assert_eq!(super::listen_address(":8081"), "0.0.0.0:8081");
        assert_eq!(super::listen_address("127.0.0.1:8081"), "127.0.0.1:8081");
    }

    #[test]
    fn single_dash_long_flags_become_double_dash() {
        assert_eq!(
            norm(&["x", "-endpoint=unix:///a", "-enable-auth=false"]),
            ["x", "--endpoint=unix:///a", "--enable-auth=false"]
        );
        assert_eq!(norm(&["x", "-endpoint", "unix:///a"]), ["x", "--endpoint", "unix:///a"]);
        assert_eq!(
            norm(&["x", "--endpoint", "-value-that-looks-like-a-flag"]),
            ["x", "--endpoint", "-value-that-looks-like-a-flag"]
        );
        assert_eq!(norm(&["x", "-h"]), ["x", "-h"]);
        assert_eq!(norm(&["x", "-help"]), ["x", "--help"]);
        assert_eq!(norm(&["x", "-v", "-unknown=1"]), ["x", "-v", "-unknown=1"]);
        assert_eq!(norm(&["x", "--", "-endpoint"]), ["x", "--", "-endpoint"]);
    }

    #[test]
    fn normalized_go_arguments_parse_with_clap() {
        let m = command().get_matches_from(norm(&["x", "-endpoint", "e", "-enable-auth=false"]));
        assert_eq!(m.get_one::<String>("endpoint").unwrap(), "e");
        assert!(!m.get_one::<bool>("enable-auth").unwrap());
        let m = command().get_matches_from(norm(&["x", "-enable-auth"]));
        assert!(m.get_one::<bool>("enable-auth").unwrap());
        assert!(command().try_get_matches_from(norm(&["x", "-enable-auth=maybe"])).is_err());
    }

    #[test]
    fn go_durations() {
        use std::time::Duration;
        assert_eq!(parse_go_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "-1s", "1d", "s", "1m30", "abc"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn go_booleans() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false));
        }
        assert!(parse_go_bool("yes").is_err());
    }
}
