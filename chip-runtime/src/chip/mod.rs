//! `Chip`: the machinery every kind of chip shares, over its [`Engine`].
//!
//! A chip has its own memory (managed by the [`Arena`]), moves host bytes
//! in and out explicitly in staged mode, and runs kernels on a pool of
//! lanes. Everything is counted. What differs between kinds of chip —
//! where device memory is, how bytes move and how a kernel runs — is the
//! engine's: the simulated chip's ([`crate::SimDevice`]) does it at once
//! on the lane's thread, a CUDA GPU's queues it on the lane's stream.
//!
//! A launch, step by step:
//! 1. `launch` validates the arguments against the kernel's signature, their
//!    backings and each other, then queues a job; errors here reach the
//!    caller directly and nothing runs. When a lane takes the job, a closed
//!    start gate completes it as `NotStarted` and nothing runs.
//! 2. On a lane, each argument is materialized: device-backed arguments and,
//!    in unified mode, host-backed ones resolve in place; in staged mode a
//!    scratch block receives the view's bytes when the kernel reads them or
//!    the task keeps the elements it leaves alone (`OUTPUT_EXISTING`,
//!    `INOUT`), and is zeroed wherever no copy-in writes (see below).
//! 3. The kernel runs under `catch_unwind`.
//! 4. On success, staged arguments the kernel writes are copied back, view
//!    bytes only. On failure nothing is copied back: host memory keeps its
//!    old bytes.
//! 5. Scratch blocks are freed, counters updated, and the completion called.
//!
//! Isolation: device memory is reused (scratch blocks by the next task,
//! persistent blocks after a free, the run region after a reset), so no
//! byte of it reaches a kernel, a client or a device buffer with an earlier
//! owner's bytes in it. Every block `alloc` hands out is zeroed (large
//! ones by handing their pages back to the kernel, which zero-fills them);
//! a kernel's scratch is zeroed; a staged argument's scratch is zeroed
//! except where the copy-in overwrites it (a contiguous view copied in
//! covers its whole extent, so that common path pays nothing). The bytes
//! zeroed are counted (`DeviceStats::zeroed`).

pub(crate) mod engine;
mod lanes;
mod prefetch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_wire::{AddressSpace, ArgTag, CanonicalIdentity, ChipTensor, Footprint, Tensor};

use crate::Error;
use crate::arena::{Arena, Block, Region};
use crate::cache::{Acquired, Backend, Cache, CacheUse, CopyKey, Release};
use crate::device::{
    ArgBacking, CachedCopy, Completion, Device, DeviceAddr, DeviceBlock, DeviceInfo, DeviceStats,
    Launch, LaunchArg, LaunchReport, StartGate,
};
use crate::kernel::{Kernel, validate_launch};
use crate::memory::HostMemory;
use crate::shared::SharedMemory;
use crate::spec::{DeviceSpec, Mode};
use crate::staging::Layout;
use crate::sync::{AtomicU64, Ordering};
use engine::{Engine, Lane, Placed, Stamp};
use lanes::LanePool;
use prefetch::{Prefetched, Ticket};

/// A chip: the simulated one ([`crate::SimDevice`]) or a CUDA GPU
/// (opened by `cuda::open`).
#[derive(Debug)]
pub struct Chip {
    inner: Arc<Inner>,
    lanes: LanePool,
    /// The copy lane: one thread that prefetches for launches waiting
    /// for a lane (staged mode with `prefetch=on`; [`prefetch`]).
    copier: Option<LanePool>,
}

/// What the machinery is told about a chip.
#[derive(Debug)]
pub(crate) struct ChipConfig {
    /// Sizes, lanes, mode and the simulated chip's modelling keys (a real
    /// chip: staged, no timing, no link).
    pub(crate) spec: DeviceSpec,
    /// The spec string the chip reports ([`DeviceInfo::spec`]).
    pub(crate) label: String,
}

#[derive(Debug)]
struct Inner {
    spec: DeviceSpec,
    label: String,
    engine: Box<dyn Engine>,
    /// The engine's base address (device address of arena offset 0).
    base: DeviceAddr,
    arena: Arena,
    cache: Cache,
    counters: Counters,
    /// Live shared blocks (each an allocation of the engine's own, outside
    /// the arena): device address → bytes allocated.
    shared: std::sync::Mutex<std::collections::HashMap<DeviceAddr, u64>>,
}

/// One argument's use of the cache during a launch.
#[derive(Debug, Clone, Copy)]
struct CachedArg {
    key: CopyKey,
    acquired: Acquired,
    usage: CacheUse,
    writes: bool,
    /// Bytes of a written argument copied back to host memory at the end
    /// of the task (write-through).
    written_through: u64,
}

/// The cache's view of the chip: its copies live in the persistent region.
struct ChipBackend<'a>(&'a Inner);

