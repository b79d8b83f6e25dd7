//! The local data plane: a submission ring and a completion ring of task
//! records in one memfd that a driver and a worker on the same host both
//! map, with futex wake-ups that cost nothing while the other side is busy.
//!
//! Each ring ([`Lane`]) is single-producer, single-consumer, over a byte
//! region whose size is a power of two. A record is an 8-byte header
//! (`len: u32`, `kind: u32`) then `len` bytes, padded to 8; a record that
//! would cross the region's end is preceded by a pad record to the end.
//! The producer writes records past its private head, then *publishes*
//! them all with one release store of `head` and one ring of the lane's
//! data bell; the consumer copies records out below the head it acquired,
//! then *releases* them with one store of `tail` and one ring of the space
//! bell. Positions are byte counts that only grow (`u64`), so full and
//! empty are never confused.
//!
//! # Wake-ups
//! A bell (`Bell`) is one futex word: bit 0 says a waiter is parked (or about
//! to be), the rest is a sequence. Ringing bumps the sequence and clears
//! the bit in one read-modify-write, and makes the futex call only when
//! the bit was set — a busy peer costs one atomic per batch, never a
//! system call. A waiter spins a while on the condition, then reads the
//! word, checks the condition once more, sets the bit by compare-exchange
//! on the value it read and sleeps on the word holding that value. Every
//! ring is ordered with the waiter's read: before it (the waiter's
//! acquire read then sees what the ringer published), between the read
//! and the compare-exchange (which then fails, so the waiter looks
//! again), or after (the ringer sees the bit and wakes, and the kernel's
//! compare-and-sleep cannot miss it). No wake-up is lost; the loom models
//! in this crate check that over every interleaving.
//!
//! # The other side is hostile
//! Everything in the mapping can be written by the peer at any time. The
//! peer's position is read once per step and checked (it never passes
//! ours, never more than the capacity ahead); a record header is read
//! into locals and checked (kind, length, in bounds) before its bytes are
//! copied out, and the bytes are decoded only after they are copied: a
//! bad value is a [`RingError::Corrupt`] that ends the session, never a
//! read outside the region. Our own positions are kept privately and
//! only stored to the mapping.

#![deny(unsafe_code)]

pub mod shm;
mod sync;
pub mod watched;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sync::{AtomicU32, AtomicU64, Ordering, Word};

/// Bytes of a record's header.
pub const RECORD_HEADER: usize = 8;
const KIND_RECORD: u32 = 1;
const KIND_PAD: u32 = 2;

/// Why a ring operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// Either side closed the ring (the session ended).
    #[error("the ring is closed")]
    Closed,
    /// The peer wrote something impossible: the session cannot go on.
    #[error("the ring is corrupt: {0}")]
    Corrupt(String),
    /// A record longer than a ring of this size carries.
    #[error("a record of {len} bytes is larger than this ring carries ({max})")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The most a record may hold.
        max: usize,
    },
    /// The mapping is not a ring (size, magic, version, capacities).
    #[error("not a ring: {0}")]
    Layout(String),
    /// The memfd could not be made or mapped.
    #[error("ring memory: {0}")]
    Io(String),
}

/// What a wait ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The condition holds.
    Ready,
    /// The ring is closed.
    Closed,
    /// The deadline passed first.
    TimedOut,
}

/// How long to spin before parking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spin {
    /// Checks of the condition, each followed by a spin hint.
    pub spins: u32,
    /// Then this many checks each followed by a yield of the CPU.
    pub yields: u32,
}

impl Spin {
    /// No spinning: park at once.
    pub const NONE: Spin = Spin {
        spins: 0,
        yields: 0,
    };
}

/// A cache line of its own for `T`, so the two sides' words do not share
/// one.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(crate) struct Padded<T>(pub(crate) T);

/// A futex word with a parked bit (see the crate docs).
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Bell {
    word: Word,
}

