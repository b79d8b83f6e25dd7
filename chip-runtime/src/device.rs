//! The device interface the worker programs against.
//!
//! A [`Device`] allocates and frees device memory, copies between host and
//! device, launches kernels on materialized arguments, synchronizes and
//! reports statistics. Callers hold a `dyn Device`, so a second kind of
//! device (a CUDA GPU, say) is a new implementation, not a change to them.

use std::sync::Arc;
use std::time::Duration;

use strata_wire::{ArgTag, CanonicalIdentity, Footprint, Tensor};

use crate::Error;
use crate::arena::{ArenaStats, Region};
use crate::cache::{CacheStats, CacheUse, CopyKey};
use crate::kernel::Kernel;
use crate::memory::HostMemory;
use crate::spec::Mode;
use crate::sync::{Condvar, Mutex, lock, wait};

/// A device address (not a host pointer).
pub type DeviceAddr = u64;

/// What a device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device kind, such as `sim`.
    pub kind: String,
    /// The canonical spec string it was built from.
    pub spec: String,
    /// Total device memory in bytes.
    pub memory: u64,
    /// Kernels that may run at once.
    pub lanes: usize,
    /// How host-backed arguments reach kernels.
    pub mode: Mode,
    /// The dtypes its kernels compute on: a launch with an argument of
    /// another is refused ([`crate::Error::UnsupportedDType`]).
    pub dtypes: strata_boundary::DTypeSet,
    /// Whether it keeps device copies of host bytes between tasks (the
    /// device cache; a chip that reads host memory in place has none).
    pub caches: bool,
}

/// An allocation of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceBlock {
    /// Device address of the first byte (64-byte aligned).
    pub addr: DeviceAddr,
    /// Bytes asked for.
    pub len: u64,
    /// The region it came from.
    pub region: Region,
    /// For a run block, the run it belongs to (see
    /// [`crate::arena::Block::epoch`]); 0 otherwise.
    pub epoch: u32,
}

/// Where a kernel argument's bytes are on this worker.
#[derive(Debug, Clone)]
pub enum ArgBacking {
    /// A host mapping of the whole buffer (the tensor's `byte_offset` is
    /// from its start).
    Host(Arc<dyn HostMemory>),
    /// A device block found by the buffer's identity (the tensor's
    /// `byte_offset` is from the block's start).
    Device(DeviceBlock),
}

/// One tensor argument of a launch.
#[derive(Debug, Clone)]
pub struct LaunchArg {
    /// The validated view.
    pub tensor: Tensor,
    /// The task's tag for it.
    pub tag: ArgTag,
    /// Where its bytes are.
    pub backing: ArgBacking,
    /// For a host-backed argument of a staged device: keep its copy on the
    /// chip between tasks, at the version this says ([`crate::cache`]).
    /// `None`: staged in before the task and out after it, then forgotten.
    pub cache: Option<CacheUse>,
}

/// A kernel launch.
#[derive(Clone)]
pub struct Launch {
    /// The callable.
    pub kernel: Arc<dyn Kernel>,
    /// Tensor arguments, in signature order.
    pub args: Vec<LaunchArg>,
    /// Scalar arguments.
    pub scalars: Vec<u64>,
    /// Checked at the moment the launch would start on a lane: once
    /// closed, a launch still queued completes with
    /// [`Error::NotStarted`] instead of running. `None`: always starts.
    pub gate: Option<StartGate>,
    /// How urgent it is: the task's upward rank (its longest modelled path
    /// to the end of the graph, ns), 0 for none. A chip that can favour
    /// some work over other favours the higher (a CUDA chip runs the most
    /// urgent launch in flight on a high-priority stream); others ignore
    /// it.
    pub priority: u64,
}

/// A switch that stops queued launches from starting.
///
/// A worker gives every launch of one session the session's gate and
/// closes it when the session ends. A launch already queued on a lane
/// (say, behind a long kernel, or in a process that was stopped and is
/// woken) then never starts, so a client that has ended its session can
/// be told exactly which of its tasks may still touch memory: those
/// already running, none later. Checking when the launch is accepted is
/// not enough: a lane may pick it up long after.
///
/// Cloning shares the switch. Closing is one-way; the first reason given
/// is kept.
#[derive(Debug, Clone)]
pub struct StartGate {
    reason: Arc<Mutex<Option<String>>>,
}

impl Default for StartGate {
    fn default() -> Self {
        StartGate::new()
    }
}

impl StartGate {
    /// An open gate.
    pub fn new() -> Self {
        StartGate {
            reason: Arc::new(Mutex::new(None)),
        }
    }

