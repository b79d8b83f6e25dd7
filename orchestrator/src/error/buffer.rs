//! Why a buffer or a view refused a call, and the quarantined bytes.

use std::fmt;
use std::io;
use std::ops::Range;

use strata_orchestrator_core::{ScopeError, TaskId, WorkerId};
use strata_wire::{Access, CanonicalIdentity, DType};

use crate::paths::WorkerPath;

/// Why a buffer could not be made, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BufferError {
    /// A buffer of zero bytes.
    #[error("a buffer needs at least one byte")]
    Empty,
    /// Making, sizing, sealing or mapping the memfd failed.
    #[error("{step} for a buffer of {nbytes} bytes: {source}")]
    Memfd {
        /// The step: `memfd_create`, `ftruncate`, `sealing the memfd`,
        /// `fstat`, `mmap`, `pread` (packing a view for a remote worker).
        step: &'static str,
        /// The buffer's size.
        nbytes: u64,
        /// Why.
        source: io::Error,
    },
    /// Opening, creating, sizing or mapping a POSIX shared-memory object
    /// failed, or it is smaller than the buffer asked of it.
    #[error("the POSIX shared-memory object '{name}' for a buffer of {nbytes} bytes: {why}")]
    Posix {
        /// The object's name.
        name: String,
        /// The buffer's size.
        nbytes: u64,
        /// What failed: the step and the system's error, or the object's
        /// size.
        why: String,
    },
    /// The cluster's buffer ids are used up.
    #[error("{0}")]
    Identity(#[source] strata_wire::Error),
    /// The wire refused the buffer's descriptor.
    #[error("{0}")]
    Descriptor(#[source] strata_wire::Error),
    /// Bytes past the end of the buffer.
    #[error("bytes {}..{} are past the buffer's {nbytes} bytes", .bytes.start, .bytes.end)]
    OutOfRange {
        /// The bytes asked for.
        bytes: Range<u64>,
        /// The buffer's size.
        nbytes: u64,
    },
    /// An offset or length beyond this machine's `usize`.
    #[error("offset or length does not fit this machine's address space")]
    AddressSpace,
    /// Packed bytes of the wrong length for a view.
    #[error("{got} bytes for a view of {want} bytes")]
    PackedLength {
        /// Bytes given.
        got: usize,
        /// The view's packed length.
        want: u64,
    },
    /// A host-buffer call on a device buffer.
    #[error(
        "buffer {buffer} lives on {worker}'s device ({path}): use Cluster::read_device / write_device"
    )]
    OnDevice {
        /// The buffer.
        buffer: CanonicalIdentity,
        /// Its worker.
        worker: WorkerId,
        /// That worker's path, as the buffer's descriptor names it.
        path: WorkerPath,
    },
    /// A device-buffer call on a host buffer.
    #[error("buffer {buffer} is a host buffer: read and write it directly")]
    OnHost {
        /// The buffer.
        buffer: CanonicalIdentity,
    },
    /// A shared device buffer's memory that could not be mapped or moved
    /// here (the descriptor refused, or the GPU's driver failed).
    #[error("shared buffer {buffer}: {source}")]
    Shared {
        /// The buffer.
        buffer: CanonicalIdentity,
        /// What the chip runtime said.
        #[source]
        source: Box<strata_chip_runtime::Error>,
    },
    /// A run buffer of a run that has ended.
    #[error(
        "run buffer {buffer} on {worker} ({path}) belonged to run {run}, which ended at wait_all (this is run {current}): its device memory went with the run (allocate a new run buffer)"
    )]
    RunEnded {
        /// The buffer.
        buffer: CanonicalIdentity,
        /// Its worker.
        worker: WorkerId,
        /// That worker's path, as the buffer's descriptor names it.
        path: WorkerPath,
        /// Its run.
        run: u64,
        /// The current run.
        current: u64,
    },
    /// A device buffer of a worker lost since it was allocated.
    #[error(
        "device buffer {buffer} was on {worker} ({path}), which was lost since it was allocated: its contents are gone (allocate it again)"
    )]
    WorkerLost {
        /// The buffer.
        buffer: CanonicalIdentity,
        /// Its worker.
        worker: WorkerId,
        /// That worker's path, as the buffer's descriptor names it.
        path: WorkerPath,
    },
    /// A buffer of a scope that has ended: its memory is reclaimed once
    /// the scope's tasks are done, and no handle may use it again.
    #[error(
        "buffer {buffer} belongs to scope {scope}, which has ended: its memory is reclaimed once the scope's tasks are done, so it may not be used again (allocate what must outlive the scope outside it: Cluster::alloc or Cluster::buffer)"
    )]
    ScopeEnded {
        /// The buffer.
        buffer: CanonicalIdentity,
        /// Its scope.
        scope: u64,
    },
    /// An allocation in a scope that has ended (or was never opened).
    #[error("cannot allocate: {0}")]
    AllocScope(#[source] ScopeError),
    /// A shape an allocation cannot have.
    #[error("shape {shape:?} of {}: {why}", .dtype.name())]
    Shape {
        /// The shape asked for.
        shape: Vec<u32>,
        /// The dtype asked for.
        dtype: DType,
        /// What is wrong with it.
        why: String,
    },
    /// A size that is not a whole number of values.
    #[error("{len} bytes are not a whole number of {size}-byte values")]
    NotWhole {
        /// The buffer's size.
        len: usize,
        /// The value's size.
        size: usize,
    },
}

