//! The run region: a lock-free bump allocator, reset as a whole.

use super::{Block, Region, RegionStats, UNIT, units_for};
use crate::Error;
use crate::sync::{AtomicU64, Ordering};

#[derive(Debug)]
pub(crate) struct Bump {
    base: u64,
    capacity: u64,
    /// Bytes handed out since the last reset; always a multiple of 64.
    cursor: AtomicU64,
    peak: AtomicU64,
    allocs: AtomicU64,
    resets: AtomicU64,
    failed: AtomicU64,
}

impl Bump {
    pub(crate) fn new(base: u64, capacity: u64) -> Bump {
        Bump {
            base,
            capacity,
            cursor: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            allocs: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn alloc(&self, nbytes: u64) -> Result<Block, Error> {
        let bytes = units_for(nbytes).and_then(|u| u.checked_mul(UNIT));
        // Claim [start, start + bytes) with a CAS so that two threads never
        // get overlapping ranges and the cursor never passes the capacity.
        // Relaxed suffices: the cursor publishes no other memory; the bytes
        // are handed to the caller, who orders their use.
        let claim = self
            .cursor
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |start| {
                let end = start.checked_add(bytes?)?;
                (end <= self.capacity).then_some(end)
            });
        match (claim, bytes) {
            (Ok(start), Some(bytes)) => {
                self.allocs.fetch_add(1, Ordering::Relaxed);
                self.peak.fetch_max(start + bytes, Ordering::Relaxed);
                Ok(Block {
                    region: Region::Run,
                    offset: self.base + start,
                    len: nbytes,
                })
            }
            (Err(used), _) | (Ok(used), None) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                let free = self.capacity - used;
                Err(Error::OutOfMemory {
                    region: Region::Run,
                    asked: nbytes,
                    free,
                    largest: free,
                })
            }
        }
    }

    /// The run block containing `offset`: the region hands out no per-block
    /// records, so the answer is the used part of the region.
    pub(crate) fn block_containing(&self, offset: u64) -> Option<Block> {
        let used = self.cursor.load(Ordering::Relaxed);
        let rel = offset.checked_sub(self.base)?;
        (rel < used).then_some(Block {
            region: Region::Run,
            offset: self.base,
            len: used,
        })
    }

    pub(crate) fn reset(&self) {
        self.cursor.store(0, Ordering::Relaxed);
        self.resets.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> RegionStats {
        RegionStats {
            capacity: self.capacity,
            in_use: self.cursor.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            allocs: self.allocs.load(Ordering::Relaxed),
            frees: self.resets.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let used = self.cursor.load(Ordering::Relaxed);
        if used % UNIT != 0 || used > self.capacity {
            return Err(format!(
                "run: cursor {used} is unaligned or past the capacity {}",
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
}
