//! Names that cross process boundaries: a task's id, a callable's handle
//! and the regions of a chip's memory with their counters. They are
//! defined here, not in the chip runtime or the orchestrator's cores, so
//! that every layer — the protocol (`strata-proto`, which depends on the
//! wire format alone), the cores, the worker, the driver — names them with
//! one type.

use std::fmt;

/// A task, numbered by the driver in submission order and echoed by the
/// worker in its completion (the DAG requires increasing ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {}", self.0)
    }
}

/// A callable's handle: the first 16 bytes of the SHA-256 of its canonical
/// descriptor.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelHandle(pub [u8; 16]);

impl fmt::Display for KernelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KernelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelHandle({self})")
    }
}

/// Which part of device memory a block comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Region {
    /// User device buffers, individually freed.
    Persistent,
    /// Bump-allocated, reset as a whole when a run ends.
    Run,
    /// Per-kernel temporaries and staged copies.
    Scratch,
    /// User device buffers each of its own allocation, which can leave
    /// the process as a file descriptor (another process maps the same
    /// memory); individually freed.
    Shared,
}

impl Region {
    /// Lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            Region::Persistent => "persistent",
            Region::Run => "run",
            Region::Scratch => "scratch",
            Region::Shared => "shared",
        }
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Counters of one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionStats {
    /// Bytes the region manages.
    pub capacity: u64,
    /// Bytes in live blocks (rounded up to 64 per block).
    pub in_use: u64,
    /// Highest `in_use` seen.
    pub peak: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Frees (for the run region: resets).
    pub frees: u64,
    /// Allocations refused for lack of space.
    pub failed: u64,
}
