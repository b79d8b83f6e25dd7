//! A region of individually freed blocks over an O(1), TLSF-style offset
//! allocator (`offset-allocator`, whose metadata lives outside the memory it
//! manages, as device memory needs).

use std::collections::HashMap;

use offset_allocator::{Allocation, Allocator};

use super::{Block, Region, RegionStats, UNIT, units_for};
use crate::Error;
use crate::sync::{Mutex, lock};

/// Live blocks one pool tracks at most (the offset allocator's node budget).
const MAX_BLOCKS: u32 = 128 * 1024;

#[derive(Debug)]
pub(crate) struct Pool {
    region: Region,
    base: u64,
    capacity: u64,
    state: Mutex<State>,
}

struct State {
    allocator: Allocator,
    /// Live blocks the allocator's node budget allows.
    max_blocks: u32,
    /// Live blocks by their unit offset within the region.
    live: HashMap<u32, Live>,
    stats: RegionStats,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("live", &self.live.len())
            .field("stats", &self.stats)
            .finish()
    }
}

#[derive(Clone, Copy)]
struct Live {
    allocation: Allocation,
    len: u64,
}

impl Pool {
    /// A pool managing `capacity` bytes (a multiple of 64, at most 2^32 − 1
    /// units) starting `base` bytes into device memory.
    pub(crate) fn new(region: Region, base: u64, capacity: u64) -> Pool {
        let units = u32::try_from(capacity / UNIT).unwrap_or(u32::MAX);
        // Live blocks plus the free ranges between them need at most
        // 2·units + 1 nodes; small pools need not pay for the full budget.
        let nodes = units.saturating_mul(2).saturating_add(2).min(MAX_BLOCKS);
        Pool {
            region,
            base,
            capacity,
            state: Mutex::new(State {
                allocator: Allocator::with_max_allocs(units, nodes),
                max_blocks: nodes - 1,
                live: HashMap::new(),
                stats: RegionStats {
                    capacity,
                    ..RegionStats::default()
                },
            }),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn alloc(&self, nbytes: u64) -> Result<Block, Error> {
        let mut s = lock(&self.state);
        let oom = |s: &mut State| {
            s.stats.failed += 1;
            let report = s.allocator.storage_report();
            Error::OutOfMemory {
                region: self.region,
                asked: nbytes,
                free: u64::from(report.total_free_space) * UNIT,
                largest: u64::from(report.largest_free_region) * UNIT,
            }
        };
        let Some(units) = units_for(nbytes).and_then(|u| u32::try_from(u).ok()) else {
            return Err(oom(&mut s));
        };
        if s.live.len() >= s.max_blocks as usize {
            s.stats.failed += 1;
            return Err(Error::TooManyBlocks {
                region: self.region,
                max: u64::from(s.max_blocks),
            });
        }
        let Some(allocation) = s.allocator.allocate(units) else {
            // Enough contiguous space but no free node: the block budget,
            // not the memory, ran out.
            if s.allocator.storage_report().largest_free_region >= units {
                s.stats.failed += 1;
                return Err(Error::TooManyBlocks {
                    region: self.region,
                    max: u64::from(s.max_blocks),
                });
            }
            return Err(oom(&mut s));
        };
        let bytes = u64::from(units) * UNIT;
        s.live.insert(
            allocation.offset,
            Live {
                allocation,
                len: nbytes,
            },
        );
        s.stats.allocs += 1;
        s.stats.in_use += bytes;
        s.stats.peak = s.stats.peak.max(s.stats.in_use);
        Ok(Block {
            region: self.region,
            offset: self.base + u64::from(allocation.offset) * UNIT,
            len: nbytes,
            epoch: 0,
        })
    }

    pub(crate) fn free(&self, offset: u64) -> Result<u64, Error> {
        let unknown = Error::UnknownBlock {
            region: self.region,
            addr: offset,
        };
        let rel = offset
            .checked_sub(self.base)
            .filter(|r| r % UNIT == 0)
            .ok_or(unknown.clone())?;
        let key = u32::try_from(rel / UNIT).map_err(|_| unknown.clone())?;
        let mut s = lock(&self.state);
        // Removing from `live` first is what makes a second free of the same
        // block an error instead of a double free inside the allocator.
        let live = s.live.remove(&key).ok_or(unknown)?;
        s.allocator.free(live.allocation);
        s.stats.frees += 1;
        s.stats.in_use -= units_for(live.len).unwrap_or(1) * UNIT;
        Ok(live.len)
    }

    pub(crate) fn block_containing(&self, offset: u64) -> Option<Block> {
        let rel = offset.checked_sub(self.base)?;
        if rel >= self.capacity {
            return None;
        }
        let s = lock(&self.state);
        let block = |unit: u32, live: &Live| Block {
            region: self.region,
            offset: self.base + u64::from(unit) * UNIT,
            len: live.len,
            epoch: 0,
        };
        // Copies nearly always start at a block's first byte: O(1).
        let exact = (rel % UNIT == 0)
            .then(|| u32::try_from(rel / UNIT).ok())
            .flatten()
            .and_then(|u| s.live.get(&u).map(|l| block(u, l)));
        if exact.is_some() {
            return exact;
        }
        // An interior address: scan (the live map is keyed for O(1) alloc
        // and free, not for range queries).
        s.live.iter().find_map(|(&unit, live)| {
            let start = u64::from(unit) * UNIT;
            (rel >= start && rel < start + live.len.max(1)).then(|| block(unit, live))
        })
    }

    pub(crate) fn stats(&self) -> RegionStats {
        lock(&self.state).stats
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let s = lock(&self.state);
        let mut blocks: Vec<(u64, u64, u64)> = s
            .live
            .iter()
            .map(|(&unit, live)| {
                let granted = u64::from(s.allocator.allocation_size(live.allocation)) * UNIT;
                (
                    u64::from(unit) * UNIT,
                    units_for(live.len).unwrap_or(1) * UNIT,
                    granted,
                )
            })
            .collect();
        blocks.sort_unstable();
        let mut end = 0;
        for &(start, reserved, granted) in &blocks {
            if start < end {
                return Err(format!(
                    "{}: block at {start} overlaps the previous one ending at {end}",
                    self.region
                ));
            }
            if start % UNIT != 0 {
                return Err(format!(
                    "{}: block at {start} is not 64-byte aligned",
                    self.region
                ));
            }
            if granted < reserved {
                return Err(format!(
                    "{}: block at {start} granted {granted} < {reserved} bytes",
                    self.region
                ));
            }
            end = start + granted;
        }
        if end > self.capacity {
            return Err(format!(
                "{}: a block ends at {end}, past the capacity {}",
                self.region, self.capacity
            ));
        }
        let in_use: u64 = blocks.iter().map(|b| b.1).sum();
        if in_use != s.stats.in_use {
            return Err(format!(
                "{}: stats say {} bytes in use, blocks hold {in_use}",
                self.region, s.stats.in_use
            ));
        }
        let granted: u64 = blocks.iter().map(|b| b.2).sum();
        let free = u64::from(s.allocator.storage_report().total_free_space) * UNIT;
        let managed = self.capacity / UNIT * UNIT;
        if free + granted != managed {
            return Err(format!(
                "{}: free {free} + granted {granted} != capacity {managed}",
                self.region
            ));
        }
        if s.stats.allocs - s.stats.frees != blocks.len() as u64 {
            return Err(format!("{}: allocs - frees != live blocks", self.region));
        }
        Ok(())
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::{Arc, Mutex, lock, thread};

    /// Two threads allocate and free concurrently in a 4-unit pool: the
    /// blocks they hold at the same time never overlap, and afterwards the
    /// pool is empty and consistent.
    #[test]
    fn concurrent_alloc_free_never_overlap() {
        loom::model(|| {
            let pool = Arc::new(Pool::new(Region::Persistent, 0, 4 * UNIT));
            let held = Arc::new(Mutex::new([false; 4]));
            let worker = |units: u64| {
                let pool = Arc::clone(&pool);
                let held = Arc::clone(&held);
                thread::spawn(move || {
                    let Ok(b) = pool.alloc(units * UNIT) else {
                        return;
                    };
                    let first = (b.offset / UNIT) as usize;
                    {
                        let mut h = lock(&held);
                        for u in first..first + units as usize {
                            assert!(!h[u], "unit {u} handed out twice");
                            h[u] = true;
                        }
                    }
                    {
                        let mut h = lock(&held);
                        for u in first..first + units as usize {
                            h[u] = false;
                        }
                    }
                    pool.free(b.offset).unwrap();
                })
            };
            let a = worker(1);
            let b = worker(2);
            a.join().unwrap();
            b.join().unwrap();
            pool.check_invariants().unwrap();
            assert_eq!(pool.stats().in_use, 0);
        });
    }

    /// Two threads free the same block: exactly one succeeds, the other is
    /// told the block is unknown; the allocator never sees a double free.
    #[test]
    fn a_block_is_freed_once() {
        loom::model(|| {
            let pool = Arc::new(Pool::new(Region::Scratch, 0, 2 * UNIT));
            let b = pool.alloc(UNIT).unwrap();
            let other = Arc::clone(&pool);
            let t = thread::spawn(move || other.free(b.offset).is_ok());
            let mine = pool.free(b.offset).is_ok();
            let theirs = t.join().unwrap();
            assert!(mine ^ theirs, "exactly one free succeeds");
            pool.check_invariants().unwrap();
        });
    }
}