    /// Closes the gate: launches not yet started fail with `reason`. A gate
    /// already closed keeps its first reason.
    pub fn close(&self, reason: impl Into<String>) {
        let mut r = lock(&self.reason);
        if r.is_none() {
            *r = Some(reason.into());
        }
    }

    /// Whether the gate is closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.reason).is_some()
    }

    /// Whether a launch may start now.
    ///
    /// # Errors
    /// [`Error::NotStarted`] with the closing reason, once closed.
    pub fn check(&self) -> Result<(), Error> {
        match &*lock(&self.reason) {
            None => Ok(()),
            Some(reason) => Err(Error::NotStarted {
                reason: reason.clone(),
            }),
        }
    }
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("kernel", &self.kernel.descriptor().qualified_name())
            .field("args", &self.args)
            .field("scalars", &self.scalars)
            .field("gate", &self.gate)
            .finish()
    }
}

/// What happened to a launch that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaunchReport {
    /// The lane it ran on.
    pub lane: usize,
    /// Waiting for a lane.
    pub queued: Duration,
    /// Staging in, running, staging out.
    pub busy: Duration,
    /// The kernel alone.
    pub kernel: Duration,
    /// Bytes copied host → device for it.
    pub staged_in: u64,
    /// Bytes copied device → host for it.
    pub staged_out: u64,
    /// From its start on the lane to the kernel's: cache lookups, copies
    /// in (and waiting for a prefetch under way).
    pub copy_in: Duration,
    /// The rest of `busy` after the kernel: copies out, cache bookkeeping.
    pub copy_out: Duration,
    /// What it did in the device cache: the counters alone (hits, misses,
    /// bytes loaded and written back, on-chip copies, evictions its
    /// staging caused); the gauges stay zero.
    pub cache: CacheStats,
}

/// Called exactly once with the outcome of a launch that was accepted.
pub type Completion = Box<dyn FnOnce(Result<LaunchReport, Error>) + Send>;

/// Device counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceStats {
    /// Memory per region.
    pub arena: ArenaStats,
    /// Bytes staged host → device for kernel arguments.
    pub staged_to_device: u64,
    /// Bytes staged device → host for kernel arguments.
    pub staged_to_host: u64,
    /// Bytes moved by explicit `copy_to_device` calls.
    pub copied_to_device: u64,
    /// Bytes moved by explicit `copy_from_device` calls.
    pub copied_to_host: u64,
    /// Launches accepted.
    pub launched: u64,
    /// Launches that ran to success.
    pub succeeded: u64,
    /// Launches whose kernel returned an error (or whose staging failed, or
    /// that a closed start gate kept from starting).
    pub failed: u64,
    /// Launches whose kernel panicked.
    pub panicked: u64,
    /// Device bytes zeroed before anyone could see them: new blocks, a
    /// kernel's scratch, and the parts of a staged argument's scratch that
    /// no copy-in overwrites.
    pub zeroed: u64,
    /// Bytes staged through page-locked staging buffers because their
    /// host memory could not be page-locked in place for DMA (a CUDA chip;
    /// 0 on a simulated one).
    pub bounced: u64,
    /// Bytes of live shared blocks ([`Region::Shared`]: allocations of
    /// their own, outside the arena's regions).
    pub shared: u64,
    /// Total time lanes spent on launches.
    pub busy: Duration,
    /// The device cache ([`crate::cache`]).
    pub cache: CacheStats,
}

/// One copy the device cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedCopy {
    /// Whose copy of which bytes.
    pub key: CopyKey,
    /// The version of the bytes.
    pub version: u64,
    /// Not yet written back to host memory.
    pub dirty: bool,
    /// In use by a running task.
    pub pinned: bool,
}

/// A chip.
pub trait Device: Send + Sync + std::fmt::Debug {
    /// What it is.
    fn info(&self) -> DeviceInfo;

    /// Allocates `nbytes` in the persistent, the run or the shared region,
    /// zeroed: a block never shows bytes of the block's earlier owner (a
    /// freed buffer, an ended run), whoever reads it. A shared block is an
    /// allocation of its own that [`Device::export`] hands out.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming the region; [`Error::Spec`] for the
    /// scratch region, which only kernels allocate from; [`Error::Shared`]
    /// (or the driver's error) for a shared block the chip cannot make.
    fn alloc(&self, region: Region, nbytes: u64) -> Result<DeviceBlock, Error>;