impl Backend for ChipBackend<'_> {
    fn alloc(&self, len: u64) -> Result<Block, Error> {
        self.0.arena.alloc(Region::Persistent, len)
    }

    fn free(&self, block: Block) {
        // The cache frees each of its blocks once (CACHE-1, CACHE-3).
        let _ = self.0.arena.free(Region::Persistent, block.offset);
    }

    fn write_back(&self, block: Block, view: &Tensor, host: &Arc<dyn HostMemory>) -> u64 {
        let layout = Layout::of(view);
        let len = layout.len(view);
        // A dirty copy comes from a launch whose backing was checked:
        // writable, and long enough for the view.
        if !host.writable() || view.end_byte() > host.len() as u64 || block.len < len {
            return 0;
        }
        // A timing chip's copies hold nothing: it moves no byte to host
        // memory, ever (a kernel there writes nothing either).
        if self.0.spec.timing {
            return layout.view_bytes(view);
        }
        // Counted as staged to host by whoever asked: the launch whose
        // staging evicted it, a flush, a user allocation. The host mapping
        // is kept mapped by the entry's Arc.
        let inner = self.0;
        inner
            .engine
            .copy_out(None, layout, view, inner.base + block.offset, host)
            .unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct Counters {
    staged_to_device: AtomicU64,
    staged_to_host: AtomicU64,
    copied_to_device: AtomicU64,
    copied_to_host: AtomicU64,
    launched: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    panicked: AtomicU64,
    busy_ns: AtomicU64,
    zeroed: AtomicU64,
}

/// From this size on, `alloc` zeroes a block by handing its whole pages
/// back to the kernel instead of writing them: a large device buffer costs
/// no memory or time until it is touched.
const RELEASE_FROM: u64 = 256 * 1024;

impl Chip {
    /// A chip over `engine`.
    ///
    /// # Errors
    /// [`Error::Map`] when the lane threads cannot be started.
    pub(crate) fn build(config: ChipConfig, engine: Box<dyn Engine>) -> Result<Self, Error> {
        let ChipConfig { spec, label } = config;
        let arena = Arena::new(spec.persistent(), spec.run, spec.scratch)?;
        // A timing chip's kernels sleep: a lane that spins for the next
        // job only takes the CPU that the driver and the other modelled
        // chips need to keep time.
        let spin = !spec.timing;
        let lanes = LanePool::new(spec.lanes, spin).map_err(|e| Error::Map {
            bytes: 0,
            reason: format!("cannot start lane threads: {e}"),
        })?;
        let copier = if spec.prefetch && spec.mode == Mode::Staged {
            Some(LanePool::new(1, spin).map_err(|e| Error::Map {
                bytes: 0,
                reason: format!("cannot start the copy thread: {e}"),
            })?)
        } else {
            None
        };
        Ok(Chip {
            copier,
            inner: Arc::new(Inner {
                base: engine.base(),
                engine,
                spec,
                label,
                arena,
                cache: Cache::new(),
                counters: Counters::default(),
                shared: Default::default(),
            }),
            lanes,
        })
    }

    /// The arena's invariant check (ARENA-1..3), for tests.
    ///
    /// # Errors
    /// The first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.inner.arena.check_invariants()?;
        self.inner.cache.check_invariants()
    }

    /// Checks `launch` and makes the job that runs it on a lane.
    fn job(&self, launch: Launch, done: Completion) -> Result<lanes::Job, Error> {
        let dtypes = self.inner.spec.dtypes;
        if let Some((index, a)) =
            (launch.args.iter().enumerate()).find(|(_, a)| !dtypes.contains(a.tensor.dtype()))
        {
            return Err(Error::UnsupportedDType {
                kernel: launch.kernel.descriptor().qualified_name(),
                index,
                dtype: a.tensor.dtype(),
                supported: dtypes,
            });
        }
        let tagged: Vec<(Tensor, ArgTag)> = launch.args.iter().map(|a| (a.tensor, a.tag)).collect();
        validate_launch(launch.kernel.as_ref(), &tagged, &launch.scalars)?;
        for (i, arg) in launch.args.iter().enumerate() {
            self.inner.check_backing(&launch, i, arg)?;
        }
        self.inner.counters.launched.fetch_add(1, Ordering::Relaxed);
        let ticket = self.prefetch(&launch);
        let inner = Arc::clone(&self.inner);
        let queued_at = Instant::now();
        let job = Box::new(move |lane: usize| {
            // One clock read ends the wait and starts the run.
            let begun = Instant::now();
            let queued = begun.saturating_duration_since(queued_at);
            // The gate is checked here, on the lane, and not when the
            // launch is accepted: a job may wait in the queue long after.
            let outcome = match launch.gate.as_ref().map(StartGate::check) {
                Some(Err(e)) => {
                    inner.counters.failed.fetch_add(1, Ordering::Relaxed);
                    Err(e)
                }
                _ => {
                    let ahead = ticket.and_then(|t| t.claim());
                    inner.execute(&launch, lane, queued, begun, ahead)
                }
            };
            // The launch's leases go before the completion runs, so that a
            // private buffer the task wrote is its completion's alone (and
            // can leave as its bytes without a copy).
            drop(launch);
            done(outcome);
        });
        Ok(job)
    }
}

