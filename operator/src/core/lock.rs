//! Locks that a panic elsewhere does not make unusable.
use std::sync::Mutex;

/// The locked value, even if a panic elsewhere poisoned the lock (the maps stay consistent:
/// every update is a single insert or remove).
pub fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
