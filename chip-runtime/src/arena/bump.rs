//! The run region: a lock-free bump allocator, reset as a whole.
//!
//! The cursor and the run number ("epoch") share one atomic word —
//! `epoch << 32 | units used` — so that an allocation and a reset are each
//! one atomic step: a block is carved from exactly the run it is stamped
//! with, and a reset both rewinds the cursor and ends that run at once.
//! With two separate atomics an allocation racing a reset could take a
//! range of the new run while carrying the old run's number (refused
//! although live) or the reverse (accepted after its bytes were handed
//! out again).
//!
//! Protocol:
//! 1. `alloc` CASes `(e, used) → (e, used + units)` when the end fits the
//!    capacity, and returns a block stamped with run `e`.
//! 2. `reset` swaps `(e, _) → (e + 1, 0)`: every block of run `e` is gone.
//! 3. `check` accepts a block only if its stamp is the current run and it
//!    ends inside the used part; a block of an ended run is
//!    [`Error::RunEnded`], even when its bytes now lie inside blocks of a
//!    later run.
//!
//! Run numbers are 32 bits and wrap; a stale block is mistaken for a live
//! one only after exactly 2^32 resets, which the worker's use (one reset
//! per job boundary) does not reach.

use super::{Block, Region, RegionStats, UNIT, units_for};
use crate::Error;
use crate::sync::{AtomicU64, Ordering};

/// The low half of the state word: 64-byte units handed out this run.
const UNITS_MASK: u64 = 0xffff_ffff;

fn unpack(state: u64) -> (u32, u64) {
    // Lossless: the high half is 32 bits.
    ((state >> 32) as u32, state & UNITS_MASK)
}

fn pack(epoch: u32, units: u64) -> u64 {
    (u64::from(epoch) << 32) | (units & UNITS_MASK)
}

#[derive(Debug)]
pub(crate) struct Bump {
    base: u64,
    capacity: u64,
    /// `epoch << 32 | units handed out since the last reset`.
    state: AtomicU64,
    peak: AtomicU64,
    allocs: AtomicU64,
    resets: AtomicU64,
    failed: AtomicU64,
}

