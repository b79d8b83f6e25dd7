//! The device cache: copies of host bytes that stay on the chip between
//! tasks.
//!
//! In staged mode a task's host-backed arguments are copied into device
//! memory before it runs. Without the cache those copies are scratch
//! blocks, freed when the task ends; with it, a copy is kept and found again
//! by its [`CopyKey`]: the owner (the worker's session: copies are never
//! shared between sessions) and the exact byte set of the view (its
//! [`Footprint`], which carries the buffer's canonical identity). Two views
//! with the same byte set share one copy whatever their shape or dtype;
//! views with different byte sets have different copies, however much they
//! overlap.
//!
//! **Who decides validity.** The chip cannot see writes made elsewhere (by
//! another chip, by the driver), so it does not decide whether a copy is
//! current: the caller does. Each launch argument that uses the cache says
//! which *version* of the bytes the task must see ([`CacheUse::version`]);
//! a copy at that version is used as is (a hit), a copy at any other
//! version is replaced. An argument the kernel writes also says the version
//! its bytes have once the task succeeds ([`CacheUse::written`]) and
//! whether the written bytes go back to host memory at the end of the task
//! (write-through) or stay on the chip, *dirty*, until someone asks for
//! them ([`CacheUse::deferred`]; [`crate::Device::flush`], eviction).
//!
//! **A failed task changes nothing.** A kernel that writes an argument
//! writes a block of its own: a fresh one for a pure output, a device-side
//! copy of the cached bytes for one that also reads them (`INOUT`,
//! `OUTPUT_EXISTING`). Only a successful task's block replaces the cached
//! copy, so after a failure the cache holds what it held before, dirty
//! bytes included, exactly as host memory keeps its old bytes.
//!
//! **Memory.** Copies live in the persistent region's free space, so the
//! cache uses whatever device memory user buffers leave. Allocation evicts
//! the least recently used copy that no running task holds (a *pinned*
//! copy), writing it back first when it is dirty, until the block fits; an
//! allocation of a user buffer does the same, so user buffers keep
//! priority over cached copies (the run region is separate and never
//! shared). A copy that cannot be placed even then is not an error: the
//! argument is staged through scratch as without the cache (counted as
//! *bypassed*), so a working set larger than the cache costs copies, never
//! a thrash or a deadlock.
//!
//! **Sessions.** [`crate::Device::drop_copies`] forgets every copy of an owner
//! *without writing it back*: a session that ends without flushing has
//! ended unasked, and its driver treats what the chip held dirty as lost
//! (nothing writes into its memory after it has been told the worker is
//! gone).
//!
//! Invariants (`Cache::check_invariants`, checked by the tests and the
//! loom model):
//! - CACHE-1: every entry's block is live and no two entries share a block;
//! - CACHE-2: the LRU order lists exactly the entries, once each;
//! - CACHE-3: a pinned entry is never evicted, replaced or freed; a pin is
//!   taken and given back exactly once per launch argument;
//! - CACHE-4: the counted bytes held and held dirty equal the sums over the
//!   entries.

// SipHash, not Fx: clients name the keys (the worker's rule), and one
// session's keys must not be able to slow another's lookups.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use strata_wire::{CanonicalIdentity, Footprint, Tensor};

use crate::Error;
use crate::arena::Block;
use crate::memory::HostMemory;
use crate::sync::{Mutex, lock};

/// Which copy: an owner's copy of one exact byte set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyKey {
    /// Whose copy (a worker session): copies are never shared between
    /// owners.
    pub owner: u64,
    /// The bytes, with the buffer's identity.
    pub footprint: Footprint,
}

/// How one launch argument uses the cache (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheUse {
    /// Whose copy.
    pub owner: u64,
    /// The version of the bytes the task must see.
    pub version: u64,
    /// For an argument the kernel writes: the version of its bytes once
    /// the task has succeeded.
    pub written: u64,
    /// For an argument the kernel writes: keep the written bytes on the
    /// chip (dirty) instead of copying them to host memory when the task
    /// ends.
    pub deferred: bool,
    /// The bytes did not come with the task (a remote worker's driver left
    /// them out because the chip held them): the chip must hold them at
    /// `version`, and the launch fails with [`Error::NotHeld`], before the
    /// kernel runs, when it does not.
    pub held: bool,
    /// The byte set the copy is of, when the launch's view is not the one
    /// the driver named (bytes that came with a task, rebased into a
    /// private buffer); `None`: the launch's view itself.
    pub footprint: Option<Footprint>,
}