impl Chip {
    /// Starts copying the bytes `launch` reads into the device cache when
    /// it will wait for a lane ([`prefetch`]); the ticket its lane claims.
    fn prefetch(&self, launch: &Launch) -> Option<Arc<Ticket>> {
        let copier = self.copier.as_ref()?;
        if self.lanes.in_flight() < self.inner.spec.lanes {
            return None; // it starts at once
        }
        let desc = launch.kernel.descriptor();
        let loads: Vec<LaunchArg> = launch
            .args
            .iter()
            .zip(&desc.args)
            .filter(|(a, spec)| {
                matches!(a.backing, ArgBacking::Host(_))
                    && a.cache.is_some_and(|c| !c.held)
                    && reads_in(spec, a)
            })
            .map(|(a, _)| a.clone())
            .collect();
        if loads.is_empty() {
            return None;
        }
        let ticket = Arc::new(Ticket::new());
        let (t, inner) = (Arc::clone(&ticket), Arc::clone(&self.inner));
        // The copy lane comes after the launch lanes.
        let lane = self.inner.spec.lanes;
        copier
            .submit(Box::new(move |_| {
                if t.start() {
                    t.finish(inner.prefetch(lane, &loads));
                }
            }))
            .ok()?;
        Some(ticket)
    }
}

/// Whether a staged argument's bytes are copied in before the kernel:
/// when the kernel reads them, when the task keeps the elements it does
/// not write (OUTPUT_EXISTING, INOUT: the copy-back returns every element,
/// so an untouched one must hold its own bytes), and for sub-byte views,
/// whose bytes are shared with neighbours the copy-back must keep intact.
fn reads_in(spec: &crate::kernel::ArgSpec, arg: &LaunchArg) -> bool {
    spec.access.allows_read()
        || matches!(arg.tag, ArgTag::OutputExisting | ArgTag::InOut)
        || arg.tensor.dtype().is_sub_byte()
}

impl Device for Chip {
    fn info(&self) -> DeviceInfo {
        let spec = &self.inner.spec;
        DeviceInfo {
            kind: self.inner.engine.kind().into(),
            spec: self.inner.label.clone(),
            memory: spec.mem,
            lanes: spec.lanes,
            mode: spec.mode,
            dtypes: spec.dtypes,
            caches: spec.mode == Mode::Staged,
        }
    }

    fn alloc(&self, region: Region, nbytes: u64) -> Result<DeviceBlock, Error> {
        if region == Region::Shared {
            return self.inner.alloc_shared(nbytes);
        }
        if region == Region::Scratch {
            return Err(Error::Spec {
                spec: self.inner.label.clone(),
                reason: "the scratch region is for kernels; allocate persistent or run blocks"
                    .into(),
            });
        }
        // User blocks outrank cached copies, which live in the persistent
        // region: evict copies to make room there.
        let b = if region == Region::Persistent {
            let before = self.inner.cache.stats().written_back;
            let b = self.inner.cache.make_room(&self.inner.backend(), &|| {
                self.inner.arena.alloc(region, nbytes)
            });
            // Dirty copies it evicted went to host memory.
            self.inner.counters.staged_to_host.fetch_add(
                self.inner.cache.stats().written_back.saturating_sub(before),
                Ordering::Relaxed,
            );
            b?
        } else {
            self.inner.arena.alloc(region, nbytes)?
        };
        let addr = self.inner.base + b.offset;
        // A freed persistent block, or a run block after a reset, holds
        // whatever its last owner left: the block is handed out zeroed.
        if let Err(e) = self.inner.zero(None, addr, b.len, b.len >= RELEASE_FROM) {
            let _ = self.inner.arena.free(region, b.offset);
            return Err(e);
        }
        Ok(DeviceBlock {
            addr,
            len: b.len,
            region,
            epoch: b.epoch,
        })
    }

    fn free(&self, addr: DeviceAddr) -> Result<(), Error> {
        if lock(&self.inner.shared).remove(&addr).is_some() {
            return self.inner.engine.free_shared(addr);
        }
        let unknown = Error::UnknownBlock {
            region: Region::Persistent,
            addr,
        };
        let offset = addr.checked_sub(self.inner.base).ok_or(unknown)?;
        self.inner
            .arena
            .free(Region::Persistent, offset)
            .map(|_| ())
            .map_err(|_| Error::UnknownBlock {
                region: Region::Persistent,
                addr,
            })
    }

    fn end_run(&self) -> Result<(), Error> {
        self.inner.arena.reset_run();
        Ok(())
    }

    fn export(&self, block: &DeviceBlock) -> Result<SharedMemory, Error> {
        if block.region != Region::Shared {
            return Err(Error::Shared {
                reason: format!(
                    "the block at {:#x} is in the {} region: only shared blocks leave the process",
                    block.addr, block.region
                ),
            });
        }
        self.inner.check_block(block)?;
        let len = lock(&self.inner.shared)
            .get(&block.addr)
            .copied()
            .unwrap_or(block.len);
        Ok(SharedMemory {
            fd: self.inner.engine.export(block.addr)?,
            len,
            place: self.inner.engine.place(),
        })
    }

    fn import(&self, memory: SharedMemory) -> Result<DeviceBlock, Error> {
        let (addr, len) = self.inner.engine.import_shared(&memory)?;
        lock(&self.inner.shared).insert(addr, len);
        Ok(DeviceBlock {
            addr,
            len: memory.len.min(len),
            region: Region::Shared,
            epoch: 0,
        })
    }

