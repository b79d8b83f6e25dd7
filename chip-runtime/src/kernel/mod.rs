//! Kernels: what a callable is (name, version, argument signature), its
//! handle, the context it runs in, and the registry of built-ins.
//!
//! A kernel's identity is its [`Signature`] (from `strata-boundary`, the
//! vocabulary every process shares), written as a canonical string, for
//! example
//! `add@1(a:R:F32|F64|F16|BF16|I8|I16|I32|I64|U8|U16|U32|U64:*,b:R:=0:=0,out:W:=0:=0;)`
//! (argument `name:access:dtypes:rank`, then `;` and the scalars `name:kind`);
//! its [`KernelHandle`] is the first 16 bytes of that string's SHA-256, so
//! two processes that agree on the signature agree on the handle, and a
//! change of signature is a change of handle.

mod context;
pub mod cuda;
pub mod element;
mod registry;
mod validate;
pub mod view;

#[cfg(target_arch = "x86_64")]
mod blocked;
pub mod builtin;
pub(crate) mod dense;

use strata_wire::Tensor;

pub use context::{KernelContext, Materialized};
pub use element::{Bits128, ComplexElement, Element, Pod, Typed};
pub use registry::Registry;
pub(crate) use validate::validate_launch;

/// Checks a launch of `kernel` on these arguments and scalars exactly as a
/// device does before running it (argument count, dtypes, ranks, tags,
/// grants, scalar count, the kernel's own shape rules, written arguments
/// sharing bytes), without running anything: for tools that check a job
/// before starting it.
///
/// # Errors
/// The device's refusal, naming the argument.
pub fn check_launch(
    kernel: &dyn Kernel,
    args: &[(strata_wire::Tensor, strata_wire::ArgTag)],
    scalars: &[u64],
) -> Result<(), crate::Error> {
    validate_launch(kernel, args, scalars)
}
pub use strata_wire::KernelHandle;
pub use view::{Geometry, Scratch, View, ViewMut};

pub use strata_boundary::signature::check_name;
pub use strata_boundary::{ArgSpec, DTypes, Rank, ScalarKind, ScalarSpec, Signature};

/// A callable that runs on a chip.
///
/// Implement it to add kernels to a worker binary: describe the signature in
/// [`Kernel::descriptor`], add shape rules in [`Kernel::check`], and compute
/// in [`Kernel::run`] through the typed views of the [`KernelContext`].
pub trait Kernel: Send + Sync + 'static {
    /// Name, version and signature.
    fn descriptor(&self) -> &Signature;

    /// Rules beyond the signature (shapes that must agree, and so on),
    /// checked before anything runs. On failure, the index of the argument
    /// at fault and why.
    ///
    /// # Errors
    /// `(argument index, reason)`.
    fn check(&self, _args: &[Tensor], _scalars: &[u64]) -> Result<(), (usize, String)> {
        Ok(())
    }

    /// Does the work. Panics are caught by the device and reported as a
    /// task failure.
    ///
    /// # Errors
    /// A message, reported as the task's failure cause.
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String>;

    /// The floating-point operations a run on these arguments costs, if the
    /// kernel can say: a chip in timing mode (`sim:timing=on`) takes that
    /// many flops at its modelled rate instead of running it. `None`: it
    /// takes the time of moving the bytes its arguments span.
    fn flops(&self, _args: &[Tensor]) -> Option<u64> {
        None
    }

    /// Whether it has a CPU body ([`Kernel::run`]): what CPU chips (the
    /// simulated one) run. `false` for a kernel with only a CUDA body.
    fn cpu(&self) -> bool {
        true
    }

    /// Its body for a CUDA chip ([`cuda`]), if it has one: a kernel
    /// without one runs on CPU chips only, and a CUDA worker does not
    /// offer it.
    fn cuda(&self) -> Option<&cuda::CudaBody> {
        None
    }
}
