//! The pool of host memory the cluster recycles for runtime-managed
//! buffers ([`crate::Cluster::alloc`], [`crate::ScopeGuard::alloc`]).
//!
//! The life of one pooled memfd:
//! 1. [`Pool::take`] hands out an idle memfd of the request's *size
//!    class* (the next power of two, at least a page), or makes one. It
//!    keeps one buffer id for its whole life, minted when it is made; each
//!    time it is handed out again its identity's generation goes up, so
//!    the bytes tasks touched under one generation share no index entry,
//!    version, import or device-cache copy with the next (every one of
//!    those is keyed by the whole identity).
//! 2. The buffer lives as any host buffer does: while a driver handle, a
//!    scope or an unfinished task holds it.
//! 3. When its last user lets go, `HostShared`'s drop hands the memfd to
//!    the buffer manager as a [`Returning`], beside the workers that
//!    imported it. A buffer with quarantined bytes (a task writing them
//!    was lost without a fence, and its worker may still write) is never
//!    reused: its memfd is closed once the workers let go of it too.
//! 4. The buffer manager has those workers release their imports and
//!    waits for each to answer; a worker's release also drops every copy
//!    its chip holds of the buffer, dirty ones unwritten, so nothing can
//!    be written into the memfd once every answer is in. A worker that
//!    cannot answer (lost), or that imported the buffer in a session it
//!    has since lost, cannot prove that: the memfd is discarded.
//! 5. [`Returning::recycle`] punches the whole memfd (`fallocate` with
//!    `FALLOC_FL_PUNCH_HOLE`): its pages are freed, and every later read,
//!    through any mapping, gives zeros. So an idle memfd holds no memory,
//!    and the next user finds only zero bytes — never another task's.
//!    The memfd is then kept, while the pool is within its limits (idle
//!    memfds and their bytes), or closed.
//!
//! Why a pool of memfds in the driver rather than the device's run region
//! (`Cluster::run_buffer`): an intermediate of a host-side job is read and
//! written by local workers in place, through the memfd they map; the run
//! region is one worker's device memory, gone at `wait_all`, which a long
//! job that waits between steps cannot keep its temporaries in, and which
//! other workers cannot reach. The pool reuses what is costly to make
//! (the memfd, its seals, the driver's mapping); a worker maps a recycled
//! memfd again under its new identity, as it maps any new buffer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use strata_wire::{CanonicalIdentity, IdentityMint};

use super::host::Memfd;
use crate::error::BufferError;

/// The smallest size class: one page.
const MIN_CLASS: u64 = 4096;

/// The largest size class; larger buffers get a memfd of their own size,
/// closed when they are released.
const MAX_CLASS: u64 = 1 << 30;

/// How many idle memfds, and how many bytes of them, a pool keeps
/// ([`crate::ClusterBuilder::pool_limits`]). Idle memfds hold no memory
/// (their pages were freed), but each is an open file and an address
/// range of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolLimits {
    pub(crate) idle_buffers: usize,
    pub(crate) idle_bytes: u64,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            idle_buffers: 256,
            idle_bytes: 4 << 30,
        }
    }
}

/// The pool's figures ([`crate::Cluster::pool_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Pooled buffers handed out and not back yet: in use, or being
    /// released on the workers.
    pub out: u64,
    /// Their bytes (whole size classes).
    pub out_bytes: u64,
    /// Memfds kept for reuse.
    pub idle: u64,
    /// Their bytes (address space only: their pages were freed).
    pub idle_bytes: u64,
    /// Memfds made.
    pub created: u64,
    /// Memfds handed out again.
    pub reused: u64,
    /// Memfds closed instead of kept: past the pool's limits, larger than
    /// its largest class, quarantined, or not released cleanly by a
    /// worker.
    pub discarded: u64,
}

/// An idle memfd and the identity it was last handed out under.
struct Slot {
    mem: Arc<Memfd>,
    buffer_id: u64,
    generation: u32,
}

struct Inner {
    /// Idle memfds by size class.
    idle: BTreeMap<u64, Vec<Slot>>,
    stats: PoolStats,
}

