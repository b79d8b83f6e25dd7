//! What a kind of chip supplies to the machinery of [`super::Chip`]: its
//! memory and how kernels run on it.
//!
//! The chip machinery — argument checks, the arena's regions, the device
//! cache, staging in and out, lanes, prefetch, start gates, counters — is
//! the same for every kind of chip. An [`Engine`] is the rest: moving
//! bytes into, out of and within device memory, zeroing it, and running a
//! kernel on materialized arguments. The simulated chip's engine does all
//! of it at once on the calling thread; a GPU's queues it on the lane's
//! stream and [`Engine::finish`] waits for it.
//!
//! Lanes: `0..lanes` are the launch lanes, `lanes` the copy lane of
//! prefetches. `None` is a synchronous operation on any thread (explicit
//! copies, zeroing a block `alloc` hands out, a write-back the cache does
//! while making room).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use strata_wire::{Access, ChipTensor, Region, Tensor};

use crate::Error;
use crate::device::DeviceAddr;
use crate::kernel::Kernel;
use crate::memory::HostMemory;
use crate::staging::Layout;

/// The host address of `view`'s first byte in `host` (the whole buffer's
/// mapping).
///
/// # Errors
/// [`Error::OutOfRange`] when the view reaches past the mapping.
pub(crate) fn host_at(host: &dyn HostMemory, view: &Tensor) -> Result<*mut u8, Error> {
    if view.end_byte() > host.len() as u64 {
        return Err(Error::OutOfRange {
            addr: view.byte_offset(),
            len: view.extent_bytes(),
            what: "the host mapping",
        });
    }
    // SAFETY: byte_offset ≤ end_byte ≤ the mapping's length (above).
    Ok(unsafe { host.as_ptr().add(view.byte_offset() as usize) })
}

/// A lane, or `None` for a synchronous operation on the calling thread.
pub(crate) type Lane = Option<usize>;

/// One argument of a kernel as the engine runs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    /// The materialized tensor.
    pub(crate) chip: ChipTensor,
    /// What the kernel may do with it.
    pub(crate) access: Access,
    /// Address of element 0: a device address, or for a tensor in host
    /// space (a unified chip reading host memory in place) a host pointer.
    pub(crate) base: u64,
    /// Bytes from `base` the kernel may touch.
    pub(crate) len: u64,
}

/// Scratch device memory for a kernel: its address and what frees it.
pub(crate) type ScratchBlock<'a> = (DeviceAddr, Box<dyn FnOnce() + 'a>);

