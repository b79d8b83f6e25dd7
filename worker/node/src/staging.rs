//! Bytes too large for one message, held by a session between two calls
//! (remote workers): the bytes of a view a task reads, staged ahead of the
//! task in chunks (`Stage`), and the bytes of a view a task wrote, held for
//! the driver to fetch in chunks (`Fetch`).
//!
//! Both come from or go to another process, so the table is bounded: at
//! most [`MAX_HELD_BYTES`] per session, staged and held together, counted
//! from the moment a `Stage` call announces its length (two concurrent
//! calls cannot both pass the check and then overrun it). Whatever is left
//! when the session ends is dropped with it.
//!
//! The same table serves both carriers of those bytes: the gRPC `Stage`
//! and `Fetch` calls, and the session's data connections (both served by
//! the worker process, `strata-worker`), so a task names staged bytes and
//! a completion held ones by id whichever way they travel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

/// Most bytes one session may have staged and held at once: four views of
/// the largest extent that travels inline.
pub const MAX_HELD_BYTES: u64 = 4 * strata_proto::MAX_INLINE_EXTENT;

/// Why the table refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeldError {
    /// The id is 0, or in use.
    #[error("{0}")]
    BadId(String),
    /// The session ended.
    #[error("the session ended")]
    Closed,
    /// Past [`MAX_HELD_BYTES`].
    #[error(
        "{want} more bytes would put the session's staged and held bytes past {MAX_HELD_BYTES} ({held} now): run the tasks that use them first"
    )]
    Full {
        /// Bytes asked for.
        want: u64,
        /// Bytes the session holds now.
        held: u64,
    },
}

#[derive(Debug, Default)]
struct Inner {
    /// Staged input bytes by id, complete.
    staged: HashMap<u64, Bytes>,
    /// Ids of `Stage` calls still receiving.
    receiving: std::collections::HashSet<u64>,
    /// Output bytes by id.
    held: HashMap<u64, Bytes>,
    /// Bytes counted against the limit (complete, receiving, held).
    bytes: u64,
    /// The last output id given out.
    last_held: u64,
    /// The session ended: nothing more is kept.
    closed: bool,
}

/// One session's staged and held bytes.
#[derive(Debug, Default)]
pub struct Held {
    inner: Mutex<Inner>,
    /// Written views of at least this many bytes are held for a fetch
    /// rather than sent in their completion (0: only those too large for
    /// a message). A data connection's hello sets it: a client that can
    /// fetch them cheaply asks for them that way.
    hold_from: std::sync::atomic::AtomicU64,
}

impl Held {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn admit(g: &mut Inner, want: u64) -> Result<(), HeldError> {
        if g.closed {
            return Err(HeldError::Closed);
        }
        if g.bytes.saturating_add(want) > MAX_HELD_BYTES {
            return Err(HeldError::Full {
                want,
                held: g.bytes,
            });
        }
        g.bytes += want;
        Ok(())
    }

    /// Starts receiving `total` bytes to be staged as `id`; the returned
    /// guard gives them back if the call ends before they all arrived.
    pub fn begin_stage(self: &Arc<Self>, id: u64, total: u64) -> Result<Staging, HeldError> {
        let mut g = self.lock();
        if id == 0 {
            return Err(HeldError::BadId(
                "stage id 0 means \"not staged\": name staged bytes with a nonzero id".into(),
            ));
        }
        if g.staged.contains_key(&id) || g.receiving.contains(&id) {
            return Err(HeldError::BadId(format!(
                "stage id {id} is in use in this session"
            )));
        }
        Self::admit(&mut g, total)?;
        g.receiving.insert(id);
        Ok(Staging {
            held: Arc::clone(self),
            id,
            total,
            done: false,
        })
    }