    fn check_block(&self, block: &DeviceBlock) -> Result<(), Error> {
        self.inner.check_block(block)
    }

    fn copy_to_device(&self, block: &DeviceBlock, offset: u64, src: &[u8]) -> Result<(), Error> {
        let dst = self.inner.block_range(block, offset, src.len() as u64)?;
        self.inner.engine.write(dst, src)?;
        self.inner
            .counters
            .copied_to_device
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn copy_from_device(
        &self,
        block: &DeviceBlock,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Error> {
        let src = self.inner.block_range(block, offset, dst.len() as u64)?;
        self.inner.engine.read(src, dst)?;
        self.inner
            .counters
            .copied_to_host
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn launch(&self, launch: Launch, done: Completion) -> Result<(), Error> {
        let job = self.job(launch, done)?;
        self.lanes.submit(job).map_err(|_| Error::ShutDown)
    }

    /// On this thread when the device has one lane, idle, with nothing
    /// queued (`LanePool::run_here`); queued otherwise.
    fn launch_here(&self, launch: Launch, done: Completion) -> Result<(), Error> {
        let job = self.job(launch, done)?;
        match self.lanes.run_here(job) {
            Ok(()) => Ok(()),
            Err(job) => self.lanes.submit(job).map_err(|_| Error::ShutDown),
        }
    }

    fn runs(&self, kernel: &dyn Kernel) -> bool {
        self.inner.engine.runs(kernel)
    }

    fn lost(&self) -> Option<String> {
        self.inner.engine.lost()
    }

    fn synchronize(&self) {
        self.lanes.wait_idle();
    }

    fn stats(&self) -> DeviceStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DeviceStats {
            arena: self.inner.arena.stats(),
            staged_to_device: get(&c.staged_to_device),
            staged_to_host: get(&c.staged_to_host),
            copied_to_device: get(&c.copied_to_device),
            copied_to_host: get(&c.copied_to_host),
            launched: get(&c.launched),
            succeeded: get(&c.succeeded),
            failed: get(&c.failed),
            panicked: get(&c.panicked),
            busy: Duration::from_nanos(get(&c.busy_ns)),
            zeroed: get(&c.zeroed),
            bounced: self.inner.engine.bounced(),
            shared: lock(&self.inner.shared).values().sum(),
            cache: self.inner.cache.stats(),
        }
    }

    fn flush(&self, owner: u64, pick: &dyn Fn(&Footprint) -> bool) -> u64 {
        let moved = self.inner.cache.flush(&self.inner.backend(), owner, pick);
        self.inner
            .counters
            .staged_to_host
            .fetch_add(moved, Ordering::Relaxed);
        moved
    }

    fn drop_copies(&self, owner: u64, identity: Option<&CanonicalIdentity>) -> usize {
        let n = self
            .inner
            .cache
            .drop_owner(&self.inner.backend(), owner, identity);
        self.inner.engine.released();
        n
    }

    fn cached(&self) -> Vec<CachedCopy> {
        self.inner
            .cache
            .copies()
            .into_iter()
            .map(|(key, version, dirty, pinned)| CachedCopy {
                key,
                version,
                dirty,
                pinned,
            })
            .collect()
    }
}

/// A scratch block freed when dropped.
struct ScratchGuard<'a> {
    arena: &'a Arena,
    block: Block,
}

impl Drop for ScratchGuard<'_> {
    fn drop(&mut self) {
        // The block was allocated by this guard's owner and is freed once.
        let _ = self.arena.free(Region::Scratch, self.block.offset);
    }
}

impl Inner {
    /// Copies the bytes of `args` (host-backed, cached, read by their
    /// kernel) into the device cache at the versions they name, as a
    /// launch's staging would, and leaves the copies there unpinned
    /// ([`prefetch`]). Copies already there are left as they are; one
    /// that cannot be placed is left to the launch.
    fn prefetch(&self, lane: usize, args: &[LaunchArg]) -> Prefetched {
        let mut out = Prefetched::default();
        let backend = self.backend();
        for arg in args {
            let (Some(usage), ArgBacking::Host(mem)) = (arg.cache, &arg.backing) else {
                continue;
            };
            let t = &arg.tensor;
            let footprint = usage.footprint.unwrap_or_else(|| Footprint::of(t));
            if usage.held || !footprint.is_exact() {
                continue;
            }
            let layout = Layout::of(t);
            let len = layout.len(t);
            let key = CopyKey {
                owner: usage.owner,
                footprint,
            };
            // Only a copy made here is counted; what is there already, or
            // has no room, is the launch's to count when it stages.
            let mut figures = crate::cache::CacheStats::default();
            let Some(acquired) = self
                .cache
                .acquire_absent(&backend, key, usage, len, &mut figures)
            else {
                continue;
            };
            let mut copied = None;
            if let Acquired::Fresh { block, .. } = acquired {
                let addr = self.base + block.offset;
                copied = (|| -> Result<u64, Error> {
                    if self.spec.timing {
                        return Ok(layout.view_bytes(t));
                    }
                    let lane = Some(lane);
                    if !layout.filled_by_copy_in(t) {
                        self.zero(lane, addr, len, false)?;
                    }
                    // The launch's backing was checked before its prefetch
                    // was queued; the cloned argument keeps it mapped.
                    let n = self.engine.copy_in(lane, layout, t, mem, addr)?;
                    self.engine.finish(lane)?;
                    Ok(n)
                })()
                .ok();
            }
            // A copy that failed is given back as a failed write would be;
            // one made becomes the copy at the version read.
            let failed = matches!(acquired, Acquired::Fresh { .. }) && copied.is_none();
            self.cache.release(
                &backend,
                Release {
                    key,
                    acquired,
                    usage,
                    writes: failed,
                    ok: !failed,
                    written_through: 0,
                    view: t,
                    host: mem,
                },
                &mut figures,
            );
            if let Some(n) = copied {
                self.link_pause(n);
                self.cache.count_prefetched(n);
                figures.prefetched += n;
                out.cache.add(&figures);
                out.staged_in += n;
                out.keys.push(key);
            }
        }
        out
    }

