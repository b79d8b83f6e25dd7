//! Prefetch: a launch that has to wait for a lane has the bytes it lacks
//! copied into the device cache meanwhile, by the device's copy engine (a
//! thread of its own, as a DMA engine is beside an accelerator's compute
//! units), so that when its lane takes it they are found there.
//!
//! The launch and its prefetch meet at a [`Ticket`]. Protocol (all under
//! the ticket's lock):
//! 1. the copy engine starts the prefetch only if the launch has not
//!    started (`Queued` → `Running`); otherwise it does nothing;
//! 2. it ends by storing what it did (`Running` → `Done`) and waking the
//!    launch;
//! 3. the launch, when its lane takes it, claims the ticket: a prefetch
//!    still queued is called off (`Queued` → `Taken`: the launch stages its
//!    own bytes), one running is waited for (a kernel waits for its
//!    copies), and one done is taken with its figures.
//!
//! PREFETCH-1: a prefetch runs at most once and only before its launch
//! starts staging; a launch claims exactly once and gets the figures of a
//! prefetch that ran, or nothing when none ran (checked by the loom
//! model). Bytes copied ahead are counted in the launch's own report, so
//! a run's figures add up whichever copied them.
//!
//! A prefetched copy is an ordinary cached copy at the version the launch
//! names, unpinned: the launch's own lookup finds it (or, if memory
//! pressure evicted it meanwhile, copies the bytes in again: a prefetch
//! costs a copy, never a stale byte).

use crate::cache::{CacheStats, CopyKey};
use crate::sync::{Condvar, Mutex, lock, wait};

/// What a prefetch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Prefetched {
    /// Its cache figures (misses and the bytes it loaded).
    pub(crate) cache: CacheStats,
    /// Bytes copied host → device.
    pub(crate) staged_in: u64,
    /// The copies it made: the launch's hits on them are not hits.
    pub(crate) keys: Vec<CopyKey>,
}

#[derive(Debug)]
enum Stage {
    Queued,
    Running,
    Done(Prefetched),
    Taken,
}

/// Where a launch and its prefetch meet (module docs).
#[derive(Debug)]
pub(crate) struct Ticket {
    stage: Mutex<Stage>,
    done: Condvar,
}

impl Ticket {
    pub(crate) fn new() -> Self {
        Ticket {
            stage: Mutex::new(Stage::Queued),
            done: Condvar::new(),
        }
    }

    /// The copy engine: whether to run the prefetch (false once the launch
    /// has started).
    pub(crate) fn start(&self) -> bool {
        let mut s = lock(&self.stage);
        if matches!(*s, Stage::Queued) {
            *s = Stage::Running;
            true
        } else {
            false
        }
    }

    /// The copy engine: the prefetch is over.
    pub(crate) fn finish(&self, what: Prefetched) {
        *lock(&self.stage) = Stage::Done(what);
        self.done.notify_all();
    }

    /// The launch, as it starts: what was copied ahead for it (waiting for
    /// a prefetch under way), or `None` when nothing was.
    pub(crate) fn claim(&self) -> Option<Prefetched> {
        let mut s = lock(&self.stage);
        loop {
            match std::mem::replace(&mut *s, Stage::Taken) {
                Stage::Running => {
                    *s = Stage::Running;
                    s = wait(&self.done, s);
                }
                Stage::Done(what) => return Some(what),
                Stage::Queued | Stage::Taken => return None,
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::{Arc, AtomicU64, Ordering, thread};

    /// The copy engine against the launch: the prefetch runs at most once,
    /// only while the launch has not started, and the launch gets its
    /// figures exactly when it ran.
    #[test]
    fn a_prefetch_against_its_launch() {
        loom::model(|| {
            let ticket = Arc::new(Ticket::new());
            let ran = Arc::new(AtomicU64::new(0));
            let engine = {
                let (ticket, ran) = (Arc::clone(&ticket), Arc::clone(&ran));
                thread::spawn(move || {
                    if ticket.start() {
                        ran.fetch_add(1, Ordering::SeqCst);
                        ticket.finish(Prefetched {
                            staged_in: 64,
                            ..Prefetched::default()
                        });
                    }
                })
            };
            let got = ticket.claim();
            // Claimed: the prefetch is over or will never run.
            let ran_at_claim = ran.load(Ordering::SeqCst);
            engine.join().unwrap();
            let ran = ran.load(Ordering::SeqCst);
            assert!(ran <= 1);
            assert_eq!(ran, ran_at_claim, "a prefetch ran after its launch started");
            assert_eq!(got.map(|p| p.staged_in), (ran == 1).then_some(64));
            assert!(ticket.claim().is_none(), "claimed twice");
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_claim_calls_off_a_queued_prefetch() {
        let t = Ticket::new();
        assert_eq!(t.claim(), None);
        assert!(!t.start(), "called off");
    }

    #[test]
    fn a_claim_takes_a_finished_prefetch_once() {
        let t = Ticket::new();
        assert!(t.start());
        t.finish(Prefetched {
            staged_in: 7,
            ..Prefetched::default()
        });
        assert_eq!(t.claim().map(|p| p.staged_in), Some(7));
        assert_eq!(t.claim(), None);
    }
}
