//! The device-memory arena: bookkeeping of which device bytes are in use.
//!
//! Device memory is split into three regions, each with the allocator that
//! fits its lifetime:
//!
//! | region | holds | allocator |
//! |---|---|---|
//! | persistent | user device buffers, freed one by one | `Pool`: TLSF-style O(1) offset allocator, bounded fragmentation |
//! | run | allocations that live until the run ends | `Bump`: lock-free bump pointer, reset as a whole |
//! | scratch | per-kernel temporaries and staged copies | `Pool` again, freed when the kernel ends |
//!
//! Every block starts on a 64-byte boundary and spans a whole number of
//! 64-byte units. The arena only hands out offsets; the bytes live in the
//! device's memory mapping. Out of memory is an [`Error::OutOfMemory`]
//! naming the region, the bytes asked and the bytes free, never a panic.
//!
//! Invariants, checked by [`Arena::check_invariants`] in the property tests
//! and the loom models:
//! - ARENA-1: live blocks of a region never overlap and lie inside it;
//! - ARENA-2: every block offset is a multiple of 64;
//! - ARENA-3: a pool's bytes in use equal the sum of its live blocks, and its
//!   free space plus the space granted to live blocks equals its capacity;
//! - ARENA-4: a block is freed at most once (a second free is
//!   [`Error::UnknownBlock`]);
//! - ARENA-5: a run block is usable only during the run it was carved
//!   from: every block is stamped with its run number ([`Block::epoch`]),
//!   a reset starts the next run, and [`Arena::check_live`] refuses a block
//!   of an ended run with [`Error::RunEnded`] even when its bytes now lie
//!   inside blocks of a later run.
//!
//! Who decides when a run ends is the arena's user: the worker resets the
//! run region once no session holds a live run block and no running task
//! holds one (see `strata-worker`).

mod bump;
mod pool;

pub(crate) use bump::Bump;
pub(crate) use pool::Pool;

use crate::Error;

/// Block alignment and allocation unit, in bytes.
pub const UNIT: u64 = crate::spec::BLOCK_ALIGN;

pub use strata_wire::{Region, RegionStats};

/// A live allocation: `len` bytes at `offset` from the start of device
/// memory (64-byte aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Block {
    /// Region the block belongs to.
    pub region: Region,
    /// Byte offset from the start of device memory.
    pub offset: u64,
    /// Bytes asked for (the region reserves this rounded up to 64).
    pub len: u64,
    /// For a run block, the run it belongs to (the run region's reset
    /// count when it was carved, mod 2^32); 0 for other regions.
    pub epoch: u32,
}

/// Counters of all three regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// The persistent region.
    pub persistent: RegionStats,
    /// The run region.
    pub run: RegionStats,
    /// The scratch region.
    pub scratch: RegionStats,
}

/// The three regions over one device memory of
/// `persistent + run + scratch` bytes, laid out in that order.
#[derive(Debug)]
pub struct Arena {
    persistent: Pool,
    run: Bump,
    scratch: Pool,
}

impl Arena {
    /// An arena with regions of the given sizes (each a multiple of 64 and
    /// at most [`crate::spec::MAX_REGION_BYTES`]).
    ///
    /// # Errors
    /// [`Error::Spec`] when a size breaks those rules.
    pub fn new(persistent: u64, run: u64, scratch: u64) -> Result<Arena, Error> {
        for (name, bytes) in [
            ("persistent", persistent),
            ("run", run),
            ("scratch", scratch),
        ] {
            if bytes % UNIT != 0 || bytes > crate::spec::MAX_REGION_BYTES {
                return Err(Error::Spec {
                    spec: format!("{name}={bytes}"),
                    reason: format!(
                        "a region is a multiple of {UNIT} bytes, at most {}",
                        crate::spec::MAX_REGION_BYTES
                    ),
                });
            }
        }
        Ok(Arena {
            persistent: Pool::new(Region::Persistent, 0, persistent),
            run: Bump::new(persistent, run),
            scratch: Pool::new(Region::Scratch, persistent + run, scratch),
        })
    }

    /// Total bytes managed.
    pub fn capacity(&self) -> u64 {
        self.persistent.capacity() + self.run.capacity() + self.scratch.capacity()
    }

    /// Allocates `nbytes` (at least one 64-byte unit) in `region`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] or [`Error::TooManyBlocks`];
    /// [`Error::Spec`] for the shared region, which is not the arena's
    /// (each shared block is an allocation of its own).
    pub fn alloc(&self, region: Region, nbytes: u64) -> Result<Block, Error> {
        match region {
            Region::Persistent => self.persistent.alloc(nbytes),
            Region::Run => self.run.alloc(nbytes),
            Region::Scratch => self.scratch.alloc(nbytes),
            Region::Shared => Err(Error::Spec {
                spec: "arena".into(),
                reason: "shared blocks are allocations of their own, not arena blocks".into(),
            }),
        }
    }

    /// Frees the block at `offset` in `region` and returns its length.
    ///
    /// # Errors
    /// [`Error::UnknownBlock`] when no live block starts there, including a
    /// second free of the same block and any free in the run region (which
    /// is only ever reset as a whole).
    pub fn free(&self, region: Region, offset: u64) -> Result<u64, Error> {
        match region {
            Region::Persistent => self.persistent.free(offset),
            Region::Scratch => self.scratch.free(offset),
            Region::Run | Region::Shared => Err(Error::UnknownBlock {
                region,
                addr: offset,
            }),
        }
    }

    /// The live block of `region` that contains byte `offset`, if any.
    pub fn block_containing(&self, region: Region, offset: u64) -> Option<Block> {
        match region {
            Region::Persistent => self.persistent.block_containing(offset),
            Region::Scratch => self.scratch.block_containing(offset),
            Region::Run => self.run.block_containing(offset),
            Region::Shared => None,
        }
    }

    /// Releases every run-region block at once and starts the next run,
    /// whose number it returns; blocks of the ended run are refused from
    /// now on ([`Arena::check_live`]). The caller makes sure none is still
    /// in use: the arena cannot know which kernel holds which address.
    pub fn reset_run(&self) -> u32 {
        self.run.reset()
    }

    /// The current run number (0 until the first reset; wraps at 2^32).
    pub fn run_epoch(&self) -> u32 {
        self.run.epoch()
    }

    /// Whether `block` is still live: a persistent or scratch block that
    /// has not been freed, or a run block of the current run.
    ///
    /// # Errors
    /// [`Error::RunEnded`] for a run block whose run was reset;
    /// [`Error::UnknownBlock`] for a block that is not live.
    pub fn check_live(&self, block: &Block) -> Result<(), Error> {
        let unknown = || Error::UnknownBlock {
            region: block.region,
            addr: block.offset,
        };
        match block.region {
            Region::Run => self.run.check(block),
            region => {
                let live = self
                    .block_containing(region, block.offset)
                    .ok_or_else(unknown)?;
                if live.offset == block.offset && live.len == block.len {
                    Ok(())
                } else {
                    Err(unknown())
                }
            }
        }
    }

    /// Counters of every region.
    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            persistent: self.persistent.stats(),
            run: self.run.stats(),
            scratch: self.scratch.stats(),
        }
    }

    /// Checks ARENA-1..3 (module docs).
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.persistent.check_invariants()?;
        self.scratch.check_invariants()?;
        self.run.check_invariants()
    }
}

/// Rounds `nbytes` up to whole units (at least one); `None` on overflow.
pub(crate) fn units_for(nbytes: u64) -> Option<u64> {
    Some(nbytes.checked_add(UNIT - 1)? / UNIT).map(|u| u.max(1))
}