    fn backend(&self) -> ChipBackend<'_> {
        ChipBackend(self)
    }

    /// Zeroes `len` device bytes at `addr` and counts them.
    fn zero(&self, lane: Lane, addr: DeviceAddr, len: u64, release: bool) -> Result<(), Error> {
        self.engine.zero(lane, addr, len, release)?;
        self.counters.zeroed.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// A shared block of `nbytes`, zeroed ([`Region::Shared`]).
    fn alloc_shared(&self, nbytes: u64) -> Result<DeviceBlock, Error> {
        if nbytes == 0 {
            return Err(Error::Shared {
                reason: "a shared block has at least one byte".into(),
            });
        }
        let (addr, len) = self.engine.alloc_shared(nbytes)?;
        // Fresh memory of the engine's may hold what its last user left.
        if let Err(e) = self.zero(None, addr, len, false) {
            let _ = self.engine.free_shared(addr);
            return Err(e);
        }
        lock(&self.shared).insert(addr, len);
        Ok(DeviceBlock {
            addr,
            len: nbytes,
            region: Region::Shared,
            epoch: 0,
        })
    }

    /// Checks that `block` is a live persistent or shared block or a run
    /// block of the current run; errors carry device addresses.
    fn check_block(&self, block: &DeviceBlock) -> Result<(), Error> {
        let unknown = Error::UnknownBlock {
            region: block.region,
            addr: block.addr,
        };
        if block.region == Region::Scratch {
            return Err(unknown);
        }
        if block.region == Region::Shared {
            return match lock(&self.shared).get(&block.addr) {
                Some(&len) if block.len <= len => Ok(()),
                _ => Err(unknown),
            };
        }
        let offset = block.addr.checked_sub(self.base).ok_or(unknown.clone())?;
        let arena_block = Block {
            region: block.region,
            offset,
            len: block.len,
            epoch: block.epoch,
        };
        self.arena.check_live(&arena_block).map_err(|e| match e {
            Error::RunEnded { run, current, .. } => Error::RunEnded {
                addr: block.addr,
                run,
                current,
            },
            _ => unknown,
        })
    }

    /// The device address of `[offset, offset + len)` of a live `block`.
    fn block_range(&self, block: &DeviceBlock, offset: u64, len: u64) -> Result<DeviceAddr, Error> {
        self.check_block(block)?;
        match offset.checked_add(len) {
            Some(end) if end <= block.len => Ok(block.addr + offset),
            _ => Err(Error::OutOfRange {
                addr: block.addr.saturating_add(offset),
                len,
                what: "the device block",
            }),
        }
    }

    fn check_backing(&self, launch: &Launch, i: usize, arg: &LaunchArg) -> Result<(), Error> {
        let desc = launch.kernel.descriptor();
        let bad = |reason: String| Error::Argument {
            kernel: desc.qualified_name(),
            index: i,
            name: desc
                .args
                .get(i)
                .map_or_else(|| "?".into(), |a| a.name.clone()),
            reason,
        };
        let t = &arg.tensor;
        let writes = desc.args.get(i).is_some_and(|a| a.access.allows_write());
        match &arg.backing {
            ArgBacking::Host(mem) => {
                if t.buffer().address_space() != AddressSpace::Host {
                    return Err(bad("a DEVICE buffer cannot be backed by host memory".into()));
                }
                if t.end_byte() > mem.len() as u64 {
                    return Err(bad(format!(
                        "the view ends at byte {} but the host mapping has {}",
                        t.end_byte(),
                        mem.len()
                    )));
                }
                if writes && !mem.writable() {
                    return Err(bad(
                        "the kernel writes it but its host mapping is read-only".into(),
                    ));
                }
            }
            ArgBacking::Device(block) => {
                if t.buffer().address_space() != AddressSpace::Device {
                    return Err(bad(
                        "a HOST buffer cannot be backed by a device block".into()
                    ));
                }
                if t.end_byte() > block.len {
                    return Err(bad(format!(
                        "the view ends at byte {} but the device block has {}",
                        t.end_byte(),
                        block.len
                    )));
                }
                self.check_block(block).map_err(|e| bad(e.to_string()))?;
            }
        }
        Ok(())
    }

    fn execute(
        &self,
        launch: &Launch,
        lane: usize,
        queued: Duration,
        started: Instant,
        ahead: Option<Prefetched>,
    ) -> Result<LaunchReport, Error> {
        let mut report = LaunchReport {
            lane,
            queued,
            ..LaunchReport::default()
        };
        let ahead = ahead.unwrap_or_default();
        self.engine.begin(lane, launch.priority);
        let result = self.materialize_and_run(launch, lane, &mut report, &ahead.keys, started);
        self.engine.end(lane);
        // What was copied ahead for it is part of what it moved.
        report.staged_in += ahead.staged_in;
        report.cache.add(&ahead.cache);
        report.busy = started.elapsed();
        // No clock read of its own: what is not staging in or the kernel.
        report.copy_out = report.busy.saturating_sub(report.copy_in + report.kernel);
        let c = &self.counters;
        c.busy_ns.fetch_add(
            u64::try_from(report.busy.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        c.staged_to_device
            .fetch_add(report.staged_in, Ordering::Relaxed);
        c.staged_to_host
            .fetch_add(report.staged_out, Ordering::Relaxed);
        match &result {
            Ok(()) => c.succeeded.fetch_add(1, Ordering::Relaxed),
            Err(Error::KernelPanicked { .. }) => c.panicked.fetch_add(1, Ordering::Relaxed),
            Err(_) => c.failed.fetch_add(1, Ordering::Relaxed),
        };
        result.map(|()| report)
    }

    /// Materializes, runs and stages back (module docs), then ends every
    /// cached argument's use of the cache, whatever happened.
    fn materialize_and_run(
        &self,
        launch: &Launch,
        lane: usize,
        report: &mut LaunchReport,
        prefetched: &[CopyKey],
        begun: Instant,
    ) -> Result<(), Error> {
        let mut cached: Vec<Option<CachedArg>> = vec![None; launch.args.len()];
        let mut guards = Vec::new();
        let mut result = self.run_launch(launch, lane, report, &mut cached, &mut guards, begun);
        // Nothing queued on the lane may still use a staged block when it
        // is freed, or a cached copy when the cache takes it back.
        if let Err(e) = self.engine.finish(Some(lane))
            && result.is_ok()
        {
            result = Err(e);
        }
        drop(guards);
        let backend = self.backend();
        for (arg, c) in launch.args.iter().zip(cached) {
            let (Some(c), ArgBacking::Host(host)) = (c, &arg.backing) else {
                continue;
            };
            // Finding the copy made for it ahead is no hit: that copy is
            // counted as its miss.
            if matches!(c.acquired, Acquired::Hit(_)) && prefetched.contains(&c.key) {
                let len = Layout::of(&arg.tensor).len(&arg.tensor);
                report.cache.hits -= 1;
                report.cache.hit_bytes -= len;
                self.cache.uncount_hit(len);
            }
            let mut figures = crate::cache::CacheStats::default();
            self.cache.release(
                &backend,
                Release {
                    key: c.key,
                    acquired: c.acquired,
                    usage: c.usage,
                    writes: c.writes,
                    ok: result.is_ok(),
                    written_through: c.written_through,
                    view: &arg.tensor,
                    host,
                },
                &mut figures,
            );
            // Beyond the write-through (already counted as staged out), a
            // written block that could not become the copy went to host
            // memory.
            report.staged_out += figures.written_back.saturating_sub(c.written_through);
            report.cache.add(&figures);
        }
        result
    }

    /// Where a staged host-backed argument works, and how its bytes get
    /// there: its cached copy (read in place, or copied on the chip into
    /// a block the kernel writes), or a new block — cached or scratch —
    /// filled from host memory where the kernel reads it and zeroed
    /// everywhere else.
    #[allow(clippy::too_many_arguments)]
    fn stage_in(
        &self,
        lane: Lane,
        arg: &LaunchArg,
        mem: &Arc<dyn HostMemory>,
        copy_in: bool,
        writes: bool,
        report: &mut LaunchReport,
        slot: &mut Option<CachedArg>,
    ) -> Result<(DeviceAddr, Option<ScratchGuard<'_>>), Error> {
        let t = &arg.tensor;
        let layout = Layout::of(t);
        let len = layout.len(t);
        // The byte set only for an argument that uses the cache (computing
        // it costs a normalization of the view).
        let cached = arg
            .cache
            .map(|usage| (usage, usage.footprint.unwrap_or_else(|| Footprint::of(t))))
            .filter(|(_, footprint)| footprint.is_exact());
        if let (None, Some(usage)) = (cached, arg.cache)
            && usage.held
        {
            return Err(held_without_copy(
                arg,
                "its byte set is not exact, so it is never cached",
            ));
        }
        let acquired = match cached {
            Some((usage, footprint)) => {
                let key = CopyKey {
                    owner: usage.owner,
                    footprint,
                };
                // Dirty copies evicted to make room go to host memory on
                // this launch's account.
                let before = report.cache.written_back;
                let acquired = self.cache.acquire(
                    &self.backend(),
                    key,
                    usage,
                    copy_in,
                    writes,
                    len,
                    &mut report.cache,
                );
                report.staged_out += report.cache.written_back - before;
                let acquired = acquired?;
                *slot = Some(CachedArg {
                    key,
                    acquired,
                    usage,
                    writes,
                    written_through: 0,
                });
                Some(acquired)
            }
            None => None,
        };
        let (addr, guard, from_host) = match acquired {
            Some(Acquired::Hit(block)) => return Ok((self.base + block.offset, None)),
            Some(Acquired::Copy { from, to, .. }) => {
                let (src, dst) = (self.base + from.offset, self.base + to.offset);
                if self.spec.timing {
                    // As for bytes from host memory: nothing moves, and no
                    // kernel reads the block.
                    return Ok((dst, None));
                }
                if !layout.filled_by_copy_in(t) {
                    self.zero(lane, dst, len, false)?;
                }
                // Both are live blocks of at least `len` bytes (the cached
                // copy pinned, the new one this launch's).
                self.engine.copy_on_chip(lane, layout, t, src, dst)?;
                return Ok((dst, None));
            }
            Some(Acquired::Fresh { block, .. }) => (self.base + block.offset, None, copy_in),
            None | Some(Acquired::Bypass) => {
                let block = self.arena.alloc(Region::Scratch, len)?;
                let guard = ScratchGuard {
                    arena: &self.arena,
                    block,
                };
                (self.base + block.offset, Some(guard), copy_in)
            }
        };
        if self.spec.timing {
            // Timing mode moves no byte: it charges the link what a copy
            // would move, and no kernel reads the block.
            if from_host {
                report.staged_in += layout.view_bytes(t);
            }
            return Ok((addr, guard));
        }
        // Wherever no copy-in writes — the whole block for an OUTPUT, the
        // gaps of a strided view laid out as in the buffer — the block
        // still holds an earlier owner's bytes: zero them, so that a kernel
        // sees no foreign byte and an OUTPUT element it leaves alone comes
        // back as zero, not as someone else's.
        if !from_host || !layout.filled_by_copy_in(t) {
            self.zero(lane, addr, len, false)?;
        }
        if from_host {
            // The view's extent lies inside the host mapping
            // (check_backing) and the copy's `len` bytes inside the block.
            report.staged_in += self.engine.copy_in(lane, layout, t, mem, addr)?;
        }
        Ok((addr, guard))
    }

    /// Stages in, runs and stages out one launch on `lane`; the scratch
    /// blocks of staged arguments go to `guards`, which the caller keeps
    /// until the lane has finished.
    fn run_launch<'s>(
        &'s self,
        launch: &Launch,
        lane: usize,
        report: &mut LaunchReport,
        cached: &mut [Option<CachedArg>],
        guards: &mut Vec<ScratchGuard<'s>>,
        begun: Instant,
    ) -> Result<(), Error> {
        let desc = launch.kernel.descriptor();
        // A launch on device memory alone has nothing to copy in: no mark
        // (a driver call per launch on a GPU) for copies that do not
        // happen.
        if self.spec.mode == Mode::Staged
            && (launch.args.iter()).any(|a| matches!(a.backing, ArgBacking::Host(_)))
        {
            self.engine.stamp(lane, Stamp::Staging);
        }
        let mut on_chip: Vec<bool> = Vec::with_capacity(launch.args.len());
        let mut args: Vec<Placed> = Vec::with_capacity(launch.args.len());
        for ((arg, spec), slot) in launch.args.iter().zip(&desc.args).zip(cached.iter_mut()) {
            let t = &arg.tensor;
            let extent = t.extent_bytes();
            let (chip, base, len) = match (&arg.backing, self.spec.mode) {
                (ArgBacking::Host(_), Mode::Unified) if arg.cache.is_some_and(|c| c.held) => {
                    return Err(held_without_copy(arg, "a unified chip keeps no copies"));
                }
                (ArgBacking::Host(mem), Mode::Unified) => {
                    let at = mem.as_ptr() as u64;
                    let chip = ChipTensor::from_view(t, at, mem.len() as u64, AddressSpace::Host)?;
                    // check_backing proved byte_offset + extent ≤ the
                    // mapping's length, and the Arc in `launch` keeps it
                    // mapped.
                    (chip, at + t.byte_offset(), extent)
                }
                (ArgBacking::Host(mem), Mode::Staged) => {
                    let copy_in = reads_in(spec, arg);
                    let writes = spec.access.allows_write();
                    let (addr, guard) =
                        self.stage_in(Some(lane), arg, mem, copy_in, writes, report, slot)?;
                    guards.extend(guard);
                    let layout = Layout::of(t);
                    (layout.chip_tensor(t, addr)?, addr, layout.len(t))
                }
                (ArgBacking::Device(block), _) => {
                    // A run block checked at launch may have had its run
                    // ended while the launch waited for a lane (a caller
                    // that broke `end_run`'s contract): refuse rather than
                    // touch bytes that may be another run's now.
                    if block.region == Region::Run {
                        self.check_block(block)?;
                    }
                    let chip =
                        ChipTensor::from_view(t, block.addr, block.len, AddressSpace::Device)?;
                    (chip, block.addr + t.byte_offset(), extent)
                }
            };
            args.push(Placed {
                chip,
                access: spec.access,
                base,
                len,
            });
            on_chip
                .push(matches!(arg.backing, ArgBacking::Host(_)) && self.spec.mode == Mode::Staged);
        }

        let scratch = |nbytes: u64| -> Result<engine::ScratchBlock<'_>, Error> {
            let arena = &self.arena;
            let block = arena.alloc(Region::Scratch, nbytes)?;
            let guard = ScratchGuard { arena, block };
            let addr = self.base + block.offset;
            // The block last held another kernel's temporaries.
            self.zero(Some(lane), addr, nbytes, false)?;
            Ok((addr, Box::new(move || drop(guard))))
        };
        // The modelled link carries what this launch staged in (what a
        // prefetch copied ahead was charged on the copy thread).
        self.link_pause(report.staged_in);
        let started = Instant::now();
        report.copy_in = started.saturating_duration_since(begun);
        let ran = if self.spec.timing {
            let tensors: Vec<Tensor> = launch.args.iter().map(|a| a.tensor).collect();
            pause(modelled_kernel(
                &self.spec,
                launch.kernel.flops(&tensors),
                &tensors,
            ));
            Ok(())
        } else {
            // The kernel has ended, well or not, before anything is copied
            // back: a failed task writes nothing to host memory.
            self.engine.stamp(lane, Stamp::Kernel);
            self.engine
                .run(
                    lane,
                    launch.kernel.as_ref(),
                    &args,
                    &launch.scalars,
                    &scratch,
                )
                .and_then(|held| {
                    self.engine.stamp(lane, Stamp::Done);
                    let done = self.engine.finish(Some(lane));
                    drop(held);
                    done
                })
        };
        report.kernel = started.elapsed();
        ran?;
        // Where the device works after each call returns, the clock above
        // timed the queueing: the copies in ran on the device during what
        // it counted as the kernel. The device's own marks say what each
        // took.
        if let Some((copy_in, kernel)) = self.engine.stamped(lane) {
            report.copy_in = copy_in;
            report.kernel = kernel;
        }
        for (((arg, spec), (placed, staged_here)), slot) in launch
            .args
            .iter()
            .zip(&desc.args)
            .zip(args.iter().zip(&on_chip))
            .zip(cached.iter_mut())
        {
            let (true, ArgBacking::Host(mem), true) =
                (*staged_here, &arg.backing, spec.access.allows_write())
            else {
                continue;
            };
            // A written copy the cache keeps dirty stays on the chip.
            if let Some(c) = slot
                && c.usage.deferred
                && !matches!(c.acquired, Acquired::Bypass)
            {
                continue;
            }
            let t = &arg.tensor;
            let layout = Layout::of(t);
            let moved = if self.spec.timing {
                // Counted and charged, never written: the kernel computed
                // nothing, and host memory keeps its bytes.
                layout.view_bytes(t)
            } else {
                // The host mapping is writable (check_backing).
                self.engine
                    .copy_out(Some(lane), layout, t, placed.chip.addr(), mem)?
            };
            report.staged_out += moved;
            self.link_pause(moved);
            if let Some(c) = slot {
                c.written_through = moved;
            }
        }
        self.engine.finish(Some(lane))
    }

    /// Sleeps for what moving `bytes` over the modelled link takes (nothing
    /// without a link, or for no bytes).
    fn link_pause(&self, bytes: u64) {
        if let (Some(bw), true) = (self.spec.link, bytes > 0) {
            pause(link_time(bw, self.spec.latency_us, bytes));
        }
    }
}