impl Bell {
    /// Bumps the sequence; wakes a parked waiter if there is one.
    pub(crate) fn ring(&self) {
        let v = &self.word.v;
        let mut cur = v.load(Ordering::Relaxed);
        loop {
            let next = cur.wrapping_add(2) & !1;
            match v.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
        if cur & 1 != 0 {
            self.word.wake();
        }
    }

    /// Waits until `ready()` (then [`Waited::Ready`]), `closed()` (then
    /// [`Waited::Closed`]) or `deadline`.
    pub(crate) fn wait(
        &self,
        spin: Spin,
        deadline: Option<Instant>,
        mut ready: impl FnMut() -> bool,
        closed: impl Fn() -> bool,
    ) -> Waited {
        let mut check = || {
            if ready() {
                Some(Waited::Ready)
            } else if closed() {
                Some(Waited::Closed)
            } else {
                None
            }
        };
        for _ in 0..spin.spins {
            if let Some(w) = check() {
                return w;
            }
            sync::spin();
        }
        for _ in 0..spin.yields {
            if let Some(w) = check() {
                return w;
            }
            std::thread::yield_now();
        }
        let v = &self.word.v;
        loop {
            let seen = v.load(Ordering::Acquire);
            if let Some(w) = check() {
                return w;
            }
            let slice = match deadline {
                None => Duration::from_secs(1),
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Waited::TimedOut,
                },
            };
            let parked = seen | 1;
            if seen & 1 == 0
                && v.compare_exchange(seen, parked, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            self.word.wait(parked, slice);
        }
    }
}

/// One direction: the shared words of a single-producer, single-consumer
/// ring. Its bytes are elsewhere ([`Store`]).
#[derive(Debug, Default)]
#[repr(C)]
pub struct Lane {
    /// End of the published records (the producer stores it).
    head: Padded<AtomicU64>,
    /// End of the released records (the consumer stores it).
    tail: Padded<AtomicU64>,
    /// Non-zero once either side closed the ring.
    closed: Padded<AtomicU32>,
    /// Rung by the producer when it publishes; the consumer parks on it.
    data: Padded<Bell>,
    /// Rung by the consumer when it releases; the producer parks on it.
    space: Padded<Bell>,
}

impl Lane {
    fn is_closed(&self) -> bool {
        self.closed.0.load(Ordering::Acquire) != 0
    }

    /// Waits on `bell` until `position` is no longer `from`, the lane
    /// closes, or `deadline` passes.
    fn wait_moved(
        &self,
        bell: &Bell,
        position: &AtomicU64,
        from: u64,
        spin: Spin,
        deadline: Option<Instant>,
    ) -> Waited {
        bell.wait(
            spin,
            deadline,
            || position.load(Ordering::Acquire) != from,
            || self.is_closed(),
        )
    }

    fn close(&self) {
        self.closed.0.store(1, Ordering::Release);
        self.data.0.ring();
        self.space.0.ring();
    }
}

/// The bytes of one lane. The peer may write them at any time: they are
/// only ever copied, never referenced.
pub trait Store: Send + Sync {
    /// Bytes in the region (a power of two, at least 64).
    fn capacity(&self) -> usize;
    /// Copies `src` to `at..at + src.len()` (in bounds: callers check).
    fn put(&self, at: usize, src: &[u8]);
    /// Copies `at..at + dst.len()` into `dst` (in bounds: callers check).
    fn get(&self, at: usize, dst: &mut [u8]);
}

/// Memory holding both lanes of a session: the submission lane (driver
/// to worker) and the completion lane (worker to driver).
pub trait Memory: Send + Sync + std::fmt::Debug + 'static {
    /// The shared words of a lane.
    fn lane(&self, which: Which) -> &Lane;
    /// The bytes of a lane.
    fn store(&self, which: Which) -> &dyn Store;
}

/// Which lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Tasks, driver to worker.
    Submit,
    /// Completions, worker to driver.
    Complete,
}