/// Why a view could not be made, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// The wire refused it: out of bounds, a malformed field, a widened
    /// grant (the error names the field).
    #[error("{0}")]
    Wire(#[from] strata_wire::Error),
    /// Values of another dtype than the view's.
    #[error("the view holds {}, not {}", .holds.name(), .asked.name())]
    DType {
        /// The view's dtype.
        holds: DType,
        /// The values'.
        asked: DType,
    },
    /// As many values as the view has elements are needed.
    #[error("{values} values for a view of {elements} elements")]
    Count {
        /// Values given.
        values: usize,
        /// The view's elements.
        elements: u64,
    },
    /// A dtype of less than a byte per element.
    #[error("{} packs two values per byte; read the buffer's bytes instead", .0.name())]
    SubByte(DType),
    /// A driver write through a view (or a buffer handle taken from one)
    /// whose grant does not include WRITE: the grant binds the driver as
    /// it binds tasks.
    #[error(
        "buffer {buffer}: this view grants {granted}, which binds the driver too: it may not write through it (write through a view that grants WRITE)"
    )]
    ReadOnly {
        /// The buffer.
        buffer: CanonicalIdentity,
        /// The view's grant.
        granted: Access,
    },
}

/// Bytes the driver may not touch: a task that writes them was lost
/// without a fence and its worker may still write them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedBytes {
    /// The buffer.
    pub buffer: CanonicalIdentity,
    /// The quarantined bytes (the lost task's view's extent).
    pub bytes: Range<u64>,
    /// The lost task.
    pub task: TaskId,
    /// Its callable, `name@version`.
    pub callable: String,
    /// The worker it was lost on.
    pub worker: WorkerId,
    /// That worker's address, for messages.
    pub address: Option<String>,
}

impl fmt::Display for QuarantinedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bytes {}..{} of buffer {} are quarantined: {} ({}) was lost on {}",
            self.bytes.start, self.bytes.end, self.buffer, self.task, self.callable, self.worker
        )?;
        if let Some(a) = &self.address {
            write!(f, " ({a})")?;
        }
        f.write_str(
            " without a fence and its worker may still write them; they are refused until the \
             worker is fenced (seen dead, or back and proving the task ended)",
        )
    }
}

impl std::error::Error for QuarantinedBytes {}
