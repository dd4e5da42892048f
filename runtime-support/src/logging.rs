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

/// Installs the process's subscriber.
pub fn init(level: LevelFilter, json: bool) {
    let filter = filter(level, std::env::var("RUST_LOG").ok().as_deref());
    let registry = tracing_subscriber::registry().with(filter);
    let plain = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
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
