//! The CUDA chip's engine: device memory from one driver allocation, a
//! stream per lane, host buffers page-locked in place for DMA, kernels
//! launched from NVRTC-compiled sources or made as library calls.
//!
//! Every driver call goes through [`Gpu::check`], which turns a failure
//! into a [`CudaError`] and remembers a sticky one (an illegal address, a
//! trapped kernel: the context is lost): from then on every operation
//! fails with the same [`CudaError::ContextLost`], so no launch in flight
//! completes as if it had run, and nothing more is copied back.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::sys::{self, CUresult};
use strata_wire::Tensor;

use super::kernels::Functions;
use super::library::Handles;
use super::plan::{Rect, rects};
use crate::Error;
use crate::chip::engine::{Engine, Held, Lane, Placed, ScratchFn, Stamp, host_at};
use crate::device::DeviceAddr;
use crate::error::CudaError;
use crate::kernel::Kernel;
use crate::memory::HostMemory;
use crate::staging::Layout;

/// A raw driver handle moved between threads. The driver's handles are
/// thread-agnostic once the context is current on the calling thread,
/// which every entry point here makes sure of ([`Gpu::bind`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Raw<T>(pub(crate) T);
// SAFETY: see the type's docs: CUDA handles may be used from any thread
// with the context current; each is used by one lane at a time (its
// lane's mutex) or is immutable after creation.
unsafe impl<T> Send for Raw<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Raw<T> {}

/// The device, its context and what went wrong on it.
#[derive(Debug)]
pub(crate) struct Gpu {
    pub(crate) ordinal: u32,
    ctx: Arc<cudarc::driver::CudaContext>,
    /// The sticky failure that lost the context, once there is one.
    lost: Mutex<Option<CudaError>>,
}

/// Driver errors after which the context cannot be used again.
fn sticky(code: CUresult) -> bool {
    use CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_EXTERNAL_DEVICE
    )
}

/// `CUDA_ERROR_...` for a result code.
pub(crate) fn code_name(code: CUresult) -> String {
    format!("{code:?}")
}

impl Gpu {
    pub(crate) fn open(ordinal: u32) -> Result<Gpu, CudaError> {
        let ctx =
            cudarc::driver::CudaContext::new(ordinal as usize).map_err(|e| CudaError::Call {
                ordinal,
                call: "cuDevicePrimaryCtxRetain",
                name: code_name(e.0),
                code: e.0 as u32,
            })?;
        Ok(Gpu {
            ordinal,
            ctx,
            lost: Mutex::new(None),
        })
    }

    /// Makes the context current on this thread; fails once it is lost.
    pub(crate) fn bind(&self) -> Result<(), Error> {
        if let Some(e) = lock(&self.lost).clone() {
            return Err(e.into());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.fail("cuCtxSetCurrent", e.0))
    }

    /// Makes the context current even when it is lost (to free what it
    /// holds).
    pub(crate) fn bind_even_lost(&self) -> Result<(), cudarc::driver::DriverError> {
        self.ctx.bind_to_thread()
    }

    /// The error for `code` returned by `call`; a sticky one loses the
    /// context for good.
    pub(crate) fn fail(&self, call: &'static str, code: CUresult) -> Error {
        let (name, ordinal) = (code_name(code), self.ordinal);
        if sticky(code) {
            let mut lost = lock(&self.lost);
            let e = lost
                .get_or_insert(CudaError::ContextLost {
                    ordinal,
                    call,
                    name,
                    code: code as u32,
                })
                .clone();
            return e.into();
        }
        if code == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let free = mem_info().map_or(0, |(f, _)| f);
            return CudaError::OutOfMemory {
                ordinal,
                call,
                asked: 0,
                free,
            }
            .into();
        }
        CudaError::Call {
            ordinal,
            call,
            name,
            code: code as u32,
        }
        .into()
    }

    /// `Ok` for success, the error for `call` otherwise.
    pub(crate) fn check(&self, call: &'static str, code: CUresult) -> Result<(), Error> {
        if code == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.fail(call, code))
        }
    }

    /// Copies `src` to device memory at `addr`, landed when this returns.
    /// A synchronous copy from pageable memory returns once the bytes are
    /// staged, before the DMA to the device has ended, and the lanes'
    /// streams (non-blocking) do not wait for the legacy stream it ran
    /// on: so that one waits too, and a kernel queued next reads the new
    /// bytes. The context is current (the caller bound it).
    pub(crate) fn write_sync(&self, addr: u64, src: &[u8]) -> Result<(), Error> {
        // SAFETY: `src` is a live slice; the caller vouches for the range.
        let r = unsafe { sys::cuMemcpyHtoD_v2(addr, src.as_ptr().cast(), src.len()) };
        self.check("cuMemcpyHtoD", r)?;
        // SAFETY: the legacy stream of the current context.
        let r = unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) };
        self.check("cuStreamSynchronize", r)
    }

    /// The lost context's error, if it is lost.
    pub(crate) fn lost(&self) -> Option<CudaError> {
        lock(&self.lost).clone()
    }

    /// `(major, minor)` compute capability.
    pub(crate) fn capability(&self) -> Result<(i32, i32), Error> {
        self.ctx
            .compute_capability()
            .map_err(|e| self.fail("cuDeviceGetAttribute", e.0))
    }
}