/// Cache counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Arguments whose bytes were on the chip at the version asked.
    pub hits: u64,
    /// Their bytes (what a copy-in would have moved).
    pub hit_bytes: u64,
    /// Arguments that read bytes the chip did not hold at that version.
    pub misses: u64,
    /// Bytes copied host → device into cached copies.
    pub loaded: u64,
    /// Bytes copied device → host from cached copies (write-through,
    /// flushes, evictions of dirty copies).
    pub written_back: u64,
    /// Dirty copies written back (by a flush or an eviction).
    pub write_backs: u64,
    /// Copies evicted to make room.
    pub evictions: u64,
    /// Bytes copied on the chip, from a cached copy to the block a writing
    /// kernel works on.
    pub device_to_device: u64,
    /// Arguments staged through scratch because no room could be made.
    pub bypassed: u64,
    /// Of `loaded`, bytes copied in ahead of their task while it waited
    /// for a lane (prefetch).
    pub prefetched: u64,
    /// Copies held now.
    pub entries: u64,
    /// Bytes of the copies held now.
    pub held: u64,
    /// Bytes of the dirty copies held now.
    pub dirty: u64,
}

impl CacheStats {
    /// Adds the counters' growth from `before` to `now` (the gauges —
    /// entries, held, dirty — are left alone).
    pub(crate) fn add_since(&mut self, now: &CacheStats, before: &CacheStats) {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        self.hits += d(now.hits, before.hits);
        self.hit_bytes += d(now.hit_bytes, before.hit_bytes);
        self.misses += d(now.misses, before.misses);
        self.loaded += d(now.loaded, before.loaded);
        self.written_back += d(now.written_back, before.written_back);
        self.write_backs += d(now.write_backs, before.write_backs);
        self.evictions += d(now.evictions, before.evictions);
        self.device_to_device += d(now.device_to_device, before.device_to_device);
        self.bypassed += d(now.bypassed, before.bypassed);
        self.prefetched += d(now.prefetched, before.prefetched);
    }

    /// Adds `other`'s counters (not its gauges).
    pub(crate) fn add(&mut self, other: &CacheStats) {
        self.add_since(other, &CacheStats::default());
    }
}

/// Where a cached argument's bytes are for one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// The cached copy, read in place (pinned until release).
    Hit(Block),
    /// A new block the kernel writes, to be filled from the cached copy
    /// `from` (pinned until release) on the chip.
    Copy {
        /// The cached copy.
        from: Block,
        /// The kernel's block.
        to: Block,
        /// The owner's drop count when acquired ([`Cache::drop_owner`]).
        epoch: u64,
    },
    /// A new block: filled from host memory when the kernel reads it,
    /// zeroed otherwise.
    Fresh {
        /// The block.
        block: Block,
        /// As for `Copy`.
        epoch: u64,
    },
    /// No room: stage through scratch, uncached.
    Bypass,
}

/// What the cache needs from the device: memory and copies.
pub(crate) trait Backend {
    /// A block of at least `len` bytes in the region copies live in.
    fn alloc(&self, len: u64) -> Result<Block, Error>;
    /// Gives `block` back.
    fn free(&self, block: Block);
    /// Copies `view`'s bytes from `block` (laid out from the view's first
    /// byte) to `host`; returns the bytes copied.
    fn write_back(&self, block: Block, view: &Tensor, host: &Arc<dyn HostMemory>) -> u64;
}

struct Entry {
    block: Block,
    version: u64,
    dirty: bool,
    pins: u32,
    tick: u64,
    /// A view with the key's byte set, for writing back.
    view: Tensor,
    /// The host memory a dirty copy goes back to (a clean one keeps none
    /// alive).
    host: Option<Arc<dyn HostMemory>>,
    /// Forgotten while pinned: freed when the last pin goes.
    doomed: bool,
}

