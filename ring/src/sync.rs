//! std (and the kernel's futex) normally, loom under `--cfg loom`: every
//! shared word of the ring takes its primitives from here, so the loom
//! models check the code that ships.
//!
//! A [`Bell`] is one futex word. Under loom it carries a mutex and a
//! condition variable that stand in for the kernel's futex queue: `wait`
//! checks the word under the mutex and sleeps only if it still holds the
//! expected value, `wake` takes the mutex and notifies, which is the
//! futex contract (the check and the sleep are one step for a waker).
//! Loom's wait ignores the timeout, so a model passes only if no wake-up
//! is ever lost without one.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

use std::time::Duration;

/// One futex word, shared between processes.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Word {
    pub(crate) v: AtomicU32,
    #[cfg(loom)]
    lot: (loom::sync::Mutex<()>, loom::sync::Condvar),
}

impl Word {
    /// Sleeps while the word holds `expected`, at most `timeout`; returns
    /// at once if it does not. Spurious returns are allowed.
    #[cfg(not(loom))]
    pub(crate) fn wait(&self, expected: u32, timeout: Duration) {
        use rustix::thread::futex;
        let ts = futex::Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // Not PRIVATE: the word lives in memory shared with another
        // process. EAGAIN (changed), EINTR and ETIMEDOUT all mean "look
        // again", which every caller does.
        let _ = futex::wait(&self.v, futex::Flags::empty(), expected, Some(&ts));
    }

    /// Wakes every sleeper on the word.
    #[cfg(not(loom))]
    pub(crate) fn wake(&self) {
        use rustix::thread::futex;
        let _ = futex::wake(&self.v, futex::Flags::empty(), u32::MAX);
    }

    #[cfg(loom)]
    pub(crate) fn wait(&self, expected: u32, _timeout: Duration) {
        let guard = self.lot.0.lock().unwrap();
        if self.v.load(Ordering::SeqCst) == expected {
            drop(self.lot.1.wait(guard).unwrap());
        }
    }

    #[cfg(loom)]
    pub(crate) fn wake(&self) {
        let _guard = self.lot.0.lock().unwrap();
        self.lot.1.notify_all();
    }
}

/// A busy-wait hint (loom: a yield, so the model explores the other side).
pub(crate) fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