/// Free and total device memory of the current context.
pub(crate) fn mem_info() -> Result<(u64, u64), CUresult> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two valid out-pointers; the context is current (callers).
    let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
    if r == CUresult::CUDA_SUCCESS {
        Ok((free as u64, total as u64))
    } else {
        Err(r)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Page-locked host memory for copies whose host side could not be
/// page-locked in place: a chunk grown on demand, handed out front to
/// back, reused once its lane has finished.
#[derive(Debug, Default)]
struct Bounce {
    chunks: Vec<(Raw<*mut u8>, usize)>,
    /// Chunk in use and bytes used in it.
    at: (usize, usize),
}

const BOUNCE_CHUNK: usize = 64 << 20;

impl Bounce {
    /// `len` bytes of pinned memory, 64-byte aligned, valid until
    /// [`Bounce::reset`].
    fn take(&mut self, gpu: &Gpu, len: usize) -> Result<*mut u8, Error> {
        loop {
            let (i, used) = self.at;
            if let Some(&(ptr, cap)) = self.chunks.get(i) {
                let start = used.next_multiple_of(64);
                if start + len <= cap {
                    self.at = (i, start + len);
                    // SAFETY: start + len ≤ cap, inside the chunk.
                    return Ok(unsafe { ptr.0.add(start) });
                }
                if i + 1 < self.chunks.len() {
                    self.at = (i + 1, 0);
                    continue;
                }
            }
            let cap = len.max(BOUNCE_CHUNK);
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; the context is current.
            gpu.check("cuMemAllocHost", unsafe {
                sys::cuMemAllocHost_v2(&mut p, cap)
            })?;
            self.chunks.push((Raw(p.cast()), cap));
            self.at = (self.chunks.len() - 1, 0);
        }
    }

    fn reset(&mut self) {
        self.at = (0, 0);
    }

    fn free(&mut self) {
        for (p, _) in self.chunks.drain(..) {
            // SAFETY: allocated by cuMemAllocHost and freed once.
            let _ = unsafe { sys::cuMemFreeHost(p.0.cast()) };
        }
    }
}

/// One lane's streams and what only it uses.
#[derive(Debug)]
pub(crate) struct LaneState {
    /// Where its launches go.
    normal: Raw<sys::CUstream>,
    /// Where its launch goes when it is the most urgent in flight: a
    /// stream of the device's greatest priority, whose blocks the GPU
    /// schedules ahead of the others'.
    urgent: Raw<sys::CUstream>,
    /// The one of the two the current launch uses.
    pub(crate) stream: Raw<sys::CUstream>,
    bounce: Bounce,
    pub(crate) handles: Handles,
    /// The events of [`Stamp`]'s points, in its order, and which of them
    /// were recorded for the current launch (bit i: point i; cleared when
    /// it begins). A launch with nothing to stage in marks no `Staging`.
    events: [Raw<sys::CUevent>; 3],
    marked: u8,
    /// Whether anything may have been queued on `stream` since its last
    /// synchronize: a `finish` with nothing queued makes no driver call
    /// (a launch on device buffers alone would otherwise wait three times
    /// for one kernel: after it, after the copies out, after the launch).
    queued: bool,
}

/// Whether a launch of `priority` goes on an urgent stream, beside
/// launches of `others` in flight on the other lanes: when it is ranked
/// and none of them ranks higher (the critical path first).
pub(crate) fn urgent(priority: u64, mut others: impl Iterator<Item = u64>) -> bool {
    priority > 0 && others.all(|o| o <= priority)
}

/// A host buffer page-locked in place, kept until no one else holds it.
struct Pinned {
    host: Arc<dyn HostMemory>,
    /// Registered (false: it could not be, and copies bounce).
    registered: bool,
}

/// The CUDA chip's engine.
pub(crate) struct CudaEngine {
    pub(crate) gpu: Arc<Gpu>,
    base: DeviceAddr,
    /// Lanes `0..n` and the copy lane; `lanes[n + 1]` serves `None`.
    lanes: Vec<Mutex<LaneState>>,
    pinned: Mutex<HashMap<usize, Pinned>>,
    /// The priority of each lane's launch in flight (0: none).
    priorities: Vec<AtomicU64>,
    functions: Functions,
    /// Bytes copied through pinned staging buffers.
    bounced: AtomicU64,
    /// Shared blocks by device address ([`super::vmm`]).
    shared: Mutex<HashMap<DeviceAddr, super::vmm::Vmm>>,
}

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine")
            .field("ordinal", &self.gpu.ordinal)
            .field("base", &format_args!("{:#x}", self.base))
            .field("lanes", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

impl CudaEngine {
    /// Allocates `mem` bytes on `gpu` and a stream for each of `lanes`
    /// lanes plus the copy lane and the synchronous one.
    pub(crate) fn new(gpu: Arc<Gpu>, mem: u64, lanes: usize) -> Result<CudaEngine, Error> {
        gpu.bind()?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut base, mem as usize) };
        if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(CudaError::OutOfMemory {
                ordinal: gpu.ordinal,
                call: "cuMemAlloc",
                asked: mem,
                free: mem_info().map_or(0, |(f, _)| f),
            }
            .into());
        }
        gpu.check("cuMemAlloc", r)?;
        let (mut least, mut greatest) = (0i32, 0i32);
        // SAFETY: two valid out-pointers; the context is current.
        let r = unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) };
        gpu.check("cuCtxGetStreamPriorityRange", r)?;
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let mut states: Vec<Mutex<LaneState>> = Vec::with_capacity(lanes + 2);
        let mut made: Vec<sys::CUstream> = Vec::new();
        for _ in 0..lanes + 2 {
            let mut pair = [std::ptr::null_mut(); 2];
            for (s, priority) in pair.iter_mut().zip([least, greatest]) {
                // SAFETY: a valid out-pointer; the context is current.
                let r = unsafe { sys::cuStreamCreateWithPriority(s, flags, priority) };
                if let Err(e) = gpu.check("cuStreamCreateWithPriority", r) {
                    // SAFETY: made above, each destroyed once; the memory
                    // allocated above, freed once.
                    unsafe {
                        for m in made {
                            sys::cuStreamDestroy_v2(m);
                        }
                        sys::cuMemFree_v2(base);
                    }
                    return Err(e);
                }
                made.push(*s);
            }
            let mut events = [Raw(std::ptr::null_mut()); 3];
            for e in &mut events {
                // SAFETY: a valid out-pointer; the context is current.
                let r = unsafe { sys::cuEventCreate(&mut e.0, 0) };
                if let Err(err) = gpu.check("cuEventCreate", r) {
                    // SAFETY: as for the streams above; the events made
                    // so far, each destroyed once.
                    unsafe {
                        for st in &states {
                            for e in &lock(st).events {
                                sys::cuEventDestroy_v2(e.0);
                            }
                        }
                        for e in events.iter().take_while(|e| !e.0.is_null()) {
                            sys::cuEventDestroy_v2(e.0);
                        }
                        for m in made {
                            sys::cuStreamDestroy_v2(m);
                        }
                        sys::cuMemFree_v2(base);
                    }
                    return Err(err);
                }
            }
            states.push(Mutex::new(LaneState {
                normal: Raw(pair[0]),
                urgent: Raw(pair[1]),
                stream: Raw(pair[0]),
                bounce: Bounce::default(),
                handles: Handles::default(),
                events,
                marked: 0,
                queued: false,
            }));
        }
        Ok(CudaEngine {
            functions: Functions::new(Arc::clone(&gpu)),
            gpu,
            base,
            lanes: states,
            pinned: Mutex::new(HashMap::new()),
            priorities: (0..lanes + 2).map(|_| AtomicU64::new(0)).collect(),
            bounced: AtomicU64::new(0),
            shared: Mutex::new(HashMap::new()),
        })
    }

    fn lane(&self, lane: Lane) -> MutexGuard<'_, LaneState> {
        let i = lane
            .unwrap_or(self.lanes.len() - 1)
            .min(self.lanes.len() - 1);
        lock(&self.lanes[i])
    }

    /// Runs `f` with the lane's state and the context current; for the
    /// synchronous lane, waits for what `f` queued.
    fn on<R>(
        &self,
        lane: Lane,
        f: impl FnOnce(&mut LaneState) -> Result<R, Error>,
    ) -> Result<R, Error> {
        self.gpu.bind()?;
        let mut state = self.lane(lane);
        state.queued = true;
        let r = f(&mut state);
        if lane.is_none() {
            let done = self.sync(&mut state);
            return r.and_then(|v| done.map(|()| v));
        }
        r
    }

    fn sync(&self, state: &mut LaneState) -> Result<(), Error> {
        // SAFETY: a stream of this context, current on this thread.
        let r = unsafe { sys::cuStreamSynchronize(state.stream.0) };
        state.bounce.reset();
        state.queued = false;
        self.gpu.check("cuStreamSynchronize", r)
    }

    /// [`CudaEngine::sync`] when anything may be queued.
    fn sync_queued(&self, state: &mut LaneState) -> Result<(), Error> {
        if state.queued {
            return self.sync(state);
        }
        state.bounce.reset();
        Ok(())
    }

    /// Whether `host` is page-locked (registering the memory it is a face
    /// of on first sight), and drops registrations no one else holds. The
    /// context is current (the caller bound it).
    fn page_locked(&self, host: &Arc<dyn HostMemory>) -> bool {
        let mut root = Arc::clone(host);
        while let Some(under) = root.underlying() {
            root = under;
        }
        let key = root.as_ptr() as usize;
        let mut pinned = lock(&self.pinned);
        if let Some(p) = pinned.get(&key) {
            // The table's Arc keeps that mapping mapped, so memory at the
            // same address is that mapping (or a part of it).
            if Arc::ptr_eq(&p.host, &root) || root.len() <= p.host.len() {
                return p.registered;
            }
        }
        sweep(&mut pinned);
        // A larger mapping at the address of a smaller one the table
        // holds (a face of part of it), which someone still holds (after
        // the sweep): a copy may be queued from its registration, which
        // must outlive it, and two registrations may not overlap. This
        // one bounces; once the smaller one is let go, the next sight of
        // this one registers it.
        if pinned.get(&key).is_some_and(|old| old.registered) {
            return false;
        }
        pinned.remove(&key);
        let len = root.len();
        let page = page_size();
        // Only whole mappings are registered: a page-aligned start (a
        // heap allocation shares its pages with others) and at least a
        // page (small ones bounce at no cost).
        let registered = key % page == 0 && len >= page && {
            let flags = if root.writable() {
                0
            } else {
                sys::CU_MEMHOSTREGISTER_READ_ONLY
            };
            // SAFETY: the mapping's whole pages, kept mapped by the Arc
            // held in the table until unregistered.
            let r = unsafe {
                sys::cuMemHostRegister_v2(root.as_ptr().cast(), len.next_multiple_of(page), flags)
            };
            r == CUresult::CUDA_SUCCESS
        };
        pinned.insert(
            key,
            Pinned {
                host: root,
                registered,
            },
        );
        registered
    }

    /// Enqueues the rectangles of a copy between host and device.
    fn rect_copies(
        &self,
        state: &LaneState,
        plan: &[Rect],
        host: *mut u8,
        dev: DeviceAddr,
        to_device: bool,
    ) -> Result<u64, Error> {
        let mut moved = 0;
        for r in plan {
            // SAFETY: every rectangle lies in the view's extent on the host
            // and in the copy on the device (rects).
            let h = unsafe { host.add(r.host as usize) };
            let d = dev + r.dev;
            let code = if r.height == 1 {
                // SAFETY: ranges checked by the caller (the view's extent in
                // a mapping kept alive by the launch, the block live).
                unsafe {
                    if to_device {
                        sys::cuMemcpyHtoDAsync_v2(d, h.cast(), r.width as usize, state.stream.0)
                    } else {
                        sys::cuMemcpyDtoHAsync_v2(h.cast(), d, r.width as usize, state.stream.0)
                    }
                }
            } else {
                let (host_side, dev_side) = (
                    Side::Host(h, r.host_pitch as usize),
                    Side::Device(d, r.dev_pitch as usize),
                );
                let p = if to_device {
                    copy_2d(host_side, dev_side, r)
                } else {
                    copy_2d(dev_side, host_side, r)
                };
                // SAFETY: as above; `p` describes only those ranges.
                unsafe { sys::cuMemcpy2DAsync_v2(&p, state.stream.0) }
            };
            self.gpu.check(
                match (r.height == 1, to_device) {
                    (true, true) => "cuMemcpyHtoDAsync",
                    (true, false) => "cuMemcpyDtoHAsync",
                    (false, _) => "cuMemcpy2DAsync",
                },
                code,
            )?;
            moved += r.bytes();
        }
        Ok(moved)
    }

    /// Unregisters every buffer and frees the memory and streams.
    fn release(&mut self) {
        // A lost context is still made current: what it holds is freed
        // as far as the driver lets.
        if self.gpu.bind_even_lost().is_err() {
            return;
        }
        for l in &self.lanes {
            let mut s = lock(l);
            // SAFETY: our stream; what it ran is waited for before anything
            // it used is freed.
            unsafe { sys::cuStreamSynchronize(s.stream.0) };
            // SAFETY: our stream; as above.
            unsafe { sys::cuStreamSynchronize(s.urgent.0) };
            s.handles.destroy();
            s.bounce.free();
            for e in &s.events {
                // SAFETY: created in `new`, destroyed once, its stream done.
                unsafe { sys::cuEventDestroy_v2(e.0) };
            }
            // SAFETY: created in `new`, each destroyed once.
            unsafe {
                sys::cuStreamDestroy_v2(s.normal.0);
                sys::cuStreamDestroy_v2(s.urgent.0);
            }
        }
        for (_, p) in lock(&self.pinned).drain() {
            if p.registered {
                // SAFETY: registered by us at this address; the Arc kept
                // it mapped until now.
                unsafe { sys::cuMemHostUnregister(p.host.as_ptr().cast()) };
            }
        }
        self.functions.unload();
        for (_, v) in lock(&self.shared).drain() {
            super::vmm::release(&self.gpu, &v);
        }
        // SAFETY: allocated in `new`, freed once, after every stream ended.
        unsafe { sys::cuMemFree_v2(self.base) };
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        self.release();
    }
}

