//! What a worker remembers of the sessions that ended: enough to tell a
//! client whose connection was lost whether the old session's tasks can
//! still touch its memory.
//!
//! A tombstone holds the ended session itself (its device buffers and
//! imports are gone by then; what is left is its gate and its count of
//! tasks not yet completed, [`Running`]), so the count keeps falling as
//! those tasks complete. Memory is bounded two ways: at most [`MAX_TOMBSTONES`]
//! entries (the oldest goes first, even with tasks still counted: a client
//! then hears "unknown", which proves nothing, never a false "done"), and
//! an entry older than [`TOMBSTONE_TTL`] whose tasks have all completed is
//! dropped. Time is passed in, so the rules are tested without clocks.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use strata_worker_core::SessionId;

/// What a tombstone needs of an ended session: how many of its tasks
/// are still running.
pub(crate) trait Running: Clone {
    /// Tasks received and not yet completed.
    fn running(&self) -> u64;
}

/// Most ended sessions remembered.
pub(crate) const MAX_TOMBSTONES: usize = 4096;

/// How long an ended session with nothing left running is remembered.
pub(crate) const TOMBSTONE_TTL: Duration = Duration::from_secs(600);

/// Ended sessions, oldest first.
#[derive(Debug)]
pub(crate) struct Tombstones<S> {
    by_id: HashMap<SessionId, S>,
    order: VecDeque<(SessionId, Instant)>,
    max: usize,
    ttl: Duration,
}

impl<S: Running> Default for Tombstones<S> {
    fn default() -> Self {
        Tombstones::new(MAX_TOMBSTONES, TOMBSTONE_TTL)
    }
}

impl<S: Running> Tombstones<S> {
    pub(crate) fn new(max: usize, ttl: Duration) -> Self {
        Tombstones {
            by_id: HashMap::new(),
            order: VecDeque::new(),
            max,
            ttl,
        }
    }

    /// Remembers `session`, which ended at `now`.
    pub(crate) fn insert(&mut self, id: SessionId, session: S, now: Instant) {
        if self.by_id.insert(id, session).is_none() {
            self.order.push_back((id, now));
        }
        self.prune(now);
    }

    /// The ended session `id`, if still remembered at `now`.
    pub(crate) fn get(&mut self, id: SessionId, now: Instant) -> Option<S> {
        self.prune(now);
        self.by_id.get(&id).cloned()
    }

    pub(crate) fn contains(&self, id: SessionId) -> bool {
        self.by_id.contains_key(&id)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    fn prune(&mut self, now: Instant) {
        while let Some(&(id, ended)) = self.order.front() {
            let over = self.order.len() > self.max;
            let expired = now.saturating_duration_since(ended) >= self.ttl
                && self.by_id.get(&id).is_none_or(|s| s.running() == 0);
            if !over && !expired {
                break;
            }
            self.order.pop_front();
            self.by_id.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// An ended session's count of running tasks, which a test moves.
    #[derive(Debug, Clone, Default)]
    struct Ended(Arc<AtomicU64>);

    impl Running for Ended {
        fn running(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    impl Ended {
        /// One more task running until the guard drops.
        fn task_received(&self) -> Task {
            self.0.fetch_add(1, Ordering::SeqCst);
            Task(Arc::clone(&self.0))
        }
    }

    struct Task(Arc<AtomicU64>);

    impl Drop for Task {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn ended() -> Ended {
        Ended::default()
    }

    /// The cap drops the oldest first, tasks or not.
    #[test]
    fn the_oldest_go_first_past_the_cap() {
        let t0 = Instant::now();
        let mut t = Tombstones::new(3, TOMBSTONE_TTL);
        let busy = ended();
        let _task = busy.task_received();
        t.insert(SessionId(1), busy, t0);
        for i in 2..=4 {
            t.insert(SessionId(i), ended(), t0);
        }
        assert_eq!(t.len(), 3);
        assert!(t.get(SessionId(1), t0).is_none());
        assert!((2..=4).all(|i| t.contains(SessionId(i))));
    }

    /// Past the time limit an entry goes once nothing of it runs, and not
    /// before.
    #[test]
    fn an_expired_entry_stays_while_its_tasks_run() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let mut t = Tombstones::new(8, ttl);
        let busy = ended();
        let task = busy.task_received();
        t.insert(SessionId(1), busy.clone(), t0);
        assert!(t.get(SessionId(1), t0 + ttl / 2).is_some());
        assert!(t.get(SessionId(1), t0 + ttl * 2).is_some(), "a task runs");
        drop(task);
        assert_eq!(busy.running(), 0);
        assert!(t.get(SessionId(1), t0 + ttl * 2).is_none());
        assert_eq!(t.len(), 0);
    }

    /// Inserting one id twice keeps one entry.
    #[test]
    fn one_entry_per_session() {
        let t0 = Instant::now();
        let mut t = Tombstones::new(8, TOMBSTONE_TTL);
        t.insert(SessionId(5), ended(), t0);
        t.insert(SessionId(5), ended(), t0);
        assert_eq!((t.len(), t.order.len()), (1, 1));
    }
}