#[derive(Default)]
struct State {
    entries: HashMap<CopyKey, Entry>,
    lru: BTreeMap<u64, CopyKey>,
    tick: u64,
    stats: CacheStats,
    /// Blocks of doomed entries, by key, still pinned.
    doomed: HashMap<CopyKey, Vec<Entry>>,
    /// How many times each owner's copies were dropped: a launch that
    /// acquired a block before a drop does not make it a copy after.
    drops: HashMap<u64, u64>,
    /// Blocks handed out (fresh or on-chip copies) and not yet released,
    /// per owner and buffer, and whether that buffer's copies were dropped
    /// meanwhile: such a block does not become a copy either. Only what is
    /// in flight is listed, so it stays small.
    busy: HashMap<(u64, CanonicalIdentity), (u32, bool)>,
}

impl State {
    /// A block for `key` is handed out to a launch.
    fn hold(&mut self, key: &CopyKey) {
        self.busy
            .entry((key.owner, *key.footprint.identity()))
            .or_default()
            .0 += 1;
    }

    /// A block for `key` comes back; whether its buffer's copies were
    /// dropped while it was out.
    fn let_go(&mut self, key: &CopyKey) -> bool {
        let k = (key.owner, *key.footprint.identity());
        let Some(b) = self.busy.get_mut(&k) else {
            return false;
        };
        b.0 -= 1;
        let dropped = b.1;
        if b.0 == 0 {
            self.busy.remove(&k);
        }
        dropped
    }

    fn touch(&mut self, key: &CopyKey) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.entries.get_mut(key) {
            self.lru.remove(&e.tick);
            e.tick = tick;
            self.lru.insert(tick, *key);
        }
    }

    fn insert(&mut self, key: CopyKey, mut entry: Entry) {
        self.tick += 1;
        entry.tick = self.tick;
        self.lru.insert(entry.tick, key);
        self.stats.entries += 1;
        self.stats.held += entry.block.len;
        if entry.dirty {
            self.stats.dirty += entry.block.len;
        }
        self.entries.insert(key, entry);
    }

    fn remove(&mut self, key: &CopyKey) -> Option<Entry> {
        let e = self.entries.remove(key)?;
        self.lru.remove(&e.tick);
        self.stats.entries -= 1;
        self.stats.held -= e.block.len;
        if e.dirty {
            self.stats.dirty -= e.block.len;
        }
        Some(e)
    }

    fn set_clean(&mut self, key: &CopyKey) {
        if let Some(e) = self.entries.get_mut(key)
            && e.dirty
        {
            e.dirty = false;
            e.host = None;
            self.stats.dirty -= e.block.len;
        }
    }

    /// Writes `e` back when dirty; counts it.
    fn write_back(&mut self, backend: &dyn Backend, key: &CopyKey) {
        let Some(e) = self.entries.get(key) else {
            return;
        };
        let (true, Some(host)) = (e.dirty, &e.host) else {
            return;
        };
        let moved = backend.write_back(e.block, &e.view, host);
        self.stats.written_back += moved;
        self.stats.write_backs += 1;
        self.set_clean(key);
    }

    /// Evicts the least recently used unpinned entry; `false` when none.
    fn evict_one(&mut self, backend: &dyn Backend) -> bool {
        let victim = self
            .lru
            .values()
            .find(|k| self.entries.get(k).is_some_and(|e| e.pins == 0))
            .copied();
        let Some(key) = victim else {
            return false;
        };
        self.write_back(backend, &key);
        if let Some(e) = self.remove(&key) {
            backend.free(e.block);
            self.stats.evictions += 1;
        }
        true
    }

    /// A block of `len` bytes, evicting as needed; `None` when even an
    /// empty cache (but for pinned copies) has no room.
    fn alloc(&mut self, backend: &dyn Backend, len: u64) -> Option<Block> {
        loop {
            if let Ok(b) = backend.alloc(len) {
                return Some(b);
            }
            if !self.evict_one(backend) {
                return None;
            }
        }
    }

    /// Gives back one pin of `key`, freeing a doomed entry's block with
    /// its last pin.
    fn unpin(&mut self, backend: &dyn Backend, key: &CopyKey, block: Block) {
        if let Some(e) = self.entries.get_mut(key)
            && e.block == block
        {
            e.pins -= 1;
            return;
        }
        if let Some(list) = self.doomed.get_mut(key)
            && let Some(i) = list.iter().position(|e| e.block == block)
        {
            list[i].pins -= 1;
            if list[i].pins == 0 {
                let e = list.swap_remove(i);
                backend.free(e.block);
            }
            if list.is_empty() {
                self.doomed.remove(key);
            }
        }
    }
}

