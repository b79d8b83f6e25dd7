//! std normally, loom under `--cfg loom`: every shared structure of this
//! crate takes its primitives from here.

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `m`; nothing panics while holding these locks except a mapper,
/// and a poisoned entry is still consistent (it stays unmapped).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