/// Closes both lanes of `mem` and wakes whoever waits on either.
pub fn close(mem: &dyn Memory) {
    mem.lane(Which::Submit).close();
    mem.lane(Which::Complete).close();
}

/// Whether either side closed `mem`'s lanes.
pub fn is_closed(mem: &dyn Memory) -> bool {
    mem.lane(Which::Submit).is_closed() || mem.lane(Which::Complete).is_closed()
}

fn round8(n: usize) -> usize {
    (n + 7) & !7
}

/// The largest record a lane of `capacity` bytes carries: with at most
/// half the region per record, an empty ring always takes one, pad
/// included.
pub fn max_record(capacity: usize) -> usize {
    capacity / 2 - RECORD_HEADER
}

fn header(len: u32, kind: u32) -> [u8; RECORD_HEADER] {
    let mut h = [0u8; RECORD_HEADER];
    h[..4].copy_from_slice(&len.to_le_bytes());
    h[4..].copy_from_slice(&kind.to_le_bytes());
    h
}

/// The writing end of a lane.
pub struct Producer {
    mem: Arc<dyn Memory>,
    which: Which,
    /// End of what we wrote (ours alone: never read back).
    head: u64,
    /// What we last published.
    published: u64,
    cap: u64,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("which", &self.which)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// The producer of `which` in `mem`. One per lane: two would corrupt it.
    pub fn new(mem: Arc<dyn Memory>, which: Which) -> Self {
        let cap = mem.store(which).capacity() as u64;
        let head = mem.lane(which).head.0.load(Ordering::Relaxed);
        Producer {
            mem,
            which,
            head,
            published: head,
            cap,
        }
    }

    fn lane(&self) -> &Lane {
        self.mem.lane(self.which)
    }

    /// The most one record may hold.
    pub fn max_record(&self) -> usize {
        max_record(self.cap as usize)
    }

    /// Free bytes, from the consumer's tail (checked).
    fn free(&self) -> Result<u64, RingError> {
        let tail = self.lane().tail.0.load(Ordering::Acquire);
        if tail > self.head || self.head - tail > self.cap {
            return Err(RingError::Corrupt(format!(
                "the consumer's tail {tail} is not within {} bytes below our head {}",
                self.cap, self.head
            )));
        }
        Ok(self.cap - (self.head - tail))
    }

    /// Bytes `len` takes at the current head, pad included.
    fn needed(&self, len: usize) -> (u64, u64) {
        let need = (RECORD_HEADER + round8(len)) as u64;
        let to_end = self.cap - self.head % self.cap;
        let pad = if need > to_end { to_end } else { 0 };
        (pad, need)
    }

