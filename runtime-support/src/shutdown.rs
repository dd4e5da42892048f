//! The one shutdown signal every binary waits for: SIGINT or SIGTERM.

/// Returns when SIGINT or SIGTERM arrives. Where SIGTERM cannot be watched (no signal driver),
/// SIGINT alone counts.
pub async fn signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