    /// Frees a persistent or shared block by its address (a shared block's
    /// memory stays while another process maps it).
    ///
    /// # Errors
    /// [`Error::UnknownBlock`] when no live persistent or shared block
    /// starts there (including a second free).
    fn free(&self, addr: DeviceAddr) -> Result<(), Error>;

    /// Ends the current run: releases every run block at once (the run
    /// region's cursor returns to 0) and refuses them from then on, in
    /// copies and launches alike, with [`Error::RunEnded`].
    ///
    /// It does not wait for kernels: the caller makes sure that no accepted
    /// launch still uses a run block of this run (the worker counts the
    /// leases running tasks hold). Waiting here instead would deadlock a
    /// caller that ends the run from a kernel's completion, which is where
    /// the last lease on a run block is let go.
    ///
    /// # Errors
    /// When the device is shut down.
    fn end_run(&self) -> Result<(), Error>;

    /// Whether `block` is live: a persistent or shared block not freed (and
    /// no longer than allocated), or a run block of the current run.
    ///
    /// # Errors
    /// [`Error::RunEnded`] for a run block of an ended run,
    /// [`Error::UnknownBlock`] for a freed or unknown block.
    fn check_block(&self, block: &DeviceBlock) -> Result<(), Error>;

    /// A new file descriptor for the shared block `block`
    /// ([`Region::Shared`]), which another process maps
    /// ([`crate::shared`]); each call gives its own descriptor.
    ///
    /// # Errors
    /// [`Error::Shared`] for a block of another region or a chip that
    /// cannot share memory; [`Error::UnknownBlock`] for a block that is
    /// not live.
    fn export(&self, block: &DeviceBlock) -> Result<crate::shared::SharedMemory, Error> {
        Err(Error::Shared {
            reason: format!("this chip cannot export the block at {:#x}", block.addr),
        })
    }

    /// Maps shared memory that another chip of this host exported
    /// ([`Device::export`], perhaps in another process) so that kernels
    /// here use it in place, as a shared block of this chip: host memory
    /// on a simulated chip, memory of the same GPU on a CUDA one. Not
    /// zeroed: the bytes are the exporter's. [`Device::free`] unmaps it;
    /// the memory stays while its other holders keep it.
    ///
    /// # Errors
    /// [`Error::Shared`] for memory this chip cannot map (another place, a
    /// descriptor that does not check out, a chip that cannot share), or
    /// the GPU driver's refusal.
    fn import(&self, memory: crate::shared::SharedMemory) -> Result<DeviceBlock, Error> {
        Err(Error::Shared {
            reason: format!(
                "this chip cannot map shared memory ({} of {} bytes)",
                memory.place, memory.len
            ),
        })
    }

    /// Copies `src` into `block` at byte `offset`.
    ///
    /// # Errors
    /// As [`Device::check_block`]; [`Error::OutOfRange`] when the range is
    /// not inside the block.
    fn copy_to_device(&self, block: &DeviceBlock, offset: u64, src: &[u8]) -> Result<(), Error>;

