//! `strata-chip`: the chip runtime a worker runs tasks on (docs/chip-runtime.md).
//!
//! - [`Device`]: allocate and free device memory, copy host↔device, launch
//!   kernels on materialized arguments, synchronize, report statistics.
//!   Callers hold a `dyn Device`, so another kind of chip is another
//!   implementation.
//! - [`SimDevice`]: the default device, a simulated discrete accelerator
//!   configured by a spec string (`sim`, `sim:mem=2GiB,mode=staged`,
//!   `sim:mode=unified,lanes=2`; see [`spec`]).
//! - [`arena`]: device-memory bookkeeping in three regions (persistent,
//!   run, scratch), 64-byte aligned, with statistics and out-of-memory
//!   errors that name the region.
//! - [`cache`]: the device cache, copies of host bytes kept on a staged
//!   chip between tasks, at versions the caller names, written back when
//!   dirty.
//! - [`kernel`]: the callable model (name, version, signature, handle), the
//!   typed strided views kernels compute through, the registry and the
//!   built-in kernels.
//!
//! No tokio here: the shared-memory structures (arena pools, the run
//! region's cursor, the lane pool, completion slots) use the crate's `sync`
//! shim and are model-checked with loom.
//!
//! ```
//! use std::sync::Arc;
//! use strata_chip_runtime::{device, ArgBacking, Device, HostBuffer, Launch, LaunchArg, Registry, SimDevice};
//! use strata_wire::{ArgTag, DType, Tensor};
//!
//! let dev = SimDevice::from_spec("sim:mem=16MiB")?;
//! let kernels = Registry::with_builtins();
//! let fill = kernels.get(kernels.find("fill", 1).unwrap())?;
//!
//! let host = Arc::new(HostBuffer::new(64)?);
//! let buf = strata_wire::check::test_buffer(64);
//! let view = Tensor::new(buf, 0, &[4, 4], &[4, 1], DType::F32)?;
//! let arg = LaunchArg { tensor: view, tag: ArgTag::Output, backing: ArgBacking::Host(host.clone()), cache: None };
//! let report = device::launch(&dev, Launch { kernel: fill, args: vec![arg], scalars: vec![2.5f64.to_bits()], gate: None, priority: 0 })?.wait()?;
//! assert_eq!(report.staged_out, 64);
//! assert_eq!(host.read(0, 4)?, 2.5f32.to_le_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod arena;
pub mod cache;
mod chip;
pub mod cuda;
pub mod device;
mod error;
pub mod kernel;
mod mapping;
pub mod memory;
pub mod shared;
mod sim;
pub mod spec;
pub mod staging;
mod sync;

#[doc(hidden)]
pub use half;
/// The complex element types (`Complex<f32>` for C64, `Complex<f64>`
/// for C128), re-exported so that views of them are read and written
/// with the crate kernels use.
pub use num_complex;

pub use arena::Region;
pub use cache::{CacheStats, CacheUse, CopyKey};
pub use chip::Chip;
pub use device::{
    ArgBacking, CachedCopy, Device, DeviceBlock, DeviceInfo, DeviceStats, Launch, LaunchArg,
    LaunchReport, StartGate,
};
pub use error::{CudaError, Error};
pub use kernel::{Kernel, KernelContext, KernelHandle, Registry, Signature};
pub use memory::{HostBuffer, HostBytes, HostMemory};
pub use sim::SimDevice;

/// Opens the chip `spec` names (`sim...` or `cuda:N...`): what a worker
/// runs its tasks on.
///
/// # Errors
/// [`Error::Spec`] for a bad spec (and for `cuda:all`, which names many
/// chips); the chip's own errors when it cannot be opened (for CUDA, a
/// [`CudaError`] naming what is missing).
pub fn open(spec: &str) -> Result<std::sync::Arc<dyn Device>, Error> {
    Ok(match spec.parse::<ChipSpec>()? {
        ChipSpec::Sim(s) => std::sync::Arc::new(SimDevice::new(s)?),
        ChipSpec::Cuda(s) => cuda::open(&s)?,
    })
}
pub use spec::{ChipSpec, CudaOrdinal, CudaSpec, DeviceSpec, Mode};
