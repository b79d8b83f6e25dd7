//! The simulated chip: device memory is one anonymous mapping of this
//! process, kernels run their CPU bodies on the lane's thread.

use std::panic::{AssertUnwindSafe, catch_unwind};

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use strata_wire::{AddressSpace, Region, Tensor};

use crate::Error;
use crate::chip::engine::{Engine, Held, Lane, Placed, ScratchFn, host_at};
use crate::chip::{Chip, ChipConfig};
use crate::device::DeviceAddr;
use crate::kernel::{Kernel, KernelContext, Materialized, Scratch};
use crate::memory::{DEVICE_BASE, DeviceMemory, HostMemory};
use crate::shared::{Place, SharedMemory, check_host_fd};
use crate::spec::DeviceSpec;
use crate::staging::Layout;

/// The simulated chip (see [`Chip`] for how a launch runs).
pub type SimDevice = Chip;

impl Chip {
    /// A simulated chip built from a spec string such as
    /// `sim:mem=2GiB,lanes=2`.
    ///
    /// # Errors
    /// [`Error::Spec`] for a bad spec, [`Error::Map`] when the memory
    /// cannot be mapped.
    pub fn from_spec(spec: &str) -> Result<Self, Error> {
        Chip::new(spec.parse()?)
    }

    /// A simulated chip built from a parsed spec.
    ///
    /// # Errors
    /// [`Error::Map`] when the memory or the lane threads cannot be set up.
    pub fn new(spec: DeviceSpec) -> Result<Self, Error> {
        let memory = DeviceMemory::new(spec.mem)?;
        let label = spec.to_string();
        let engine = SimEngine {
            memory,
            shared: Mutex::new(BTreeMap::new()),
            next_shared: AtomicU64::new(SHARED_BASE),
        };
        Chip::build(ChipConfig { spec, label }, Box::new(engine))
    }
}

/// The simulated chip's engine.
#[derive(Debug)]
pub(crate) struct SimEngine {
    memory: DeviceMemory,
    /// Shared blocks by device address: each a memfd of its own, mapped.
    shared: Mutex<BTreeMap<DeviceAddr, SharedBlock>>,
    /// The device address of the next shared block (never reused).
    next_shared: AtomicU64,
}

/// Where shared blocks' device addresses start: past any arena
/// ([`DEVICE_BASE`] plus at most 2^40 bytes).
const SHARED_BASE: DeviceAddr = DEVICE_BASE + (1 << 40);

/// A shared block of the simulated chip: a memfd sealed against shrinking
/// and growing, mapped shared.
#[derive(Debug)]
struct SharedBlock {
    file: std::fs::File,
    map: memmap2::MmapMut,
}

impl SimEngine {
    /// Gives a mapped shared block its device address.
    fn adopt(&self, file: std::fs::File, map: memmap2::MmapMut) -> DeviceAddr {
        // 64 KiB apart, whatever the length: a neighbour's address is
        // never inside another block.
        let span = (map.len() as u64).next_multiple_of(1 << 16) + (1 << 16);
        let addr = self.next_shared.fetch_add(span, Ordering::Relaxed);
        lock(&self.shared).insert(addr, SharedBlock { file, map });
        addr
    }

