//! The time, as the controllers count it: seconds since the epoch.

/// Seconds since the epoch, now.
pub fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}