/// What moving `bytes` takes on a link of `bandwidth` bytes/s and
/// `latency_us` per transfer.
fn link_time(bandwidth: u64, latency_us: u32, bytes: u64) -> Duration {
    Duration::from_micros(u64::from(latency_us))
        + Duration::from_secs_f64(bytes as f64 / bandwidth as f64)
}

/// How long a kernel takes in timing mode: its flops at the spec's rate,
/// or, for a kernel that counts none, the bytes its arguments span at
/// 10 GB/s.
fn modelled_kernel(spec: &DeviceSpec, flops: Option<u64>, args: &[Tensor]) -> Duration {
    match flops {
        Some(f) => Duration::from_secs_f64(f as f64 / (f64::from(spec.gflops) * 1e9)),
        None => {
            let bytes: u64 = args.iter().map(Tensor::extent_bytes).sum();
            Duration::from_secs_f64(bytes as f64 / 10e9)
        }
    }
}

/// Sleeps for `d` (the modelled chip's time passing without its CPU).
/// The thread's timer slack is cut to a microsecond first (Linux lets a
/// sleep overrun by 50 µs otherwise: a few per task, a visible share of a
/// modelled millisecond kernel).
fn pause(d: Duration) {
    thread_local! {
        static TIGHT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if d.is_zero() {
        return;
    }
    TIGHT.with(|t| {
        if !t.replace(true) {
            // Only precision is lost if it fails.
            let _ = nix::sys::prctl::set_timerslack(1_000);
        }
    });
    std::thread::sleep(d);
}

/// The error for a held argument the chip could never hold.
fn held_without_copy(arg: &LaunchArg, why: &str) -> Error {
    let t = &arg.tensor;
    Error::NotHeld {
        buffer: *t.identity(),
        footprint: format!("{}..{}", t.byte_offset(), t.end_byte()),
        version: arg.cache.map_or(0, |c| c.version),
        why: why.into(),
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
