//! A lane read from two places: a thread that parks on the lane's bell,
//! and a poller that looks now and then from somewhere awake anyway (the
//! driver's async runtime, while it sends tasks and takes completions).
//!
//! Why: a record found by a parked thread must still wake whoever acts
//! on it — on the driver, a runtime thread, about 10 µs of a 34 µs hop
//! on a two-core machine. While tasks come and go the runtime is awake,
//! so it looks at the lane itself, and the thread stays off the bell (a
//! parked waiter's bit would make the peer pay a futex call per publish
//! for nothing).
//!
//! Protocol. One of the two *watches* the lane at a time: the thread
//! ([`Watched::serve`]) or the poller (after [`Watched::take`], until
//! [`Watched::hand_back`]). Whoever reads holds the `reading` lock for
//! the whole pass and hands what it read on under it, so records go on in
//! the lane's order, once each, and nothing after the thread's last
//! pass; the poller only ever *tries* the lock ([`Watched::poll`]), so
//! it never waits on the thread. The thread:
//! 1. waits on a condition variable while the poller watches and the
//!    ring is open (a hand-back or a close wakes it);
//! 2. makes a pass under the lock (its last if the ring was closed before
//!    the pass began: what was published before the close is read);
//! 3. parks on the lane's bell until something is published past where
//!    the pass ended, then goes to 1.
//!
//! Nothing published is left unread: while the poller watches, it reads;
//! a thread parked at 3 when the poller took the lane is woken by the
//! next publish (its bit is set) and goes to wait at 1; a hand-back is
//! made under the watcher lock and signalled, so the thread at 1 cannot
//! miss it, and its pass at 2 reads what came since the poller's last
//! look. The loom model `a_lane_handed_between_thread_and_poller_loses_no_record`
//! checks it over every interleaving with up to three preemptions (as
//! `scripts/loom.sh` runs it).

use std::sync::Arc;

use crate::sync::{Condvar, Mutex, MutexGuard};
use crate::{Consumer, Memory, Spin, Which};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watcher {
    Thread,
    Poller,
}

/// A lane's consumer and the reader's own state `S`, shared by a thread
/// and a poller (see the module docs).
#[derive(Debug)]
pub struct Watched<S> {
    mem: Arc<dyn Memory>,
    which: Which,
    reading: Mutex<Reading<S>>,
    watcher: Mutex<Watcher>,
    /// Signalled when the lane is handed back to the thread, or closed.
    handed: Condvar,
}

#[derive(Debug)]
struct Reading<S> {
    consumer: Consumer,
    state: S,
    /// No more passes: the thread made its last, or a pass said so.
    ended: bool,
}

impl<S> Reading<S> {
    /// One pass of `pass`, then what it read is released; passes end when
    /// it returns `false`.
    fn pass(&mut self, pass: impl FnOnce(&mut Consumer, &mut S) -> bool) -> bool {
        let go_on = pass(&mut self.consumer, &mut self.state);
        self.consumer.release();
        self.ended |= !go_on;
        go_on
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S> Watched<S> {
    /// `consumer`'s lane, watched by its thread until a poller takes it.
    pub fn new(consumer: Consumer, state: S) -> Self {
        Watched {
            mem: Arc::clone(consumer.memory()),
            which: consumer.which,
            reading: Mutex::new(Reading {
                consumer,
                state,
                ended: false,
            }),
            watcher: Mutex::new(Watcher::Thread),
            handed: Condvar::new(),
        }
    }

    /// Whether either side closed the ring.
    pub fn is_closed(&self) -> bool {
        crate::is_closed(&*self.mem)
    }

    /// The poller watches the lane from now on; the thread leaves the bell
    /// once it next wakes.
    pub fn take(&self) {
        *lock(&self.watcher) = Watcher::Poller;
    }

    /// The thread watches the lane again (woken if it waits for it).
    pub fn hand_back(&self) {
        *lock(&self.watcher) = Watcher::Thread;
        self.handed.notify_one();
    }

    /// Wakes the thread if it waits to be handed the lane: what whoever
    /// closes the ring does, so that the thread makes its last pass.
    pub fn wake(&self) {
        drop(lock(&self.watcher));
        self.handed.notify_one();
    }

    /// The poller's look: one pass of `pass` if nobody else is reading and
    /// passes have not ended (`pass` returns `false` to end them). Returns
    /// what `pass` returned, or `None` when it did not run.
    pub fn poll(&self, pass: impl FnOnce(&mut Consumer, &mut S) -> bool) -> Option<bool> {
        let Ok(mut r) = self.reading.try_lock() else {
            return None;
        };
        if r.ended {
            return None;
        }
        Some(r.pass(pass))
    }

    /// The thread's loop: a pass of `pass` whenever the lane is its to
    /// watch and something may be published, until the ring closes (one
    /// last pass then) or a pass returns `false`.
    pub fn serve(&self, mut pass: impl FnMut(&mut Consumer, &mut S) -> bool) {
        loop {
            {
                let mut w = lock(&self.watcher);
                while *w == Watcher::Poller && !self.is_closed() {
                    w = self.handed.wait(w).unwrap_or_else(|e| e.into_inner());
                }
            }
            // Seen before the pass: what was published before the close is
            // read by it.
            let closing = self.is_closed();
            let tail = {
                let mut r = lock(&self.reading);
                if r.ended || !r.pass(&mut pass) || closing {
                    r.ended = true;
                    return;
                }
                r.consumer.position()
            };
            Consumer::wait_published(&*self.mem, self.which, tail, Spin::NONE, None);
        }
    }
}