    /// Holds written views of at least `bytes` for a fetch from now on
    /// (0: only views too large for a message).
    pub fn set_hold_from(&self, bytes: u64) {
        self.hold_from
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The size from which written views are held (0: none by size).
    pub fn hold_from(&self) -> u64 {
        self.hold_from.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the bytes staged as `id` (a task uses them once).
    pub fn take_staged(&self, id: u64) -> Option<Bytes> {
        let mut g = self.lock();
        let b = g.staged.remove(&id)?;
        g.bytes -= b.len() as u64;
        Some(b)
    }

    /// Holds `bytes` for a `Fetch`; returns their id.
    pub fn hold(&self, bytes: Bytes) -> Result<u64, HeldError> {
        let mut g = self.lock();
        Self::admit(&mut g, bytes.len() as u64)?;
        g.last_held += 1;
        let id = g.last_held;
        g.held.insert(id, bytes);
        Ok(id)
    }

    /// Takes the bytes held as `id` (fetched once).
    pub fn take_held(&self, id: u64) -> Option<Bytes> {
        let mut g = self.lock();
        let b = g.held.remove(&id)?;
        g.bytes -= b.len() as u64;
        Some(b)
    }

    /// Drops what is staged and held (the session ended); a call still
    /// receiving gives its bytes back when it ends.
    pub fn clear(&self) {
        let mut g = self.lock();
        let staged: u64 = g.staged.drain().map(|(_, b)| b.len() as u64).sum();
        let held: u64 = g.held.drain().map(|(_, b)| b.len() as u64).sum();
        g.bytes = g.bytes.saturating_sub(staged + held);
        g.closed = true;
    }

    /// Bytes counted against the limit now.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }
}

/// A `Stage` call receiving: completed with [`Staging::finish`], or given
/// back when dropped.
#[derive(Debug)]
pub struct Staging {
    held: Arc<Held>,
    id: u64,
    total: u64,
    done: bool,
}

impl Staging {
    /// Stores the received bytes under the id.
    pub fn finish(mut self, bytes: Bytes) {
        debug_assert_eq!(bytes.len() as u64, self.total);
        let mut g = self.held.lock();
        g.receiving.remove(&self.id);
        if g.closed {
            g.bytes = g.bytes.saturating_sub(self.total);
        } else {
            g.staged.insert(self.id, bytes);
        }
        self.done = true;
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            let mut g = self.held.lock();
            if g.receiving.remove(&self.id) {
                g.bytes = g.bytes.saturating_sub(self.total);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_bytes_are_taken_once_and_counted() {
        let h = Arc::new(Held::default());
        let s = h.begin_stage(3, 4).unwrap();
        assert!(matches!(h.begin_stage(3, 4), Err(HeldError::BadId(_))));
        assert!(h.take_staged(3).is_none(), "not complete yet");
        s.finish(Bytes::from_static(&[1, 2, 3, 4]));
        assert_eq!(h.bytes(), 4);
        assert_eq!(h.take_staged(3).as_deref(), Some(&[1u8, 2, 3, 4][..]));
        assert!(h.take_staged(3).is_none());
        assert_eq!(h.bytes(), 0);
        assert!(matches!(h.begin_stage(0, 1), Err(HeldError::BadId(_))));
    }

    #[test]
    fn an_abandoned_stage_gives_its_bytes_back_and_the_limit_holds() {
        let h = Arc::new(Held::default());
        let big = h.begin_stage(1, MAX_HELD_BYTES).unwrap();
        assert!(matches!(
            h.begin_stage(2, 1),
            Err(HeldError::Full { want: 1, .. })
        ));
        assert!(matches!(
            h.hold(Bytes::from_static(&[0])),
            Err(HeldError::Full { .. })
        ));
        drop(big);
        assert_eq!(h.bytes(), 0);
        let id = h.hold(Bytes::from_static(&[9, 9])).unwrap();
        assert_eq!(h.take_held(id).as_deref(), Some(&[9u8, 9][..]));
        assert!(h.take_held(id).is_none());
    }

    #[test]
    fn an_ended_session_keeps_nothing() {
        let h = Arc::new(Held::default());
        let late = h.begin_stage(1, 2).unwrap();
        h.hold(Bytes::from_static(&[1])).unwrap();
        h.clear();
        assert_eq!(h.bytes(), 2, "the receiving call still counts");
        late.finish(Bytes::from_static(&[1, 2]));
        assert!(h.take_staged(1).is_none());
        assert_eq!(h.bytes(), 0);
        assert_eq!(h.begin_stage(2, 1).unwrap_err(), HeldError::Closed);
    }
}