/// Unregisters and lets go of buffers only the table still holds.
fn sweep(pinned: &mut HashMap<usize, Pinned>) {
    pinned.retain(|_, p| {
        if Arc::strong_count(&p.host) > 1 {
            return true;
        }
        if p.registered {
            // SAFETY: registered by us; still mapped (this Arc).
            unsafe { sys::cuMemHostUnregister(p.host.as_ptr().cast()) };
        }
        false
    });
}

/// One side of a 2D copy: host or device memory, and its pitch in bytes.
#[derive(Clone, Copy)]
enum Side {
    Host(*mut u8, usize),
    Device(DeviceAddr, usize),
}

/// The driver's description of copying rectangle `r` (its width and
/// height) from `src` to `dst`.
fn copy_2d(src: Side, dst: Side, r: &Rect) -> sys::CUDA_MEMCPY2D {
    use sys::CUmemorytype::{CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST};
    let (src_type, src_host, src_device, src_pitch) = match src {
        Side::Host(p, pitch) => (CU_MEMORYTYPE_HOST, p.cast_const().cast(), 0, pitch),
        Side::Device(a, pitch) => (CU_MEMORYTYPE_DEVICE, std::ptr::null(), a, pitch),
    };
    let (dst_type, dst_host, dst_device, dst_pitch) = match dst {
        Side::Host(p, pitch) => (CU_MEMORYTYPE_HOST, p.cast(), 0, pitch),
        Side::Device(a, pitch) => (CU_MEMORYTYPE_DEVICE, std::ptr::null_mut(), a, pitch),
    };
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src_type,
        srcHost: src_host,
        srcDevice: src_device,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_device,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: r.width as usize,
        Height: r.height as usize,
    }
}

fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .unwrap_or(4096)
}

impl Engine for CudaEngine {
    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn base(&self) -> DeviceAddr {
        self.base
    }

    fn runs(&self, kernel: &dyn Kernel) -> bool {
        kernel.cuda().is_some()
    }

    fn zero(&self, lane: Lane, addr: DeviceAddr, len: u64, _release: bool) -> Result<(), Error> {
        self.on(lane, |s| {
            // SAFETY: a live block's range (the machinery's), our stream.
            let r = unsafe { sys::cuMemsetD8Async(addr, 0, len as usize, s.stream.0) };
            self.gpu.check("cuMemsetD8Async", r)
        })
    }

    fn write(&self, addr: DeviceAddr, src: &[u8]) -> Result<(), Error> {
        self.gpu.bind()?;
        // The range is a live block's.
        self.gpu.write_sync(addr, src)
    }

    fn read(&self, addr: DeviceAddr, dst: &mut [u8]) -> Result<(), Error> {
        self.gpu.bind()?;
        // SAFETY: as for `write`, the other way.
        let r = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), addr, dst.len()) };
        self.gpu.check("cuMemcpyDtoH", r)
    }

    fn copy_in(
        &self,
        lane: Lane,
        layout: Layout,
        view: &Tensor,
        host: &Arc<dyn HostMemory>,
        dev: DeviceAddr,
    ) -> Result<u64, Error> {
        let at = host_at(host.as_ref(), view)?;
        // Registering needs the context current on this thread.
        self.gpu.bind()?;
        let locked = self.page_locked(host);
        self.on(lane, |s| {
            if locked {
                return self.rect_copies(s, &rects(layout, view), at, dev, true);
            }
            let len = layout.len(view) as usize;
            let b = s.bounce.take(&self.gpu, len)?;
            if !layout.filled_by_copy_in(view) {
                // SAFETY: `b` holds `len` pinned bytes of ours.
                unsafe { std::ptr::write_bytes(b, 0, len) };
            }
            // SAFETY: `at` holds the view's extent, `b` the copy's `len`.
            let n = unsafe { layout.copy_in(view, at, b) };
            // SAFETY: `b` stays allocated and unreused until the lane
            // finishes; the block's range is live.
            let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dev, b.cast(), len, s.stream.0) };
            self.gpu.check("cuMemcpyHtoDAsync", r)?;
            self.bounced.fetch_add(n, Ordering::Relaxed);
            Ok(n)
        })
    }

    fn copy_out(
        &self,
        lane: Lane,
        layout: Layout,
        view: &Tensor,
        dev: DeviceAddr,
        host: &Arc<dyn HostMemory>,
    ) -> Result<u64, Error> {
        if !host.writable() {
            return Err(Error::OutOfRange {
                addr: view.byte_offset(),
                len: view.extent_bytes(),
                what: "a writable host mapping",
            });
        }
        let at = host_at(host.as_ref(), view)?;
        self.gpu.bind()?;
        let locked = self.page_locked(host);
        self.on(lane, |s| {
            if locked {
                return self.rect_copies(s, &rects(layout, view), at, dev, false);
            }
            let len = layout.len(view) as usize;
            let b = s.bounce.take(&self.gpu, len)?;
            // SAFETY: as in copy_in, the other way.
            let r = unsafe { sys::cuMemcpyDtoHAsync_v2(b.cast(), dev, len, s.stream.0) };
            self.gpu.check("cuMemcpyDtoHAsync", r)?;
            // The bytes must be in the staging buffer before they are
            // spread into the view.
            // SAFETY: our stream.
            let r = unsafe { sys::cuStreamSynchronize(s.stream.0) };
            self.gpu.check("cuStreamSynchronize", r)?;
            // SAFETY: `b` holds the copy, `at` the view's writable extent.
            let n = unsafe { layout.copy_out(view, b, at) };
            self.bounced.fetch_add(n, Ordering::Relaxed);
            Ok(n)
        })
    }

    fn copy_on_chip(
        &self,
        lane: Lane,
        layout: Layout,
        view: &Tensor,
        src: DeviceAddr,
        dst: DeviceAddr,
    ) -> Result<u64, Error> {
        self.on(lane, |s| {
            let runs: Vec<Rect> = match layout {
                Layout::Packed => {
                    let len = layout.len(view);
                    vec![Rect {
                        host: 0,
                        dev: 0,
                        width: len,
                        height: 1,
                        host_pitch: len,
                        dev_pitch: len,
                    }]
                }
                Layout::Extent => rects(layout, view),
            };
            let mut moved = 0;
            for r in runs {
                let (from, to) = (src + r.dev, dst + r.dev);
                // One call a rectangle: its rows at the same pitch on both
                // sides.
                let c = if r.height == 1 {
                    // SAFETY: both live blocks of the copy's length.
                    unsafe { sys::cuMemcpyDtoDAsync_v2(to, from, r.width as usize, s.stream.0) }
                } else {
                    let pitch = r.dev_pitch as usize;
                    let p = copy_2d(Side::Device(from, pitch), Side::Device(to, pitch), &r);
                    // SAFETY: both live blocks hold every row of the
                    // rectangle (rects); `p` outlives the call.
                    unsafe { sys::cuMemcpy2DAsync_v2(&p, s.stream.0) }
                };
                self.gpu.check(
                    if r.height == 1 {
                        "cuMemcpyDtoDAsync"
                    } else {
                        "cuMemcpy2DAsync"
                    },
                    c,
                )?;
                moved += r.bytes();
            }
            Ok(moved)
        })
    }

    fn run<'a>(
        &self,
        lane: usize,
        kernel: &dyn Kernel,
        args: &[Placed],
        scalars: &[u64],
        scratch: ScratchFn<'a>,
    ) -> Result<Held<'a>, Error> {
        let name = || kernel.descriptor().qualified_name();
        let Some(body) = kernel.cuda() else {
            return Err(CudaError::NoBody { kernel: name() }.into());
        };
        self.gpu.bind()?;
        // The lane's lock is not held while the body is queued: a library
        // body asks for scratch, whose zeroing queues on this lane (and
        // takes its lock). Only this lane's thread uses its state now.
        let (stream, mut handles) = {
            let mut state = self.lane(Some(lane));
            state.queued = true;
            (state.stream, std::mem::take(&mut state.handles))
        };
        let held = match body {
            crate::kernel::cuda::CudaBody::Source(src) => {
                let chips: Vec<_> = args.iter().map(|a| a.chip).collect();
                self.functions
                    .launch(kernel.descriptor(), src, &chips, scalars, stream)
                    .map(|()| Vec::new())
            }
            crate::kernel::cuda::CudaBody::Library(call) => super::library::call(
                &self.gpu,
                stream,
                &mut handles,
                *call,
                &name(),
                args,
                scalars,
                scratch,
            ),
        };
        let mut state = self.lane(Some(lane));
        state.handles = handles;
        if let Err(e) = held {
            // What was queued before the failure may still use scratch
            // the error drops. The wait also brings up a fault of the
            // context behind a library's failure (cuBLAS answers
            // "execution failed"): the task fails with that, and the chip
            // is lost.
            let _ = self.sync(&mut state);
            return Err(self.gpu.lost().map_or(e, Error::from));
        }
        held
    }

    fn finish(&self, lane: Lane) -> Result<(), Error> {
        self.gpu.bind()?;
        let mut state = self.lane(lane);
        self.sync_queued(&mut state)
    }

    fn begin(&self, lane: usize, priority: u64) {
        let Some(mine) = self.priorities.get(lane) else {
            return;
        };
        mine.store(priority, Ordering::Relaxed);
        let others = (self.priorities.iter().enumerate())
            .filter(|(i, _)| *i != lane)
            .map(|(_, p)| p.load(Ordering::Relaxed));
        let go = urgent(priority, others);
        let mut state = self.lane(Some(lane));
        state.marked = 0;
        // What `queued` speaks of is the stream in use: none is left
        // behind unwaited.
        if state.queued && self.gpu.bind().is_ok() {
            let _ = self.sync(&mut state);
        }
        state.stream = if go { state.urgent } else { state.normal };
    }

    fn end(&self, lane: usize) {
        if let Some(mine) = self.priorities.get(lane) {
            mine.store(0, Ordering::Relaxed);
        }
        let mut state = self.lane(Some(lane));
        if state.queued && self.gpu.bind().is_ok() {
            let _ = self.sync(&mut state);
        }
        state.stream = state.normal;
    }

    fn stamp(&self, lane: usize, point: Stamp) {
        if self.gpu.bind().is_err() {
            return;
        }
        let mut state = self.lane(Some(lane));
        let i = point as usize;
        state.queued = true;
        // SAFETY: our event and the lane's stream, the context current.
        let r = unsafe { sys::cuEventRecord(state.events[i].0, state.stream.0) };
        if r == CUresult::CUDA_SUCCESS {
            state.marked |= 1 << i;
        }
    }

    fn stamped(&self, lane: usize) -> Option<(Duration, Duration)> {
        self.gpu.bind().ok()?;
        let state = self.lane(Some(lane));
        // Nothing staged in (no `Staging` mark): no copy time.
        let staged = match state.marked {
            0b111 => true,
            0b110 => false,
            _ => return None,
        };
        let between = |a: usize, b: usize| {
            let mut ms = 0f32;
            // SAFETY: two recorded events of this context, their stream
            // finished (the caller's `finish`).
            let r = unsafe {
                sys::cuEventElapsedTime_v2(&mut ms, state.events[a].0, state.events[b].0)
            };
            (r == CUresult::CUDA_SUCCESS && ms.is_finite() && ms >= 0.0)
                .then(|| Duration::from_secs_f64(f64::from(ms) / 1e3))
        };
        let copy_in = if staged {
            between(0, 1)?
        } else {
            Duration::ZERO
        };
        Some((copy_in, between(1, 2)?))
    }

    fn released(&self) {
        if self.gpu.bind().is_ok() {
            sweep(&mut lock(&self.pinned));
        }
    }

    fn bounced(&self) -> u64 {
        self.bounced.load(Ordering::Relaxed)
    }

    fn alloc_shared(&self, len: u64) -> Result<(DeviceAddr, u64), Error> {
        let v = super::vmm::create(&self.gpu, len)?;
        let (addr, size) = (v.addr, v.size as u64);
        lock(&self.shared).insert(addr, v);
        Ok((addr, size))
    }

    fn place(&self) -> crate::shared::Place {
        crate::shared::Place::Cuda(self.gpu.ordinal)
    }

    fn import_shared(
        &self,
        memory: &crate::shared::SharedMemory,
    ) -> Result<(DeviceAddr, u64), Error> {
        if memory.place != self.place() {
            return Err(Error::Shared {
                reason: format!(
                    "GPU {} maps memory of its own, not {}",
                    self.gpu.ordinal, memory.place
                ),
            });
        }
        let v = super::vmm::import_into(&self.gpu, &memory.fd, memory.len)?;
        let (addr, size) = (v.addr, v.size as u64);
        lock(&self.shared).insert(addr, v);
        Ok((addr, size))
    }

    fn free_shared(&self, addr: DeviceAddr) -> Result<(), Error> {
        let v = lock(&self.shared)
            .remove(&addr)
            .ok_or(Error::UnknownBlock {
                region: strata_wire::Region::Shared,
                addr,
            })?;
        super::vmm::release(&self.gpu, &v);
        Ok(())
    }

    fn export(&self, addr: DeviceAddr) -> Result<std::os::fd::OwnedFd, Error> {
        let shared = lock(&self.shared);
        let v = shared.get(&addr).ok_or(Error::UnknownBlock {
            region: strata_wire::Region::Shared,
            addr,
        })?;
        super::vmm::export(&self.gpu, v)
    }

    fn lost(&self) -> Option<String> {
        self.gpu.lost().map(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::urgent;

    /// The most urgent launch in flight takes the urgent stream; an
    /// unranked one never does; ties go urgent (the critical path may
    /// have several tasks ready at once).
    #[test]
    fn the_most_urgent_launch_in_flight_goes_first() {
        assert!(urgent(10, [0, 3, 10].into_iter()));
        assert!(!urgent(10, [0, 11].into_iter()));
        assert!(!urgent(0, [0, 0].into_iter()));
        assert!(urgent(1, std::iter::empty()));
    }
}