    /// The host pointer of `[addr, addr + len)`: in the arena or in one
    /// shared block.
    fn ptr(&self, addr: DeviceAddr, len: u64) -> Result<*mut u8, Error> {
        if addr < SHARED_BASE {
            return self.memory.ptr(addr, len);
        }
        let shared = lock(&self.shared);
        let out = || Error::OutOfRange {
            addr,
            len,
            what: "the simulated chip's shared blocks",
        };
        let (&base, block) = shared.range(..=addr).next_back().ok_or_else(out)?;
        let off = addr - base;
        if off
            .checked_add(len)
            .is_none_or(|end| end > block.map.len() as u64)
        {
            return Err(out());
        }
        // SAFETY: off + len lies inside the mapping (checked above).
        Ok(unsafe { block.map.as_ptr().cast_mut().add(off as usize) })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Engine for SimEngine {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn base(&self) -> DeviceAddr {
        DEVICE_BASE
    }

    fn runs(&self, kernel: &dyn Kernel) -> bool {
        kernel.cpu()
    }

    fn zero(&self, _lane: Lane, addr: DeviceAddr, len: u64, release: bool) -> Result<(), Error> {
        if addr < SHARED_BASE {
            return self.memory.zero(addr, len, release);
        }
        let p = self.ptr(addr, len)?;
        // SAFETY: `p` covers `len` bytes of a live shared block.
        unsafe { std::ptr::write_bytes(p, 0, len as usize) };
        Ok(())
    }

    fn write(&self, addr: DeviceAddr, src: &[u8]) -> Result<(), Error> {
        if addr < SHARED_BASE {
            return self.memory.write(addr, src);
        }
        let p = self.ptr(addr, src.len() as u64)?;
        // SAFETY: `p` covers src.len() bytes of a live shared block, which
        // no host slice overlaps.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        Ok(())
    }

    fn read(&self, addr: DeviceAddr, dst: &mut [u8]) -> Result<(), Error> {
        if addr < SHARED_BASE {
            return self.memory.read(addr, dst);
        }
        let p = self.ptr(addr, dst.len() as u64)?;
        // SAFETY: as for `write`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn alloc_shared(&self, len: u64) -> Result<(DeviceAddr, u64), Error> {
        let fail = |step: &str, e: &dyn std::fmt::Display| Error::Map {
            bytes: len,
            reason: format!("a shared block: {step}: {e}"),
        };
        let n = usize::try_from(len).map_err(|e| fail("length", &e))?;
        let mfd = memfd::MemfdOptions::default()
            .close_on_exec(true)
            .allow_sealing(true)
            .create("strata-shared-device")
            .map_err(|e| fail("memfd_create", &e))?;
        mfd.as_file()
            .set_len(len)
            .map_err(|e| fail("ftruncate", &e))?;
        mfd.add_seals(&[memfd::FileSeal::SealShrink, memfd::FileSeal::SealGrow])
            .map_err(|e| fail("sealing", &e))?;
        let file = mfd.into_file();
        // SAFETY: a memfd of ours sealed against shrinking: its pages stay.
        let map = unsafe { memmap2::MmapOptions::new().len(n).map_mut(&file) }
            .map_err(|e| fail("mmap", &e))?;
        Ok((self.adopt(file, map), len))
    }

    fn import_shared(&self, memory: &SharedMemory) -> Result<(DeviceAddr, u64), Error> {
        if memory.place != Place::Host {
            return Err(Error::Shared {
                reason: format!("a simulated chip maps host memory, not {}", memory.place),
            });
        }
        check_host_fd(&memory.fd, memory.len)?;
        let len = memory.len;
        let fail = |step: &str, e: &dyn std::fmt::Display| Error::Shared {
            reason: format!("mapping another chip's shared block of {len} bytes: {step}: {e}"),
        };
        let n = usize::try_from(len).map_err(|e| fail("length", &e))?;
        let file = std::fs::File::from(memory.fd.try_clone().map_err(|e| fail("dup", &e))?);
        // SAFETY: checked above: on tmpfs, sealed against shrinking and at
        // least `len` bytes long, so every page of the mapping stays
        // backed. Its other holders write it too, ordered by their users.
        let map = unsafe { memmap2::MmapOptions::new().len(n).map_mut(&file) }
            .map_err(|e| fail("mmap", &e))?;
        Ok((self.adopt(file, map), len))
    }

    fn free_shared(&self, addr: DeviceAddr) -> Result<(), Error> {
        lock(&self.shared)
            .remove(&addr)
            .map(drop)
            .ok_or(Error::UnknownBlock {
                region: Region::Shared,
                addr,
            })
    }

    fn export(&self, addr: DeviceAddr) -> Result<OwnedFd, Error> {
        let shared = lock(&self.shared);
        let block = shared.get(&addr).ok_or(Error::UnknownBlock {
            region: Region::Shared,
            addr,
        })?;
        block
            .file
            .try_clone()
            .map(OwnedFd::from)
            .map_err(|e| Error::Shared {
                reason: format!("dup of a shared block's memfd: {e}"),
            })
    }

    fn copy_in(
        &self,
        _lane: Lane,
        layout: Layout,
        view: &Tensor,
        host: &Arc<dyn HostMemory>,
        dev: DeviceAddr,
    ) -> Result<u64, Error> {
        let dev = self.ptr(dev, layout.len(view))?;
        let host = host_at(host.as_ref(), view)?;
        // SAFETY: `host` holds the view's extent (host_at), `dev` the
        // copy's `len` bytes (ptr); device memory never overlaps a host
        // mapping.
        Ok(unsafe { layout.copy_in(view, host, dev) })
    }

    fn copy_out(
        &self,
        _lane: Lane,
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
        let dev = self.ptr(dev, layout.len(view))?;
        let host = host_at(host.as_ref(), view)?;
        // SAFETY: as for copy_in, the other way; the mapping is writable.
        Ok(unsafe { layout.copy_out(view, dev, host) })
    }

    fn copy_on_chip(
        &self,
        _lane: Lane,
        layout: Layout,
        view: &Tensor,
        src: DeviceAddr,
        dst: DeviceAddr,
    ) -> Result<u64, Error> {
        let len = layout.len(view);
        let (src, dst) = (self.ptr(src, len)?, self.ptr(dst, len)?);
        // SAFETY: both are live blocks of at least `len` bytes, and the
        // arena never hands out overlapping blocks.
        Ok(unsafe { layout.copy_on_chip(view, src, dst) })
    }

    fn run<'a>(
        &self,
        _lane: usize,
        kernel: &dyn Kernel,
        args: &[Placed],
        scalars: &[u64],
        scratch: ScratchFn<'a>,
    ) -> Result<Held<'a>, Error> {
        let mut materialized = Vec::with_capacity(args.len());
        for a in args {
            let base = if a.chip.address_space() == AddressSpace::Host {
                a.base as *mut u8
            } else {
                self.ptr(a.base, a.len)?
            };
            // SAFETY: `base` is element 0 of the view, whose extent the
            // machinery checked against its backing; the backing outlives
            // the run (the launch holds it).
            materialized.push(unsafe { Materialized::new(a.chip, a.access, base) });
        }
        let memory = &self.memory;
        let scratch = |nbytes: usize| -> Result<Scratch<'_>, String> {
            let (addr, release) = scratch(nbytes as u64).map_err(|e| e.to_string())?;
            let ptr = match memory.ptr(addr, nbytes as u64) {
                Ok(p) => p,
                Err(e) => {
                    release();
                    return Err(e.to_string());
                }
            };
            // SAFETY: a fresh scratch block is exclusively this kernel's
            // until `release` frees it, 64-byte aligned, and `ptr` covers
            // nbytes.
            Ok(unsafe { Scratch::new(ptr, nbytes, release) })
        };
        let mut ctx = KernelContext::new(&materialized, scalars, &scratch);
        let name = || kernel.descriptor().qualified_name();
        match catch_unwind(AssertUnwindSafe(|| kernel.run(&mut ctx))) {
            Ok(Ok(())) => Ok(Vec::new()),
            Ok(Err(reason)) => Err(Error::KernelFailed {
                kernel: name(),
                reason,
            }),
            Err(payload) => {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                Err(Error::KernelPanicked {
                    kernel: name(),
                    message,
                })
            }
        }
    }

    fn finish(&self, _lane: Lane) -> Result<(), Error> {
        Ok(())
    }
}