/// Host memory for runtime-managed buffers, recycled (module docs).
pub(crate) struct Pool {
    inner: Mutex<Inner>,
    limits: PoolLimits,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A memfd handed out by [`Pool::take`], with its identity.
pub(crate) struct Taken {
    pub(crate) mem: Arc<Memfd>,
    pub(crate) identity: CanonicalIdentity,
}

/// The size class of a request of `nbytes`; `None` past the largest.
fn class_of(nbytes: u64) -> Option<u64> {
    nbytes
        .max(MIN_CLASS)
        .checked_next_power_of_two()
        .filter(|&c| c <= MAX_CLASS)
}

impl Pool {
    pub(crate) fn new(limits: PoolLimits) -> Self {
        Pool {
            inner: Mutex::new(Inner {
                idle: BTreeMap::new(),
                stats: PoolStats::default(),
            }),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its figures now.
    pub(crate) fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// A zeroed memfd of at least `nbytes` (its size class), and the
    /// identity to hand it out under.
    ///
    /// # Errors
    /// [`BufferError::Empty`] for zero bytes; the memfd or the identity
    /// could not be made.
    pub(crate) fn take(&self, nbytes: u64, mint: &IdentityMint) -> Result<Taken, BufferError> {
        if nbytes == 0 {
            return Err(BufferError::Empty);
        }
        let class = class_of(nbytes);
        if let Some(class) = class {
            let mut inner = self.lock();
            let slot = inner.idle.get_mut(&class).and_then(Vec::pop);
            if let Some(slot) = slot {
                inner.stats.idle -= 1;
                inner.stats.idle_bytes -= class;
                match slot.generation.checked_add(1) {
                    Some(generation) => {
                        let identity =
                            CanonicalIdentity::new(mint.owner(), slot.buffer_id, generation)
                                .map_err(BufferError::Identity)?;
                        inner.stats.reused += 1;
                        inner.stats.out += 1;
                        inner.stats.out_bytes += class;
                        return Ok(Taken {
                            mem: slot.mem,
                            identity,
                        });
                    }
                    // Its generations are spent: a new memfd, a new id.
                    None => inner.stats.discarded += 1,
                }
            }
        }
        let size = class.unwrap_or(nbytes);
        let identity = mint.mint().map_err(BufferError::Identity)?;
        let mem = Arc::new(Memfd::create(size)?);
        let mut inner = self.lock();
        inner.stats.created += 1;
        inner.stats.out += 1;
        inner.stats.out_bytes += size;
        Ok(Taken { mem, identity })
    }

    /// A buffer handed out by [`Pool::take`] is back: kept (punched) or
    /// closed.
    fn give_back(&self, slot: Slot, reusable: bool) {
        let size = slot.mem.len();
        let keep = reusable && class_of(size) == Some(size) && slot.mem.punch().is_ok();
        let mut inner = self.lock();
        inner.stats.out -= 1;
        inner.stats.out_bytes -= size;
        let fits = inner.stats.idle < self.limits.idle_buffers as u64
            && inner.stats.idle_bytes + size <= self.limits.idle_bytes;
        if keep && fits {
            inner.stats.idle += 1;
            inner.stats.idle_bytes += size;
            inner.idle.entry(size).or_default().push(slot);
        } else {
            inner.stats.discarded += 1;
            drop(inner);
            // Unmapped and closed outside the lock.
            drop(slot);
        }
    }
}

/// A pooled buffer's memfd on its way back to its pool, from the
/// buffer's last user to the buffer manager. Dropped without
/// [`Returning::recycle`], the memfd is discarded (closed once the
/// workers' mappings go too).
pub(crate) struct Returning {
    pool: Arc<Pool>,
    slot: Option<Slot>,
    /// Whether it may be reused at all (no bytes were quarantined).
    reusable: bool,
}

impl std::fmt::Debug for Returning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Returning")
            .field("reusable", &self.reusable)
            .finish_non_exhaustive()
    }
}

impl Returning {
    pub(crate) fn new(
        pool: Arc<Pool>,
        mem: Arc<Memfd>,
        identity: &CanonicalIdentity,
        reusable: bool,
    ) -> Self {
        Returning {
            pool,
            slot: Some(Slot {
                mem,
                buffer_id: identity.buffer_id(),
                generation: identity.generation(),
            }),
            reusable,
        }
    }

