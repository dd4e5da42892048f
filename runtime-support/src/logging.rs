//! Logging of the shipped binaries: to stderr, plain or JSON lines, at `level` (h2, hyper and
//! tower at info at most, their debug output is per frame) unless RUST_LOG lists
//! `target=level` directives. A target filter rather than tracing-subscriber's EnvFilter,
//! whose span and field matching brings a regex engine (some 140 KB of code, mapped for the
//! process's life) for directives these binaries never need.
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The filter: RUST_LOG when it parses, else `level` with the noisy libraries held at info.
pub fn filter(level: LevelFilter, rust_log: Option<&str>) -> Targets {
    if let Some(parsed) = rust_log.filter(|v| !v.trim().is_empty()).and_then(|v| v.parse::<Targets>().ok()) {
        return parsed;
    }
    let quiet = level.min(LevelFilter::INFO);
    Targets::new().with_default(level).with_target("h2", quiet).with_target("hyper", quiet).with_target("tower", quiet)
}

/// zap's level names, as `--zap-log-level` takes them (and `-v`, its alias in upstream's newest
/// builds): `error` and the ones above it, `warn`, `info`, `debug`. Numbers are each binary's to
/// read (klog's and zap's differ).
pub fn named_level(name: &str) -> Option<LevelFilter> {
    match name.trim() {
        "error" | "dpanic" | "panic" | "fatal" => Some(LevelFilter::ERROR),
        "warn" => Some(LevelFilter::WARN),
        "info" => Some(LevelFilter::INFO),
        "debug" => Some(LevelFilter::DEBUG),
        _ => None,
    }
}

/// Opens `path` for `--log_file`: created when missing, every write at the file's end (O_APPEND).
/// Appending is what keeps logrotate's `copytruncate` working: after the copy the file is cut to
/// nothing, and the next line lands at offset 0 rather than past a hole the size of the old log.
pub fn append_to(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

/// Installs the process's subscriber: stderr, and `also_to` when given (a `--log_file`), each
/// line written whole to both.
pub fn init(level: LevelFilter, json: bool, also_to: Option<std::fs::File>) {
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    let filter = filter(level, std::env::var("RUST_LOG").ok().as_deref());
    let registry = tracing_subscriber::registry().with(filter);
    // Colours only for a person at a terminal: a container's log, a file and a log collector get
    // plain text.
    let ansi = also_to.is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let writer = match also_to {
        Some(file) => BoxMakeWriter::new(std::io::stderr.and(std::sync::Arc::new(file))),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let plain = tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(writer);
    if json {
        registry.with(plain.json()).init();
    } else {
        registry.with(plain).init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn zaps_level_names_and_nothing_else_are_named_levels() {
        assert_eq!(named_level("debug"), Some(LevelFilter::DEBUG));
        assert_eq!(named_level(" info "), Some(LevelFilter::INFO));
        assert_eq!(named_level("panic"), Some(LevelFilter::ERROR));
        assert_eq!(named_level("3"), None);
        assert_eq!(named_level("verbose"), None);
    }

    #[test]
    fn the_log_file_is_appended_to_and_a_truncation_starts_it_again_at_offset_0() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("csi-addons-log-test-{}.log", std::process::id()));
        std::fs::write(&path, "earlier\n").unwrap();
        let mut file = append_to(&path).unwrap();
        file.write_all(b"first\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "earlier\nfirst\n");
        // logrotate's copytruncate, from another process's handle.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        file.write_all(b"second\n").unwrap();
        let after = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(after, b"second\n", "no hole where the old log was");
    }

    #[test]
    fn rust_log_directives_win_and_libraries_stay_quiet_otherwise() {
        let debug = filter(LevelFilter::DEBUG, None);
        assert!(debug.would_enable("operator", &Level::DEBUG));
        assert!(!debug.would_enable("h2::codec", &Level::DEBUG) && debug.would_enable("h2", &Level::INFO));
        let from_env = filter(LevelFilter::INFO, Some("warn,kube=trace"));
        assert!(from_env.would_enable("kube::client", &Level::TRACE));
        assert!(!from_env.would_enable("operator", &Level::INFO));
        // Not a target list (EnvFilter's span syntax): the flag's level.
        let fallback = filter(LevelFilter::INFO, Some("[span{a=1}]=debug"));
        assert!(fallback.would_enable("operator", &Level::INFO) && !fallback.would_enable("operator", &Level::DEBUG));
    }
}