/// The error for a held argument whose copy is not on the chip at the
/// version asked (`had`: the version it is at, if any).
fn not_held(key: &CopyKey, usage: CacheUse, had: Option<u64>) -> Error {
    Error::NotHeld {
        buffer: *key.footprint.identity(),
        footprint: format!("{:?}", key.footprint.byte_range()),
        version: usage.version,
        why: match had {
            Some(v) => format!("the chip holds version {v}"),
            None => "the chip holds no copy of them".into(),
        },
    }
}

/// The cache's bookkeeping (module docs). The device moves the bytes;
/// every structural change happens under one lock.
pub(crate) struct Cache {
    state: Mutex<State>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cache({:?})", lock(&self.state).stats)
    }
}

/// What a launch tells [`Cache::release`] about one acquired argument.
pub(crate) struct Release<'a> {
    pub(crate) key: CopyKey,
    pub(crate) acquired: Acquired,
    pub(crate) usage: CacheUse,
    /// The kernel writes the argument.
    pub(crate) writes: bool,
    /// The task succeeded.
    pub(crate) ok: bool,
    /// The bytes of a written argument went back to host memory already
    /// (write-through).
    pub(crate) written_through: u64,
    pub(crate) view: &'a Tensor,
    pub(crate) host: &'a Arc<dyn HostMemory>,
}

impl Cache {
    pub(crate) fn new() -> Self {
        Cache {
            state: Mutex::new(State::default()),
        }
    }