    /// Back to the pool: every worker that imported it has released it.
    pub(crate) fn recycle(mut self) {
        if let Some(slot) = self.slot.take() {
            let reusable = self.reusable;
            let len = slot.mem.len();
            strata_client::offload::off_runtime(len, || self.pool.give_back(slot, reusable));
        }
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.pool.give_back(slot, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mint() -> IdentityMint {
        IdentityMint::new(*b"pooltest")
    }

    #[test]
    fn sizes_round_up_to_a_class_and_large_ones_get_their_own() {
        assert_eq!(class_of(1), Some(4096));
        assert_eq!(class_of(4096), Some(4096));
        assert_eq!(class_of(4097), Some(8192));
        assert_eq!(class_of(MAX_CLASS), Some(MAX_CLASS));
        assert_eq!(class_of(MAX_CLASS + 1), None);
        assert_eq!(class_of(u64::MAX), None);
    }

    #[test]
    fn a_recycled_memfd_is_zeroed_and_comes_back_under_the_next_generation() {
        let pool = Arc::new(Pool::new(PoolLimits::default()));
        let mint = mint();
        let a = pool.take(5000, &mint).unwrap();
        assert_eq!(a.mem.len(), 8192);
        assert_eq!(a.identity.generation(), 1);
        a.mem.map.write(100, &[7u8; 5000]).unwrap();
        let ino = a.mem.st_ino;
        Returning::new(Arc::clone(&pool), Arc::clone(&a.mem), &a.identity, true).recycle();
        let id = a.identity;
        drop(a);
        let s = pool.stats();
        assert_eq!((s.out, s.idle, s.idle_bytes, s.created), (0, 1, 8192, 1));
        let b = pool.take(8000, &mint).unwrap();
        assert_eq!(b.mem.st_ino, ino, "the same memfd");
        assert_eq!(b.identity.buffer_id(), id.buffer_id());
        assert_eq!(b.identity.generation(), 2);
        assert_ne!(b.identity, id);
        let mut bytes = vec![1u8; 8192];
        b.mem.map.read(0, &mut bytes).unwrap();
        assert!(bytes.iter().all(|&x| x == 0), "no byte of its last user");
        let s = pool.stats();
        assert_eq!((s.out, s.idle, s.reused), (1, 0, 1));
    }

    #[test]
    fn a_memfd_not_reusable_or_past_the_limits_is_closed() {
        let pool = Arc::new(Pool::new(PoolLimits {
            idle_buffers: 1,
            idle_bytes: 1 << 20,
        }));
        let mint = mint();
        let taken: Vec<Taken> = (0..3).map(|_| pool.take(10, &mint).unwrap()).collect();
        let ids: Vec<CanonicalIdentity> = taken.iter().map(|t| t.identity).collect();
        assert_eq!(
            ids.iter().collect::<std::collections::HashSet<_>>().len(),
            3
        );
        let mut it = taken.into_iter();
        let q = it.next().unwrap();
        // Quarantined: never reused.
        Returning::new(Arc::clone(&pool), q.mem, &q.identity, false).recycle();
        // Dropped on the way (a worker could not release it).
        drop(Returning::new(
            Arc::clone(&pool),
            Arc::clone(&it.as_slice()[0].mem),
            &ids[1],
            true,
        ));
        let r = it.nth(1).unwrap();
        Returning::new(Arc::clone(&pool), r.mem, &r.identity, true).recycle();
        let s = pool.stats();
        assert_eq!((s.out, s.idle, s.discarded), (0, 1, 2));
        let big = pool.take(MAX_CLASS + 1, &mint).unwrap();
        assert_eq!(big.mem.len(), MAX_CLASS + 1, "its own size");
        Returning::new(Arc::clone(&pool), big.mem, &big.identity, true).recycle();
        let s = pool.stats();
        assert_eq!((s.out, s.idle, s.discarded, s.created), (0, 1, 3, 4));
        assert!(matches!(pool.take(0, &mint), Err(BufferError::Empty)));
    }

    #[test]
    fn spent_generations_make_a_new_memfd() {
        let pool = Arc::new(Pool::new(PoolLimits::default()));
        let mint = mint();
        let a = pool.take(1, &mint).unwrap();
        let last = CanonicalIdentity::new(mint.owner(), a.identity.buffer_id(), u32::MAX).unwrap();
        Returning::new(Arc::clone(&pool), a.mem, &last, true).recycle();
        let b = pool.take(1, &mint).unwrap();
        assert_ne!(b.identity.buffer_id(), a.identity.buffer_id());
        assert_eq!(b.identity.generation(), 1);
        assert_eq!(pool.stats().discarded, 1);
    }
}