impl Bump {
    /// A region of `capacity` bytes (a multiple of 64, at most 2^32 − 1
    /// units: [`crate::spec::MAX_REGION_BYTES`]) at `base`.
    pub(crate) fn new(base: u64, capacity: u64) -> Bump {
        Bump {
            base,
            capacity,
            state: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            allocs: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The current run number.
    pub(crate) fn epoch(&self) -> u32 {
        unpack(self.state.load(Ordering::Relaxed)).0
    }

    pub(crate) fn alloc(&self, nbytes: u64) -> Result<Block, Error> {
        let units = units_for(nbytes);
        let cap_units = self.capacity / UNIT;
        // Claim [start, start + units) of the current run with a CAS so
        // that two threads never get overlapping ranges, the cursor never
        // passes the capacity, and the block's run number is the run it
        // was carved from. Relaxed suffices: the word publishes no other
        // memory; the bytes are handed to the caller, who orders their use.
        let claim = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                let (epoch, used) = unpack(s);
                let end = used.checked_add(units?)?;
                (end <= cap_units).then(|| pack(epoch, end))
            });
        match (claim, units) {
            (Ok(s), Some(units)) => {
                let (epoch, start) = unpack(s);
                self.allocs.fetch_add(1, Ordering::Relaxed);
                self.peak
                    .fetch_max((start + units) * UNIT, Ordering::Relaxed);
                Ok(Block {
                    region: Region::Run,
                    offset: self.base + start * UNIT,
                    len: nbytes,
                    epoch,
                })
            }
            (Err(s), _) | (Ok(s), None) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                let free = self.capacity.saturating_sub(unpack(s).1 * UNIT);
                Err(Error::OutOfMemory {
                    region: Region::Run,
                    asked: nbytes,
                    free,
                    largest: free,
                })
            }
        }
    }

    /// Accepts `block` only while its run is the current one and it lies in
    /// the part of the region handed out.
    ///
    /// # Errors
    /// [`Error::RunEnded`] for a block of an ended run;
    /// [`Error::UnknownBlock`] for one this region never handed out.
    pub(crate) fn check(&self, block: &Block) -> Result<(), Error> {
        let (epoch, used) = unpack(self.state.load(Ordering::Relaxed));
        if block.epoch != epoch {
            return Err(Error::RunEnded {
                addr: block.offset,
                run: block.epoch,
                current: epoch,
            });
        }
        let end = block
            .offset
            .checked_sub(self.base)
            .filter(|rel| rel % UNIT == 0)
            .and_then(|rel| rel.checked_add(units_for(block.len)? * UNIT));
        match end {
            Some(end) if end <= used * UNIT => Ok(()),
            _ => Err(Error::UnknownBlock {
                region: Region::Run,
                addr: block.offset,
            }),
        }
    }

    /// The run block containing `offset`: the region hands out no per-block
    /// records, so the answer is the used part of the current run.
    pub(crate) fn block_containing(&self, offset: u64) -> Option<Block> {
        let (epoch, used) = unpack(self.state.load(Ordering::Relaxed));
        let rel = offset.checked_sub(self.base)?;
        (rel < used * UNIT).then_some(Block {
            region: Region::Run,
            offset: self.base,
            len: used * UNIT,
            epoch,
        })
    }

    /// Ends the current run: every block handed out is released at once and
    /// refused from now on. Returns the new run number.
    pub(crate) fn reset(&self) -> u32 {
        let old = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(pack(unpack(s).0.wrapping_add(1), 0))
            })
            .unwrap_or_else(|s| s);
        self.resets.fetch_add(1, Ordering::Relaxed);
        unpack(old).0.wrapping_add(1)
    }

    pub(crate) fn stats(&self) -> RegionStats {
        RegionStats {
            capacity: self.capacity,
            in_use: unpack(self.state.load(Ordering::Relaxed)).1 * UNIT,
            peak: self.peak.load(Ordering::Relaxed),
            allocs: self.allocs.load(Ordering::Relaxed),
            frees: self.resets.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let used = unpack(self.state.load(Ordering::Relaxed)).1 * UNIT;
        if used > self.capacity {
            return Err(format!(
                "run: cursor {used} is past the capacity {}",
                self.capacity
            ));
        }
        Ok(())
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::{Arc, thread};

    /// Two concurrent bump allocations in a region with room for both get
    /// disjoint ranges inside it.
    #[test]
    fn concurrent_bumps_are_disjoint() {
        loom::model(|| {
            let run = Arc::new(Bump::new(1024, 3 * UNIT));
            let other = Arc::clone(&run);
            let t = thread::spawn(move || other.alloc(2 * UNIT).unwrap());
            let mine = run.alloc(UNIT).unwrap();
            let theirs = t.join().unwrap();
            let (a, b) = if mine.offset < theirs.offset {
                (mine, theirs)
            } else {
                (theirs, mine)
            };
            assert!(a.offset + a.len <= b.offset, "{a:?} overlaps {b:?}");
            assert!(a.offset >= 1024 && b.offset + b.len <= 1024 + 3 * UNIT);
            run.check_invariants().unwrap();
        });
    }

    /// When only one of two racing allocations fits, exactly one succeeds.
    #[test]
    fn only_what_fits_is_handed_out() {
        loom::model(|| {
            let run = Arc::new(Bump::new(0, 2 * UNIT));
            let other = Arc::clone(&run);
            let t = thread::spawn(move || other.alloc(2 * UNIT).is_ok());
            let mine = run.alloc(UNIT).is_ok();
            let theirs = t.join().unwrap();
            assert!(mine ^ theirs);
            run.check_invariants().unwrap();
        });
    }

    /// An allocation racing a reset is stamped with the run it was carved
    /// from: either it came before the reset (old run, refused from then
    /// on as ended) or after it (new run, live, at the start of the
    /// region). A block allocated before the race is always refused.
    #[test]
    fn a_reset_ends_exactly_the_blocks_of_its_run() {
        loom::model(|| {
            let run = Arc::new(Bump::new(0, 2 * UNIT));
            let before = run.alloc(UNIT).unwrap();
            let other = Arc::clone(&run);
            let t = thread::spawn(move || other.alloc(UNIT).unwrap());
            let new_epoch = run.reset();
            let racing = t.join().unwrap();
            assert_eq!(new_epoch, 1);
            assert!(matches!(
                run.check(&before),
                Err(Error::RunEnded {
                    run: 0,
                    current: 1,
                    ..
                })
            ));
            if racing.epoch == new_epoch {
                assert_eq!(racing.offset, 0, "first block of the new run");
                run.check(&racing).unwrap();
                assert_eq!(run.stats().in_use, UNIT);
            } else {
                assert_eq!((racing.epoch, racing.offset), (0, UNIT));
                assert!(matches!(run.check(&racing), Err(Error::RunEnded { .. })));
                assert_eq!(run.stats().in_use, 0);
            }
            run.check_invariants().unwrap();
        });
    }
}
