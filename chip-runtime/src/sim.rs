//! The simulated chip: device memory is one anonymous mapping of this
//! process, kernels run their CPU bodies on the lane's thread.

use std::panic::{AssertUnwindSafe, catch_unwind};

use std::sync::Arc;

use strata_wire::{AddressSpace, Tensor};

use crate::Error;
use crate::chip::engine::{Engine, Held, Lane, Placed, ScratchFn, host_at};
use crate::chip::{Chip, ChipConfig};
use crate::device::DeviceAddr;
use crate::kernel::{Kernel, KernelContext, Materialized, Scratch};
use crate::memory::{DEVICE_BASE, DeviceMemory, HostMemory};
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
        Chip::build(ChipConfig { spec, label }, Box::new(SimEngine { memory }))
    }
}

/// The simulated chip's engine.
#[derive(Debug)]
pub(crate) struct SimEngine {
    memory: DeviceMemory,
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
        self.memory.zero(addr, len, release)
    }

    fn write(&self, addr: DeviceAddr, src: &[u8]) -> Result<(), Error> {
        self.memory.write(addr, src)
    }

    fn read(&self, addr: DeviceAddr, dst: &mut [u8]) -> Result<(), Error> {
        self.memory.read(addr, dst)
    }

    fn copy_in(
        &self,
        _lane: Lane,
        layout: Layout,
        view: &Tensor,
        host: &Arc<dyn HostMemory>,
        dev: DeviceAddr,
    ) -> Result<u64, Error> {
        let dev = self.memory.ptr(dev, layout.len(view))?;
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
        let dev = self.memory.ptr(dev, layout.len(view))?;
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
        let (src, dst) = (self.memory.ptr(src, len)?, self.memory.ptr(dst, len)?);
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
                self.memory.ptr(a.base, a.len)?
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