    /// Where the argument with `key` works for one launch: `reads` when the
    /// kernel sees the bytes as they were, `writes` when it changes them.
    ///
    /// # Errors
    /// [`Error::CacheConflict`] when the argument reads bytes the chip
    /// holds dirty at another version: the caller asked for bytes it has
    /// not had written back, which would lose the dirty ones;
    /// [`Error::NotHeld`] when the argument is [`CacheUse::held`] and the
    /// chip does not hold its bytes at the version asked (or has no room
    /// for the block a writing kernel needs beside the copy).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acquire(
        &self,
        backend: &dyn Backend,
        key: CopyKey,
        usage: CacheUse,
        reads: bool,
        writes: bool,
        len: u64,
        figures: &mut CacheStats,
    ) -> Result<Acquired, Error> {
        let mut s = lock(&self.state);
        let before = s.stats;
        let r = Self::acquire_in(&mut s, backend, key, usage, reads, writes, len);
        figures.add_since(&s.stats, &before);
        r
    }

    /// A prefetch's lookup: a new block to load the bytes of `key` into,
    /// or `None` when the chip holds them at that version already, holds
    /// a copy that is dirty or in use, or has no free room — a prefetch
    /// never evicts a copy to make room (it could push out what the
    /// running task needs next). Only a block handed out is counted (a
    /// miss, and its bytes as loaded).
    pub(crate) fn acquire_absent(
        &self,
        backend: &dyn Backend,
        key: CopyKey,
        usage: CacheUse,
        len: u64,
        figures: &mut CacheStats,
    ) -> Option<Acquired> {
        let mut s = lock(&self.state);
        match s.entries.get(&key) {
            Some(e) if e.version == usage.version || e.dirty || e.pins > 0 => return None,
            _ => {}
        }
        let block = backend.alloc(len).ok()?;
        // A stale clean copy is replaced, as the launch would.
        if let Some(old) = s.remove(&key) {
            backend.free(old.block);
        }
        let before = s.stats;
        s.stats.misses += 1;
        s.stats.loaded += len;
        figures.add_since(&s.stats, &before);
        let epoch = s.drops.get(&key.owner).copied().unwrap_or(0);
        s.hold(&key);
        Some(Acquired::Fresh { block, epoch })
    }

    fn acquire_in(
        s: &mut State,
        backend: &dyn Backend,
        key: CopyKey,
        usage: CacheUse,
        reads: bool,
        writes: bool,
        len: u64,
    ) -> Result<Acquired, Error> {
        let mut current = None;
        if let Some(e) = s.entries.get(&key) {
            if e.version == usage.version && reads {
                current = Some(e.block);
            } else if reads && e.dirty {
                return Err(Error::CacheConflict {
                    footprint: format!("{:?}", key.footprint.byte_range()),
                    buffer: *key.footprint.identity(),
                    held: e.version,
                    asked: usage.version,
                });
            } else if reads && usage.held {
                let had = e.version;
                s.stats.misses += 1;
                return Err(not_held(&key, usage, Some(had)));
            } else if e.pins > 0 {
                // In use at another version by a running task: leave it.
                s.stats.bypassed += 1;
                return Ok(Acquired::Bypass);
            } else if reads {
                // A stale clean copy: replaced below.
                if let Some(old) = s.remove(&key) {
                    backend.free(old.block);
                }
            }
        }
        if let Some(from) = current {
            s.stats.hits += 1;
            s.stats.hit_bytes += len;
            if let Some(e) = s.entries.get_mut(&key) {
                e.pins += 1;
            }
            s.touch(&key);
            if !writes {
                return Ok(Acquired::Hit(from));
            }
            let epoch = s.drops.get(&key.owner).copied().unwrap_or(0);
            return Ok(match s.alloc(backend, len) {
                Some(to) => {
                    s.stats.device_to_device += len;
                    s.hold(&key);
                    Acquired::Copy { from, to, epoch }
                }
                None => {
                    // The argument goes through scratch, staged in from
                    // host memory: the copy's dirty bytes go there first.
                    s.write_back(backend, &key);
                    s.unpin(backend, &key, from);
                    if usage.held {
                        // Host memory does not have them: the driver
                        // must send them.
                        return Err(Error::NotHeld {
                            buffer: *key.footprint.identity(),
                            footprint: format!("{:?}", key.footprint.byte_range()),
                            version: usage.version,
                            why: "no room for the copy the kernel writes".into(),
                        });
                    }
                    s.stats.bypassed += 1;
                    Acquired::Bypass
                }
            });
        }
        if reads {
            s.stats.misses += 1;
            if usage.held {
                return Err(not_held(&key, usage, None));
            }
        }
        let epoch = s.drops.get(&key.owner).copied().unwrap_or(0);
        Ok(match s.alloc(backend, len) {
            Some(block) => {
                if reads {
                    s.stats.loaded += len;
                }
                s.hold(&key);
                Acquired::Fresh { block, epoch }
            }
            None => {
                s.stats.bypassed += 1;
                Acquired::Bypass
            }
        })
    }

    /// Ends one launch's use of an acquired argument: a successful write
    /// becomes the copy at the written version; bytes loaded for a read
    /// become the copy at the version read; everything else is given back.
    pub(crate) fn release(&self, backend: &dyn Backend, r: Release<'_>, figures: &mut CacheStats) {
        let mut s = lock(&self.state);
        let before = s.stats;
        Self::release_in(&mut s, backend, r);
        figures.add_since(&s.stats, &before);
    }

    fn release_in(s: &mut State, backend: &dyn Backend, r: Release<'_>) {
        let (fresh, epoch) = match r.acquired {
            Acquired::Bypass => {
                // Written outside the cache (through scratch, to host
                // memory): a copy of the old bytes, dirty or not, is
                // superseded and must never be written back over them.
                if r.writes
                    && r.ok
                    && s.entries.get(&r.key).is_some_and(|e| e.pins == 0)
                    && let Some(old) = s.remove(&r.key)
                {
                    backend.free(old.block);
                }
                return;
            }
            Acquired::Hit(b) => {
                s.unpin(backend, &r.key, b);
                return;
            }
            Acquired::Copy { from, to, epoch } => {
                s.unpin(backend, &r.key, from);
                (to, epoch)
            }
            Acquired::Fresh { block, epoch } => (block, epoch),
        };
        s.stats.written_back += r.written_through;
        let (keep, version, dirty) = match (r.writes, r.ok) {
            (true, true) => (true, r.usage.written, r.usage.deferred),
            (true, false) => (false, 0, false),
            (false, _) => (true, r.usage.version, false),
        };
        let buffer_dropped = s.let_go(&r.key);
        let dropped = buffer_dropped || s.drops.get(&r.key.owner).copied().unwrap_or(0) != epoch;
        if !keep || dropped {
            // Dropped: nobody reads these bytes any more (the buffer was
            // let go, or the session ended).
            backend.free(fresh);
            return;
        }
        if let Some(e) = s.entries.get(&r.key) {
            let replace = r.writes || (e.pins == 0 && !e.dirty && e.version != version);
            if !replace || e.pins > 0 {
                // A read whose copy another launch placed first, or (never
                // for tasks the caller orders) a copy still pinned: a
                // written block that cannot become the copy goes to host
                // memory rather than be lost.
                if dirty {
                    s.stats.written_back += backend.write_back(fresh, r.view, r.host);
                    s.stats.write_backs += 1;
                }
                backend.free(fresh);
                return;
            }
            if let Some(old) = s.remove(&r.key) {
                backend.free(old.block);
            }
        }
        s.insert(
            r.key,
            Entry {
                block: fresh,
                version,
                dirty,
                pins: 0,
                tick: 0,
                view: *r.view,
                host: dirty.then(|| Arc::clone(r.host)),
                doomed: false,
            },
        );
    }

    /// A block for a user buffer (or anything else that outranks cached
    /// copies): `alloc`, evicting copies until it fits.
    ///
    /// # Errors
    /// The allocator's error once nothing more can be evicted.
    pub(crate) fn make_room(
        &self,
        backend: &dyn Backend,
        alloc: &dyn Fn() -> Result<Block, Error>,
    ) -> Result<Block, Error> {
        loop {
            match alloc() {
                Ok(b) => return Ok(b),
                Err(e) => {
                    let mut s = lock(&self.state);
                    if !s.evict_one(backend) {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Writes back every dirty copy of `owner` whose key `pick` accepts
    /// (they stay, clean); returns the bytes written.
    pub(crate) fn flush(
        &self,
        backend: &dyn Backend,
        owner: u64,
        pick: &dyn Fn(&Footprint) -> bool,
    ) -> u64 {
        let mut s = lock(&self.state);
        let keys: Vec<CopyKey> = s
            .entries
            .iter()
            .filter(|(k, e)| e.dirty && k.owner == owner && pick(&k.footprint))
            .map(|(k, _)| *k)
            .collect();
        let before = s.stats.written_back;
        for k in keys {
            s.write_back(backend, &k);
        }
        s.stats.written_back - before
    }

    /// Forgets every copy of `owner` (of one buffer, with `identity`),
    /// dirty ones included, without writing anything back; returns how
    /// many. A copy a running task holds is freed when it lets go.
    pub(crate) fn drop_owner(
        &self,
        backend: &dyn Backend,
        owner: u64,
        identity: Option<&CanonicalIdentity>,
    ) -> usize {
        let mut s = lock(&self.state);
        match identity {
            None => *s.drops.entry(owner).or_default() += 1,
            Some(i) => {
                if let Some(b) = s.busy.get_mut(&(owner, *i)) {
                    b.1 = true;
                }
            }
        }
        let keys: Vec<CopyKey> = s
            .entries
            .keys()
            .filter(|k| k.owner == owner && identity.is_none_or(|i| k.footprint.identity() == i))
            .copied()
            .collect();
        for k in &keys {
            if let Some(mut e) = s.remove(k) {
                if e.pins == 0 {
                    backend.free(e.block);
                } else {
                    e.doomed = true;
                    s.doomed.entry(*k).or_default().push(e);
                }
            }
        }
        keys.len()
    }

    /// Counts bytes a prefetch copied in.
    pub(crate) fn count_prefetched(&self, bytes: u64) {
        lock(&self.state).stats.prefetched += bytes;
    }

    /// Takes back a hit on a copy a prefetch made for the launch: that
    /// copy counted as its miss.
    pub(crate) fn uncount_hit(&self, bytes: u64) {
        let mut s = lock(&self.state);
        s.stats.hits = s.stats.hits.saturating_sub(1);
        s.stats.hit_bytes = s.stats.hit_bytes.saturating_sub(bytes);
    }

    /// The counters.
    pub(crate) fn stats(&self) -> CacheStats {
        lock(&self.state).stats
    }

    /// Every copy held: key, version, dirty, pinned.
    pub(crate) fn copies(&self) -> Vec<(CopyKey, u64, bool, bool)> {
        let s = lock(&self.state);
        let mut v: Vec<_> = s
            .entries
            .iter()
            .map(|(k, e)| (*k, e.version, e.dirty, e.pins > 0))
            .collect();
        v.sort_by_key(|(k, ..)| (k.owner, k.footprint.byte_range().start));
        v
    }

    /// Checks CACHE-1, -2 and -4 (module docs); CACHE-3 is what the tests
    /// and models check around it.
    ///
    /// # Errors
    /// The first broken invariant.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let s = lock(&self.state);
        let mut blocks = std::collections::HashSet::new();
        let (mut held, mut dirty) = (0, 0);
        for (k, e) in &s.entries {
            if !blocks.insert(e.block.offset) {
                return Err(format!("CACHE-1: block {:#x} held twice", e.block.offset));
            }
            if s.lru.get(&e.tick) != Some(k) {
                return Err(format!("CACHE-2: entry {k:?} not in the LRU order"));
            }
            if e.doomed {
                return Err(format!("CACHE-3: doomed entry {k:?} still listed"));
            }
            held += e.block.len;
            if e.dirty {
                dirty += e.block.len;
            }
        }
        for list in s.doomed.values() {
            for e in list {
                if !blocks.insert(e.block.offset) {
                    return Err(format!("CACHE-1: block {:#x} held twice", e.block.offset));
                }
                if e.pins == 0 {
                    return Err("CACHE-3: a doomed block with no pin is not freed".into());
                }
            }
        }
        if s.lru.len() != s.entries.len() {
            return Err(format!(
                "CACHE-2: {} LRU ticks for {} entries",
                s.lru.len(),
                s.entries.len()
            ));
        }
        if (held, dirty, s.entries.len() as u64) != (s.stats.held, s.stats.dirty, s.stats.entries) {
            return Err(format!(
                "CACHE-4: counted {} held / {} dirty / {} entries, summed {held} / {dirty} / {}",
                s.stats.held,
                s.stats.dirty,
                s.stats.entries,
                s.entries.len()
            ));
        }
        Ok(())
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::arena::{Pool, UNIT};
    use crate::memory::HostBuffer;
    use crate::sync::{AtomicU64, Ordering, thread};
    use strata_wire::{Access, AddressSpace, Backing, BufferDescriptor, DType, Region};

    /// Copies in a real (loom-checked) pool; write-backs counted. A free
    /// the pool refuses is a double free: the model fails.
    struct Fake {
        pool: Pool,
        written: AtomicU64,
    }

    impl Backend for Fake {
        fn alloc(&self, len: u64) -> Result<Block, Error> {
            self.pool.alloc(len)
        }
        fn free(&self, block: Block) {
            self.pool.free(block.offset).expect("freed once");
        }
        fn write_back(&self, _: Block, view: &Tensor, _: &Arc<dyn HostMemory>) -> u64 {
            self.written.fetch_add(1, Ordering::Relaxed);
            view.extent_bytes()
        }
    }

    fn fixture(blocks: u64) -> (Arc<Cache>, Arc<Fake>, Tensor, Arc<dyn HostMemory>) {
        let id = CanonicalIdentity::new(*b"loomcach", 1, 1).unwrap();
        let desc = BufferDescriptor::new(
            id,
            UNIT,
            AddressSpace::Host,
            Access::ReadWrite,
            Backing::Memfd {
                st_dev: 1,
                st_ino: 1,
            },
        )
        .unwrap();
        let view = Tensor::new(desc, 0, &[16], &[1], DType::F32).unwrap();
        let host: Arc<dyn HostMemory> = Arc::new(HostBuffer::new(UNIT as usize).unwrap());
        let fake = Fake {
            pool: Pool::new(Region::Persistent, 0, blocks * UNIT),
            written: AtomicU64::new(0),
        };
        (Arc::new(Cache::new()), Arc::new(fake), view, host)
    }

    fn usage(version: u64, written: u64) -> CacheUse {
        CacheUse {
            owner: 1,
            version,
            written,
            deferred: true,
            held: false,
            footprint: None,
        }
    }

    /// Two launches read the same bytes while a user block that needs the
    /// whole region evicts: a pinned copy is never evicted or freed under
    /// a reader, no block is freed twice, and at the end the books balance.
    #[test]
    fn readers_and_an_evicting_user_block() {
        loom::model(|| {
            let (cache, fake, view, host) = fixture(2);
            let key = CopyKey {
                owner: 1,
                footprint: Footprint::of(&view),
            };
            let reader = || {
                let (cache, fake, host) =
                    (Arc::clone(&cache), Arc::clone(&fake), Arc::clone(&host));
                thread::spawn(move || {
                    let got = cache
                        .acquire(
                            fake.as_ref(),
                            key,
                            usage(1, 2),
                            true,
                            false,
                            UNIT,
                            &mut CacheStats::default(),
                        )
                        .unwrap();
                    if let Acquired::Hit(b) = got {
                        // Pinned: still the copy, whatever the user block
                        // evicts meanwhile.
                        thread::yield_now();
                        let held = lock(&cache.state).entries.get(&key).map(|e| e.block);
                        assert_eq!(held, Some(b), "a pinned copy was evicted");
                    }
                    cache.release(
                        fake.as_ref(),
                        Release {
                            key,
                            acquired: got,
                            usage: usage(1, 2),
                            writes: false,
                            ok: true,
                            written_through: 0,
                            view: &view,
                            host: &host,
                        },
                        &mut CacheStats::default(),
                    );
                })
            };
            let a = reader();
            let b = reader();
            if let Ok(user) = cache.make_room(fake.as_ref(), &|| fake.pool.alloc(2 * UNIT)) {
                fake.pool.free(user.offset).unwrap();
            }
            a.join().unwrap();
            b.join().unwrap();
            cache.check_invariants().unwrap();
            cache.drop_owner(fake.as_ref(), 1, None);
            cache.check_invariants().unwrap();
            assert_eq!(fake.pool.stats().in_use, 0);
        });
    }

    /// A write that leaves its bytes dirty races a flush and a session's
    /// end: the flush writes back at most the one dirty copy, a copy whose
    /// write began before the drop is not kept after it, and nothing
    /// leaks.
    #[test]
    fn a_dirty_write_against_flush_and_drop() {
        loom::model(|| {
            let (cache, fake, view, host) = fixture(2);
            let key = CopyKey {
                owner: 1,
                footprint: Footprint::of(&view),
            };
            let writer = {
                let (cache, fake, host) =
                    (Arc::clone(&cache), Arc::clone(&fake), Arc::clone(&host));
                thread::spawn(move || {
                    let got = cache
                        .acquire(
                            fake.as_ref(),
                            key,
                            usage(1, 2),
                            false,
                            true,
                            UNIT,
                            &mut CacheStats::default(),
                        )
                        .unwrap();
                    cache.release(
                        fake.as_ref(),
                        Release {
                            key,
                            acquired: got,
                            usage: usage(1, 2),
                            writes: true,
                            ok: true,
                            written_through: 0,
                            view: &view,
                            host: &host,
                        },
                        &mut CacheStats::default(),
                    );
                })
            };
            let flushed = cache.flush(fake.as_ref(), 1, &|_| true);
            cache.drop_owner(fake.as_ref(), 1, None);
            writer.join().unwrap();
            assert!(flushed == 0 || flushed == UNIT);
            assert!(fake.written.load(Ordering::Relaxed) <= 1);
            cache.check_invariants().unwrap();
            // At most the write that began after the drop is kept.
            assert!(cache.stats().entries <= 1);
            cache.drop_owner(fake.as_ref(), 1, None);
            assert_eq!(fake.pool.stats().in_use, 0);
        });
    }
}
