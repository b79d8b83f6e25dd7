//! A counting gate: at most `limit` holders at once; `enter` blocks until
//! there is room, `leave` makes room, `close` releases every waiter with an
//! error. The driver enters once per submitted task and the DAG actor
//! leaves when the task is finished, so a driver that submits faster than
//! the workers run cannot pile up unbounded task records.
//!
//! A waiter on a full gate waits until a sixteenth of it is free, and
//! `leave` wakes nobody when nobody waits: a driver far ahead of its
//! workers is woken once per batch of finished tasks, not once per task.

use crate::sync::{Condvar, Mutex};

#[derive(Debug)]
struct State {
    used: usize,
    open: bool,
    /// Threads blocked in `enter`.
    waiting: usize,
}

/// The gate.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
    room: Condvar,
    limit: usize,
    /// A blocked `enter` goes on once `used` is at most this.
    low: usize,
}

/// The gate was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl Gate {
    /// A gate letting `limit` holders in at once (at least 1).
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        Gate {
            state: Mutex::new(State {
                used: 0,
                open: true,
                waiting: 0,
            }),
            room: Condvar::new(),
            limit,
            low: limit - (limit / 16).max(1),
        }
    }

    /// Waits for room, then holds one place. On a full gate it waits
    /// until a sixteenth of the places (at least one) are free.
    ///
    /// # Errors
    /// [`Closed`] when the gate is (or gets) closed.
    pub fn enter(&self) -> Result<(), Closed> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.open && s.used >= self.limit {
            s.waiting += 1;
            while s.open && s.used > self.low {
                s = self.room.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.waiting -= 1;
        }
        if !s.open {
            return Err(Closed);
        }
        s.used += 1;
        Ok(())
    }

    /// Gives back `n` places.
    pub fn leave(&self, n: usize) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.used = s.used.saturating_sub(n);
        let wake = s.waiting > 0 && s.used <= self.low;
        drop(s);
        if wake {
            self.room.notify_all();
        }
    }

    /// Closes the gate: waiters and later callers get [`Closed`].
    pub fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).open = false;
        self.room.notify_all();
    }

    /// Places held now.
    pub fn used(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enter_blocks_at_the_limit_and_close_releases() {
        let g = std::sync::Arc::new(Gate::new(2));
        g.enter().unwrap();
        g.enter().unwrap();
        assert_eq!(g.used(), 2);
        let g2 = std::sync::Arc::clone(&g);
        let t = std::thread::spawn(move || g2.enter());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "a third holder waits");
        g.leave(1);
        assert_eq!(t.join().unwrap(), Ok(()));
        g.close();
        assert_eq!(g.enter(), Err(Closed));
    }

    #[test]
    fn a_full_gate_waits_for_a_sixteenth_free() {
        let g = std::sync::Arc::new(Gate::new(32));
        for _ in 0..32 {
            g.enter().unwrap();
        }
        let g2 = std::sync::Arc::clone(&g);
        let t = std::thread::spawn(move || g2.enter());
        std::thread::sleep(std::time::Duration::from_millis(50));
        g.leave(1);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "one free place of 32 is not yet a batch");
        g.leave(1);
        assert_eq!(t.join().unwrap(), Ok(()));
        assert_eq!(g.used(), 31);
    }
}

#[cfg(all(loom, test))]
mod loom_models {
    use super::*;
    use crate::sync::Arc;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;

    /// Two submitters through a gate of one place, the actor leaving after
    /// each: never two inside at once, and nobody stays blocked.
    #[test]
    fn at_most_limit_inside_and_no_one_stuck() {
        loom::model(|| {
            let g = Arc::new(Gate::new(1));
            let inside = Arc::new(AtomicUsize::new(0));
            let ts: Vec<_> = (0..2)
                .map(|_| {
                    let (g, inside) = (Arc::clone(&g), Arc::clone(&inside));
                    thread::spawn(move || {
                        g.enter().unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        g.leave(1);
                    })
                })
                .collect();
            for t in ts {
                t.join().unwrap();
            }
            assert_eq!(g.used(), 0);
        });
    }

    /// A submitter blocked on a full gate of 16 places goes on once the
    /// actor has left one (a sixteenth) and is not lost (that less is not
    /// enough is the unit test `a_full_gate_waits_for_a_sixteenth_free`).
    #[test]
    fn a_blocked_enter_wakes_once_a_batch_is_free() {
        loom::model(|| {
            let g = Arc::new(Gate::new(16));
            for _ in 0..16 {
                g.enter().unwrap();
            }
            let g2 = Arc::clone(&g);
            let t = thread::spawn(move || g2.enter());
            g.leave(1);
            assert_eq!(t.join().unwrap(), Ok(()));
            assert_eq!(g.used(), 16);
        });
    }

    /// A submitter blocked on a full gate is released by close.
    #[test]
    fn close_releases_a_blocked_enter() {
        loom::model(|| {
            let g = Arc::new(Gate::new(1));
            g.enter().unwrap();
            let g2 = Arc::clone(&g);
            let t = thread::spawn(move || g2.enter());
            g.close();
            assert_eq!(t.join().unwrap(), Err(Closed));
        });
    }
}
