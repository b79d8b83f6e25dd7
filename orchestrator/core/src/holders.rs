//! Which workers hold a buffer (imported its fd, or hold its device
//! block): marked by endpoints while tasks run, taken once when the
//! buffer's last user lets go, so that exactly those workers are told to
//! release it.
//!
//! The orchestrator keeps a buffer in an `Arc` shared by the driver's
//! handles and every unfinished task that names it; the `Arc`'s last drop
//! calls [`Holders::take`]. The loom model below checks that pattern:
//! whatever the interleaving of marks and drops, the release happens once
//! and names every worker marked before its user let go.

use crate::ids::WorkerId;
use crate::sync::Mutex;

/// The workers holding one buffer.
#[derive(Debug, Default)]
pub struct Holders {
    workers: Mutex<Vec<WorkerId>>,
}

impl Holders {
    /// Nobody holds it yet.
    pub fn new() -> Self {
        Holders::default()
    }

    /// Records that `worker` holds the buffer (idempotent).
    pub fn mark(&self, worker: WorkerId) {
        let mut w = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        if !w.contains(&worker) {
            w.push(worker);
        }
    }

    /// Every worker marked so far, leaving the set empty (a second take
    /// returns nothing: a release is sent once).
    pub fn take(&self) -> Vec<WorkerId> {
        std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_deduplicated_and_taken_once() {
        let h = Holders::new();
        h.mark(WorkerId(2));
        h.mark(WorkerId(0));
        h.mark(WorkerId(2));
        assert_eq!(h.take(), vec![WorkerId(2), WorkerId(0)]);
        assert!(h.take().is_empty());
    }
}

#[cfg(all(loom, test))]
mod loom_models {
    use super::*;
    use crate::sync::Arc;
    use loom::sync::Mutex as LoomMutex;
    use loom::thread;

    /// A buffer as the orchestrator shares it: its drop releases it on its
    /// holders.
    struct Buffer {
        holders: Holders,
        released: Arc<LoomMutex<Vec<Vec<WorkerId>>>>,
    }

    impl Drop for Buffer {
        fn drop(&mut self) {
            let taken = self.holders.take();
            self.released.lock().unwrap().push(taken);
        }
    }

    /// Two endpoints import a buffer for their tasks and finish them while
    /// the driver drops its handle: one release, naming both workers.
    #[test]
    fn the_last_user_releases_once_on_every_holder() {
        loom::model(|| {
            let released = Arc::new(LoomMutex::new(Vec::new()));
            let buffer = Arc::new(Buffer {
                holders: Holders::new(),
                released: Arc::clone(&released),
            });
            let tasks: Vec<_> = (0..2u32)
                .map(|w| {
                    let task = Arc::clone(&buffer);
                    thread::spawn(move || {
                        task.holders.mark(WorkerId(w));
                        drop(task);
                    })
                })
                .collect();
            drop(buffer);
            for t in tasks {
                t.join().unwrap();
            }
            let released = released.lock().unwrap();
            assert_eq!(released.len(), 1, "released once");
            let mut got = released[0].clone();
            got.sort();
            assert_eq!(got, vec![WorkerId(0), WorkerId(1)]);
        });
    }

    /// A mark racing a take (a buffer marked by an endpoint that still
    /// holds it while another path takes): every mark is seen by exactly
    /// one take.
    #[test]
    fn a_mark_is_taken_exactly_once() {
        loom::model(|| {
            let h = Arc::new(Holders::new());
            let h2 = Arc::clone(&h);
            let t = thread::spawn(move || {
                h2.mark(WorkerId(7));
                h2.take()
            });
            let first = h.take();
            let second = t.join().unwrap();
            let third = h.take();
            let total: Vec<_> = first.into_iter().chain(second).chain(third).collect();
            assert_eq!(total, vec![WorkerId(7)]);
        });
    }
}