    /// Writes one record after the others not yet published; `Ok(false)`
    /// when the ring has no room for it now.
    ///
    /// # Errors
    /// [`RingError::TooLarge`], [`RingError::Closed`], or a corrupt tail.
    pub fn try_push(&mut self, payload: &[u8]) -> Result<bool, RingError> {
        let max = self.max_record();
        if payload.len() > max {
            return Err(RingError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        if self.lane().is_closed() {
            return Err(RingError::Closed);
        }
        let (pad, need) = self.needed(payload.len());
        if pad + need > self.free()? {
            return Ok(false);
        }
        let cap = self.cap;
        let store = self.mem.store(self.which);
        if pad > 0 {
            store.put((self.head % cap) as usize, &header(0, KIND_PAD));
            self.head += pad;
        }
        let at = (self.head % cap) as usize;
        // `payload.len() <= max < u32::MAX`, checked above.
        store.put(at, &header(payload.len() as u32, KIND_RECORD));
        store.put(at + RECORD_HEADER, payload);
        self.head += need;
        Ok(true)
    }

    /// Makes every record written so far visible, and wakes the consumer
    /// if it is parked. Cheap when nothing is new.
    pub fn publish(&mut self) {
        if self.head != self.published {
            self.lane().head.0.store(self.head, Ordering::Release);
            self.published = self.head;
            self.lane().data.0.ring();
        }
    }

    /// Writes one record, waiting for room (spinning per `spin`, then
    /// parked) as long as `deadline` allows; publishes what was written
    /// before waiting, so that the consumer can make room.
    ///
    /// # Errors
    /// As [`Producer::try_push`]; [`Waited::TimedOut`] is
    /// `Ok(false)`.
    pub fn push(
        &mut self,
        payload: &[u8],
        spin: Spin,
        deadline: Option<Instant>,
    ) -> Result<bool, RingError> {
        loop {
            if self.try_push(payload)? {
                return Ok(true);
            }
            self.publish();
            let (pad, need) = self.needed(payload.len());
            let lane = self.mem.lane(self.which);
            let mut corrupt = false;
            let waited = lane.space.0.wait(
                spin,
                deadline,
                || match self.free() {
                    Ok(free) => free >= pad + need,
                    Err(_) => {
                        corrupt = true;
                        true
                    }
                },
                || lane.is_closed(),
            );
            match waited {
                Waited::Ready if corrupt => {
                    self.free()?;
                }
                Waited::Ready => {}
                Waited::Closed => return Err(RingError::Closed),
                Waited::TimedOut => return Ok(false),
            }
        }
    }

    /// Waits until the consumer releases bytes past `tail` (an earlier
    /// [`Producer::tail`]), the ring closes, or `deadline` passes: what a
    /// writer that does not hold the producer waits on before trying again.
    pub fn wait_released(
        mem: &dyn Memory,
        which: Which,
        tail: u64,
        spin: Spin,
        deadline: Option<Instant>,
    ) -> Waited {
        let lane = mem.lane(which);
        lane.wait_moved(&lane.space.0, &lane.tail.0, tail, spin, deadline)
    }

    /// The consumer's tail as it stands (unchecked: for
    /// [`Producer::wait_released`] only).
    pub fn tail(&self) -> u64 {
        self.lane().tail.0.load(Ordering::Acquire)
    }

    /// The memory this producer writes.
    pub fn memory(&self) -> &Arc<dyn Memory> {
        &self.mem
    }
}

/// The reading end of a lane.
pub struct Consumer {
    mem: Arc<dyn Memory>,
    which: Which,
    /// End of what we read (ours alone).
    tail: u64,
    released: u64,
    cap: u64,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("which", &self.which)
            .field("tail", &self.tail)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// The consumer of `which` in `mem`. One per lane.
    pub fn new(mem: Arc<dyn Memory>, which: Which) -> Self {
        let cap = mem.store(which).capacity() as u64;
        let tail = mem.lane(which).tail.0.load(Ordering::Relaxed);
        Consumer {
            mem,
            which,
            tail,
            released: tail,
            cap,
        }
    }

    fn lane(&self) -> &Lane {
        self.mem.lane(self.which)
    }

    /// The producer's head (checked).
    fn head(&self) -> Result<u64, RingError> {
        let head = self.lane().head.0.load(Ordering::Acquire);
        if head < self.tail || head - self.tail > self.cap {
            return Err(RingError::Corrupt(format!(
                "the producer's head {head} is not within {} bytes above our tail {}",
                self.cap, self.tail
            )));
        }
        Ok(head)
    }

    /// Copies the next published record into `out` (replacing what it
    /// held); `Ok(false)` when there is none now.
    ///
    /// # Errors
    /// [`RingError::Corrupt`]: the producer wrote an impossible head or
    /// record header.
    pub fn try_pop(&mut self, out: &mut Vec<u8>) -> Result<bool, RingError> {
        let head = self.head()?;
        let cap = self.cap;
        let store = self.mem.store(self.which);
        loop {
            if head == self.tail {
                return Ok(false);
            }
            let avail = head - self.tail;
            let at = self.tail % cap;
            if avail < RECORD_HEADER as u64 || at % 8 != 0 {
                return Err(RingError::Corrupt(format!(
                    "{avail} bytes published at offset {at}: not a whole record header"
                )));
            }
            let mut h = [0u8; RECORD_HEADER];
            store.get(at as usize, &mut h);
            let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
            let kind = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            match kind {
                KIND_PAD => {
                    let to_end = cap - at;
                    if to_end > avail {
                        return Err(RingError::Corrupt(format!(
                            "a pad of {to_end} bytes at offset {at} runs past the {avail} published"
                        )));
                    }
                    self.tail += to_end;
                }
                KIND_RECORD => {
                    let max = max_record(cap as usize);
                    let need = (RECORD_HEADER + round8(len)) as u64;
                    if len > max || need > avail || at + need > cap {
                        return Err(RingError::Corrupt(format!(
                            "a record of {len} bytes at offset {at} does not fit (published {avail}, region {cap}, most {max})"
                        )));
                    }
                    out.clear();
                    out.resize(len, 0);
                    store.get(at as usize + RECORD_HEADER, out);
                    self.tail += need;
                    return Ok(true);
                }
                other => {
                    return Err(RingError::Corrupt(format!(
                        "record kind {other} at offset {at}"
                    )));
                }
            }
        }
    }

    /// Gives the bytes of every record read so far back to the producer,
    /// and wakes it if it waits for room.
    pub fn release(&mut self) {
        if self.tail != self.released {
            self.lane().tail.0.store(self.tail, Ordering::Release);
            self.released = self.tail;
            self.lane().space.0.ring();
        }
    }

    /// Waits until a record is published (spinning per `spin`, then
    /// parked), the ring closes, or `deadline` passes. Releases what was
    /// read first, so a producer waiting for room is not kept waiting.
    pub fn wait(&mut self, spin: Spin, deadline: Option<Instant>) -> Waited {
        self.release();
        Consumer::wait_published(&*self.mem, self.which, self.tail, spin, deadline)
    }

    /// Waits until a record is published past `tail` (an earlier
    /// [`Consumer::position`]), the ring closes, or `deadline` passes: what
    /// a reader that does not hold the consumer while it waits (because
    /// another thread may read the lane meanwhile) waits on before it
    /// takes the consumer again. Release what was read first.
    pub fn wait_published(
        mem: &dyn Memory,
        which: Which,
        tail: u64,
        spin: Spin,
        deadline: Option<Instant>,
    ) -> Waited {
        let lane = mem.lane(which);
        lane.wait_moved(&lane.data.0, &lane.head.0, tail, spin, deadline)
    }

    /// The end of what this consumer has read.
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// The memory this consumer reads.
    pub fn memory(&self) -> &Arc<dyn Memory> {
        &self.mem
    }
}

/// Heap blocks a ring thread allocated when it started, held for its
/// life: see [`warm_heap`].
#[derive(Debug)]
pub struct WarmHeap {
    _blocks: Vec<Vec<u8>>,
}

/// Allocates and writes one block in each of the small size classes a
/// task record's decoding and its completion use, from the calling
/// thread, and holds them while the returned value lives.
///
/// Why: a thread's first allocations take fresh pages from the
/// allocator, and where those pages are backed by a transparent huge
/// page the first touch zeroes 2 MiB (in a virtual machine whose host has
/// not backed that memory yet, a few milliseconds, preempted or not).
/// Without this the first task a fresh ring carries pays that, on both
/// sides; with it the thread pays it as it starts, before any record. The
/// blocks stay allocated so that the allocator does not hand their pages
/// back (and later purge them) before the first record comes.
pub fn warm_heap() -> WarmHeap {
    const SIZES: [usize; 16] = [
        8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192,
    ];
    WarmHeap {
        _blocks: SIZES
            .iter()
            .map(|&n| {
                let mut v = Vec::with_capacity(n);
                v.resize(n, 1u8);
                std::hint::black_box(v)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