    /// Copies `dst.len()` bytes of `block` from byte `offset` into `dst`.
    ///
    /// # Errors
    /// As [`Device::copy_to_device`].
    fn copy_from_device(
        &self,
        block: &DeviceBlock,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Error>;

    /// Checks a launch and queues it; `done` is called exactly once, on a
    /// device thread, with the outcome.
    ///
    /// # Errors
    /// Before anything runs (and without calling `done`): arguments that do
    /// not fit the kernel's signature, their backing or each other
    /// ([`Error::Argument`], [`Error::Scalars`]), or a shut-down device.
    fn launch(&self, launch: Launch, done: Completion) -> Result<(), Error>;

    /// As [`Device::launch`], from a thread that only feeds the device and
    /// may lend itself: a device may run the launch on this thread, before
    /// returning, when it would start at once anyway (it saves the wake-up
    /// of a device thread, which across cores costs more than a small
    /// kernel). `done` may then be called on this thread. The default
    /// queues it, as `launch` does.
    ///
    /// # Errors
    /// As [`Device::launch`].
    fn launch_here(&self, launch: Launch, done: Completion) -> Result<(), Error> {
        self.launch(launch, done)
    }

    /// Whether this chip can run `kernel`: it has a body for this kind of
    /// chip (every kernel runs on a CPU chip; a CUDA chip runs those with
    /// a [`crate::kernel::cuda::CudaBody`]). A worker offers only the
    /// kernels its chip runs.
    fn runs(&self, kernel: &dyn Kernel) -> bool {
        let _ = kernel;
        true
    }

    /// Why the chip can no longer run anything, once that is so (a GPU
    /// whose context a fault lost): every launch fails from then on, and
    /// its worker should exit so that it can be replaced. `None` for a
    /// chip that works.
    fn lost(&self) -> Option<String> {
        None
    }

    /// Waits until every accepted launch has completed.
    fn synchronize(&self);

    /// Current counters.
    fn stats(&self) -> DeviceStats;

    /// Writes back every dirty cached copy of `owner` whose bytes `pick`
    /// accepts; they stay cached, clean. Returns the bytes written. A
    /// device without a cache has nothing to write.
    fn flush(&self, owner: u64, pick: &dyn Fn(&Footprint) -> bool) -> u64 {
        let _ = (owner, pick);
        0
    }

    /// Forgets every cached copy of `owner` (of one buffer, with
    /// `identity`), dirty ones included, without writing them back;
    /// returns how many.
    fn drop_copies(&self, owner: u64, identity: Option<&CanonicalIdentity>) -> usize {
        let _ = (owner, identity);
        0
    }

    /// The copies the device cache holds, by owner and first byte.
    fn cached(&self) -> Vec<CachedCopy> {
        Vec::new()
    }
}

/// Waits for one launch's outcome.
#[derive(Debug)]
pub struct LaunchHandle {
    slot: std::sync::Arc<Slot<Result<LaunchReport, Error>>>,
}

impl LaunchHandle {
    /// Blocks until the launch completes and returns its outcome.
    ///
    /// # Errors
    /// The launch's failure.
    pub fn wait(self) -> Result<LaunchReport, Error> {
        self.slot.wait().unwrap_or(Err(Error::ShutDown))
    }
}

/// Launches on `device` and returns a handle to wait on.
///
/// # Errors
/// As [`Device::launch`].
pub fn launch(device: &dyn Device, launch: Launch) -> Result<LaunchHandle, Error> {
    let slot = std::sync::Arc::new(Slot::new());
    let filler = std::sync::Arc::clone(&slot);
    device.launch(
        launch,
        Box::new(move |outcome| {
            filler.complete(outcome);
        }),
    )?;
    Ok(LaunchHandle { slot })
}

/// A one-shot completion slot: filled once, taken once.
#[derive(Debug)]
pub(crate) struct Slot<T> {
    state: Mutex<SlotState<T>>,
    ready: Condvar,
}

#[derive(Debug)]
enum SlotState<T> {
    Empty,
    Full(T),
    Taken,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Self {
        Slot {
            state: Mutex::new(SlotState::Empty),
            ready: Condvar::new(),
        }
    }

    /// Fills the slot; `false` (and the value dropped) if it was already
    /// filled, which would be a duplicated completion.
    pub(crate) fn complete(&self, value: T) -> bool {
        let mut s = lock(&self.state);
        if !matches!(*s, SlotState::Empty) {
            return false;
        }
        *s = SlotState::Full(value);
        self.ready.notify_all();
        true
    }

    /// Waits for the value; `None` if it was already taken.
    pub(crate) fn wait(&self) -> Option<T> {
        let mut s = lock(&self.state);
        loop {
            match std::mem::replace(&mut *s, SlotState::Taken) {
                SlotState::Full(v) => return Some(v),
                SlotState::Taken => return None,
                SlotState::Empty => {
                    *s = SlotState::Empty;
                    s = wait(&self.ready, s);
                }
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::{Arc, thread};

    /// A completion racing its waiter is delivered once; a duplicate is
    /// refused.
    #[test]
    fn slot_delivers_exactly_once() {
        loom::model(|| {
            let slot = Arc::new(Slot::new());
            let s = Arc::clone(&slot);
            let t = thread::spawn(move || (s.complete(7), s.complete(8)));
            assert_eq!(slot.wait(), Some(7));
            assert_eq!(t.join().unwrap(), (true, false));
            assert_eq!(slot.wait(), None);
        });
    }

    /// A check racing a close sees the gate open or closed with the one
    /// reason, never a closed gate without it; after the close is joined
    /// every check refuses.
    #[test]
    fn a_start_gate_closes_once() {
        loom::model(|| {
            let gate = StartGate::new();
            let g = gate.clone();
            let t = thread::spawn(move || g.close("ended"));
            let seen = gate.check();
            assert!(
                seen.is_ok()
                    || seen
                        == Err(Error::NotStarted {
                            reason: "ended".into()
                        }),
                "{seen:?}"
            );
            t.join().unwrap();
            gate.close("later");
            assert_eq!(
                gate.check(),
                Err(Error::NotStarted {
                    reason: "ended".into()
                })
            );
        });
    }
}
