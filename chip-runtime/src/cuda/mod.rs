//! The CUDA chip: a GPU driven through the CUDA driver API, with NVRTC for
//! kernel sources and cuBLAS / cuSOLVER for the matrix kernels.
//!
//! Every CUDA library is loaded when first needed, by name, from the
//! loader's path (`libcuda.so.1`, `libnvrtc.so.13`, `libcublas.so.13`,
//! `libcusolver.so.12`): a build of strata runs on machines with no GPU
//! and no CUDA, where opening a `cuda` chip is a typed error
//! ([`crate::CudaError`]) naming what is missing. Each library's
//! presence is asked before its first call (the loader panics on a
//! missing one otherwise).

mod device;
mod engine;
mod kernels;
mod library;
pub mod nvrtc;
mod plan;
pub mod probe;
mod shape;
pub(crate) mod vmm;

pub use device::open;
pub use probe::{Found, GpuFound, Inventory, Library, device_count, inventory, require_library};
