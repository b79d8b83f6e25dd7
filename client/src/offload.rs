//! Long copies kept from holding up an async runtime: a tokio helper both
//! sides of the worker link use (the driver's endpoint actors and the
//! worker's task handlers), kept here with the rest of the link's async
//! plumbing so that `strata-proto` stays free of tokio.
//!
//! The driver's endpoint actors and the worker's gRPC task handlers run on
//! multi-thread tokio runtimes beside the tasks that keep a session alive
//! (health beats, completions of other tasks). Packing or unpacking a
//! strided view of a few megabytes is millions of runs: long enough, in a
//! debug build on a loaded machine, to miss a health deadline. Such a copy
//! goes through [`off_runtime`].

use tokio::runtime::{Handle, RuntimeFlavor};

/// Copies of at least this many bytes leave the runtime.
pub const OFF_RUNTIME_BYTES: u64 = 1 << 20;

/// Runs `f`, a copy of `bytes`: on a worker thread of a multi-thread
/// runtime, when `bytes` is at least [`OFF_RUNTIME_BYTES`], under
/// [`tokio::task::block_in_place`] (the thread's other tasks move to
/// another thread while it runs); anywhere else (a caller's own thread, a
/// current-thread runtime, a small copy) it just runs.
pub fn off_runtime<T>(bytes: u64, f: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(h) if bytes >= OFF_RUNTIME_BYTES && h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large copy on a multi-thread runtime's worker thread does not
    /// hold up a task queued behind it on the same thread; small ones and
    /// ones outside a runtime just run.
    #[test]
    fn a_large_copy_lets_the_runtime_go_on() {
        assert_eq!(off_runtime(u64::MAX, || 7), 7, "no runtime: it just runs");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        rt.block_on(async {
            let other = tokio::spawn(async { 1 });
            // One worker thread: `other` can only run while this blocks if
            // the thread's work moved elsewhere.
            let (tx, rx) = std::sync::mpsc::channel();
            let big = tokio::spawn(async move {
                off_runtime(OFF_RUNTIME_BYTES, || {
                    rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok()
                })
            });
            assert_eq!(other.await.unwrap(), 1);
            tx.send(()).unwrap();
            assert!(
                big.await.unwrap(),
                "the other task ran while the copy waited"
            );
        });
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(current.block_on(async { off_runtime(u64::MAX, || 3) }), 3);
    }
}