/// Allocates scratch device memory for a running kernel (zeroed).
pub(crate) type ScratchFn<'a> = &'a (dyn Fn(u64) -> Result<ScratchBlock<'a>, Error> + Sync);

/// What a launch keeps alive until its lane has finished: the scratch a
/// queued kernel still uses.
pub(crate) type Held<'a> = Vec<Box<dyn FnOnce() + 'a>>;

/// A kind of chip's memory and execution.
pub(crate) trait Engine: Send + Sync + std::fmt::Debug {
    /// `sim`, `cuda`.
    fn kind(&self) -> &'static str;

    /// Device address of byte 0 of the chip's memory (the arena's offset
    /// 0).
    fn base(&self) -> DeviceAddr;

    /// Whether the chip runs `kernel` (has a body for it).
    fn runs(&self, kernel: &dyn Kernel) -> bool;

    /// Zeroes `len` bytes at `addr`; `release` says the range is large and
    /// may be given back to the system rather than written.
    fn zero(&self, lane: Lane, addr: DeviceAddr, len: u64, release: bool) -> Result<(), Error>;

    /// Copies `src` to `addr`, synchronously.
    fn write(&self, addr: DeviceAddr, src: &[u8]) -> Result<(), Error>;

    /// Copies `dst.len()` bytes at `addr` into `dst`, synchronously.
    fn read(&self, addr: DeviceAddr, dst: &mut [u8]) -> Result<(), Error>;

    /// Copies `view`'s bytes from `host` (the whole buffer's mapping; the
    /// view's extent was checked against it) into its copy at `dev`, laid
    /// out as `layout` says; returns the bytes moved.
    fn copy_in(
        &self,
        lane: Lane,
        layout: Layout,
        view: &Tensor,
        host: &Arc<dyn HostMemory>,
        dev: DeviceAddr,
    ) -> Result<u64, Error>;

    /// The reverse of [`Engine::copy_in`]: the copy at `dev` back into the
    /// view's bytes of `host` (writable), view bytes only.
    fn copy_out(
        &self,
        lane: Lane,
        layout: Layout,
        view: &Tensor,
        dev: DeviceAddr,
        host: &Arc<dyn HostMemory>,
    ) -> Result<u64, Error>;

    /// Copies one copy of `view` into another on the chip.
    fn copy_on_chip(
        &self,
        lane: Lane,
        layout: Layout,
        view: &Tensor,
        src: DeviceAddr,
        dst: DeviceAddr,
    ) -> Result<u64, Error>;

    /// Runs (or queues on `lane`) `kernel` on `args`. A kernel's own
    /// failure is [`Error::KernelFailed`], a panic [`Error::KernelPanicked`].
    /// What it returns is kept until [`Engine::finish`] on the lane.
    fn run<'a>(
        &self,
        lane: usize,
        kernel: &dyn Kernel,
        args: &[Placed],
        scalars: &[u64],
        scratch: ScratchFn<'a>,
    ) -> Result<Held<'a>, Error>;

    /// A launch of this `priority` ([`crate::Launch::priority`]) starts on
    /// `lane`: what it queues until [`Engine::end`] may go where urgent
    /// work goes. Nothing for an engine that cannot favour some work.
    fn begin(&self, lane: usize, priority: u64) {
        let _ = (lane, priority);
    }

    /// The launch on `lane` has ended (its lane finished).
    fn end(&self, lane: usize) {
        let _ = lane;
    }

    /// Waits until everything queued on `lane` is done; the first failure
    /// among it. A no-op for an engine that does everything at once.
    fn finish(&self, lane: Lane) -> Result<(), Error>;

    /// Marks `point` of the launch on `lane` in the lane's queue, to time
    /// what the device did between marks ([`Engine::stamped`]). Nothing for
    /// an engine that does its work inside each call (the caller's clock
    /// times it).
    fn stamp(&self, lane: usize, point: Stamp) {
        let _ = (lane, point);
    }

    /// After [`Engine::finish`] on `lane`: how long the device took from
    /// [`Stamp::Staging`] to [`Stamp::Kernel`] (the copies in; zero when
    /// the launch marked no `Staging`, having nothing to copy in) and from
    /// there to [`Stamp::Done`] (the kernel), when the launch (since
    /// [`Engine::begin`]) marked them. `None` where calls do their own
    /// work.
    fn stamped(&self, lane: usize) -> Option<(Duration, Duration)> {
        let _ = lane;
        None
    }

    /// Why the chip can run nothing more, once so ([`crate::Device::lost`]).
    fn lost(&self) -> Option<String> {
        None
    }

    /// A buffer's copies were dropped (it is being released): host memory
    /// the engine keeps prepared (page-locked) and no one else holds may
    /// go.
    fn released(&self) {}

    /// Allocates `len` bytes of device memory of their own (not the
    /// arena's), which [`Engine::export`] can hand to another process: its
    /// address and the bytes allocated (`len` rounded up to the engine's
    /// granularity). Not zeroed.
    fn alloc_shared(&self, len: u64) -> Result<(DeviceAddr, u64), Error> {
        let _ = len;
        Err(Error::Shared {
            reason: format!("a {} chip cannot share device memory", self.kind()),
        })
    }

    /// Where memory of [`Engine::alloc_shared`] lives (what a mapping of
    /// it elsewhere is).
    fn place(&self) -> crate::shared::Place {
        crate::shared::Place::Host
    }

    /// Frees memory of [`Engine::alloc_shared`] (what other processes
    /// mapped stays theirs until they unmap it).
    fn free_shared(&self, addr: DeviceAddr) -> Result<(), Error> {
        Err(Error::UnknownBlock {
            region: Region::Shared,
            addr,
        })
    }

    /// A new file descriptor for the memory of [`Engine::alloc_shared`] at
    /// `addr`, which another process maps with
    /// [`crate::shared::SharedMemory::map`].
    fn export(&self, addr: DeviceAddr) -> Result<OwnedFd, Error> {
        Err(Error::UnknownBlock {
            region: Region::Shared,
            addr,
        })
    }

    /// Maps `memory`, exported by a chip of this host, so that kernels
    /// here use it in place: its address and bytes, freed as memory of
    /// [`Engine::alloc_shared`] is ([`Engine::free_shared`] unmaps it).
    fn import_shared(
        &self,
        memory: &crate::shared::SharedMemory,
    ) -> Result<(DeviceAddr, u64), Error> {
        Err(Error::Shared {
            reason: format!(
                "a {} chip cannot map shared memory ({})",
                self.kind(),
                memory.place
            ),
        })
    }

    /// Bytes copied through staging buffers because their host memory
    /// could not be used for DMA in place.
    fn bounced(&self) -> u64 {
        0
    }
}

/// Points of a launch an engine that queues work marks in its queue
/// ([`Engine::stamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// Before its arguments are staged in.
    Staging,
    /// Before its kernel.
    Kernel,
    /// After its kernel.
    Done,
}
