//! A kernel's body for a CUDA chip.
//!
//! A kernel runs on a CUDA chip only if it declares a [`CudaBody`]
//! ([`crate::Kernel::cuda`]); a CUDA worker offers no other kernel, so a
//! task is never placed where its kernel cannot run.
//!
//! A body is CUDA C source, compiled once per worker with NVRTC (cached on
//! disk by the hash of source and options), or a call into cuBLAS or
//! cuSOLVER that the chip makes. Source kernels follow one calling
//! convention, the same for the built-in kernels and for kernels a user
//! registers (as CuPy's `RawKernel` takes source and a name):
//!
//! - the parameters are the task's tensor arguments, in signature order,
//!   each a `strata_tensor` passed by value — the 128-byte
//!   [`strata_wire::ChipTensor`] layout: `addr` is a device address,
//!   element `[i0, .., in]` is at `addr` plus `start_offset + Σ ik·stride_k`
//!   elements — then its scalars, each an `unsigned long long` (the 64-bit
//!   word the task carries: an f64's bits, an integer);
//! - [`CUDA_PRELUDE`] is compiled in front of the source: the struct, the
//!   element types (`strata_f16`, `strata_bf16`, `strata_c64`,
//!   `strata_c128`, with conversions to and from float and double) and
//!   helpers to address elements;
//! - the launch shape is the body's [`Grid`].
//!
//! Sources compile with fused multiply-add off, and the prelude's
//! element arithmetic and conversions are the CPU kernels' (`half`'s
//! rounding, wrapping integers, complex products as `(ac − bd, ad +
//! bc)`), so an element-by-element source writes the same bits as its CPU
//! kernel. The prelude's dtype lists (`STRATA_NUMERIC_DTYPES(X)` and the
//! others) stamp out the entries of an [`Entry::PerDType`] source. The
//! chip runtime's documentation (`docs/chip-runtime.md`, "CUDA bodies")
//! says how to check a source on a machine without a GPU.
//!
//! A kernel's parameters take at most [`MAX_PARAM_BYTES`] (4 KiB: 128
//! bytes a tensor, 8 a scalar), the limit every CUDA device accepts.

use std::borrow::Cow;

use strata_boundary::{DTypes, Signature};
use strata_wire::DType;

use super::{Kernel, KernelContext};

/// Threads per block of the [`Grid::Elements`] and [`Grid::Rows`] launches.
pub const THREADS: u32 = 256;

/// Largest parameter block a CUDA kernel takes.
pub const MAX_PARAM_BYTES: usize = 4096;

/// Bytes a tensor parameter takes (a `strata_tensor`).
pub const TENSOR_PARAM_BYTES: usize = 128;

/// What a kernel runs on a CUDA chip.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaBody {
    /// CUDA C source compiled with NVRTC.
    Source(CudaSource),
    /// A cuBLAS or cuSOLVER call the chip makes.
    Library(LibraryCall),
}

/// CUDA C source and how to launch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaSource {
    /// The source, without the prelude (compiled in front of it).
    pub code: Cow<'static, str>,
    /// The `extern "C" __global__` function to launch.
    pub entry: Entry,
    /// The launch shape.
    pub grid: Grid,
}

impl CudaSource {
    /// Every function a launch of a kernel with signature `desc` may
    /// call, which the compiled source must therefore define: the one
    /// name of [`Entry::One`]; for [`Entry::PerDType`], one per dtype
    /// the first tensor argument accepts (every dtype for
    /// [`DTypes::Any`]; the bare name when there is no tensor argument;
    /// none for dtypes this build does not know).
    pub fn symbols(&self, desc: &Signature) -> Vec<String> {
        let dtypes: Vec<DType> = match desc.args.first().map(|a| &a.dtypes) {
            None => return vec![self.entry.symbol(None)],
            Some(DTypes::OneOf(list)) => list.clone(),
            Some(DTypes::Any) => DType::ALL.to_vec(),
            Some(DTypes::SameAs(_) | DTypes::Unknown(_)) => vec![],
        };
        match &self.entry {
            Entry::One(name) => vec![name.to_string()],
            Entry::PerDType(_) => dtypes
                .into_iter()
                .map(|d| self.entry.symbol(Some(d)))
                .collect(),
        }
    }
}

/// Which function of a source a launch calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// This one, whatever the dtypes.
    One(Cow<'static, str>),
    /// One per dtype: the name, `_`, and the lower-case name of the dtype
    /// of the first tensor argument (`add` → `add_f32`, `add_c128`).
    PerDType(Cow<'static, str>),
}

impl Entry {
    /// The function a launch whose first tensor argument has `dtype`
    /// calls (`dtype` is ignored for [`Entry::One`]).
    pub fn symbol(&self, dtype: Option<DType>) -> String {
        match (self, dtype) {
            (Entry::One(name), _) | (Entry::PerDType(name), None) => name.to_string(),
            (Entry::PerDType(name), Some(d)) => {
                format!("{name}_{}", d.name().to_ascii_lowercase())
            }
        }
    }
}

/// How many blocks and threads a source kernel is launched with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grid {
    /// [`THREADS`] threads a block, enough blocks for one thread per
    /// element of tensor argument `n` (at most 65,535 × 32 blocks: the
    /// kernel loops over the rest with a grid-sized stride). A view with
    /// no element launches nothing.
    Elements(usize),
    /// One block of [`THREADS`] threads per row of tensor argument `n`:
    /// a row is the last axis, the rows every index of the others (one
    /// row for a rank-1 view). The block's threads share the row.
    Rows(usize),
    /// Exactly these blocks and threads (x, y, z), with `shared` bytes of
    /// dynamic shared memory, within what every CUDA GPU launches
    /// ([`Grid::check`]); beyond 48 KiB of shared memory the chip asks the
    /// driver for it, up to what the GPU has.
    Fixed {
        /// Blocks along x, y, z.
        blocks: [u32; 3],
        /// Threads a block along x, y, z.
        threads: [u32; 3],
        /// Dynamic shared memory, bytes.
        shared: u32,
    },
}

/// Most threads of a block, all axes together, on every CUDA GPU.
pub const MAX_BLOCK_THREADS: u32 = 1024;

/// Dynamic shared memory a launch gets without asking: more needs the
/// function's attribute raised first (the chip does).
pub const DEFAULT_SHARED_BYTES: u32 = 48 << 10;

impl Grid {
    /// Whether every CUDA GPU launches this shape: a [`Grid::Fixed`] block
    /// of at most [`MAX_BLOCK_THREADS`] threads (x and y at most 1024, z
    /// at most 64) and a grid of at most 2³¹ − 1 blocks along x and 65,535
    /// along y and z. The other grids are worked out within those.
    ///
    /// # Errors
    /// What exceeds which limit.
    pub fn check(&self) -> Result<(), String> {
        let Grid::Fixed {
            blocks, threads, ..
        } = *self
        else {
            return Ok(());
        };
        let total: u64 = threads.iter().map(|&t| u64::from(t)).product();
        if total > u64::from(MAX_BLOCK_THREADS) {
            return Err(format!(
                "a block of {threads:?} threads is {total}; a CUDA block holds at most {MAX_BLOCK_THREADS}"
            ));
        }
        for (axis, (&n, most)) in ["x", "y", "z"]
            .iter()
            .zip(threads.iter().zip([1024, 1024, 64]))
        {
            if n > most {
                return Err(format!(
                    "{n} threads along {axis}; a CUDA block takes at most {most}"
                ));
            }
        }
        for (axis, (&n, most)) in
            ["x", "y", "z"]
                .iter()
                .zip(blocks.iter().zip([i32::MAX as u32, 65_535, 65_535]))
        {
            if n > most {
                return Err(format!(
                    "{n} blocks along {axis}; a CUDA grid takes at most {most}"
                ));
            }
        }
        Ok(())
    }
}

/// The library calls of the built-in matrix kernels, on column-major
/// libraries given row-major strided views (the chip swaps operands and
/// transposes as a row-major caller of cuBLAS does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LibraryCall {
    /// `matmul` (c = a·b) or, accumulating, `matmul_acc` (c += a·b):
    /// cuBLAS GEMM for every float and complex dtype it computes.
    Matmul {
        /// c += a·b rather than c = a·b.
        accumulate: bool,
    },
    /// `gemm`: c ← α·a·b + β·c (cuBLAS S/DGEMM).
    Gemm,
    /// `potrf`: a ← L, lower Cholesky factor (cuSOLVER S/Dpotrf).
    Potrf,
    /// `trsm`: b ← b·l⁻ᵀ (cuBLAS S/DTRSM).
    Trsm,
    /// `syrk`: c ← c − a·aᵀ, lower triangle (cuBLAS S/DSYRK).
    Syrk,
}

impl LibraryCall {
    /// The library the call needs (what a chip without it names).
    pub fn library(self) -> &'static str {
        match self {
            LibraryCall::Potrf => "cuSOLVER",
            _ => "cuBLAS",
        }
    }
}

/// Compiled in front of every CUDA source: the tensor struct, the
/// element types and the addressing helpers (module docs).
pub const CUDA_PRELUDE: &str = include_str!("cuda/prelude.cuh");

/// A kernel with only a CUDA body, from CUDA C source: how a user adds
/// a GPU kernel to a worker, as CuPy's `RawKernel` takes source and a
/// function name. It follows the calling convention above (its
/// parameters are its signature's tensors, then its scalars); CPU chips
/// do not offer it.
///
/// ```
/// use strata_chip_runtime::kernel::cuda::{Entry, Grid, SourceKernel};
/// use strata_chip_runtime::kernel::Signature;
///
/// let scale = SourceKernel::new(
///     Signature::parse("scale@1(x:RW:F32:*;alpha:f64)")?,
///     r#"extern "C" __global__ void scale(strata_tensor x, unsigned long long alpha) {
///            double a = __longlong_as_double((long long)alpha);
///            strata_u64 n = strata_numel(x);
///            for (strata_u64 i = blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; i < n;
///                 i += (strata_u64)gridDim.x * blockDim.x)
///                *strata_at<float>(x, i) *= (float)a;
///        }"#,
///     Entry::One("scale".into()),
///     Grid::Elements(0),
/// )?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct SourceKernel {
    desc: Signature,
    body: CudaBody,
}

impl SourceKernel {
    /// A kernel of signature `desc` running `entry` of `code`, launched as
    /// `grid` says.
    ///
    /// # Errors
    /// A message naming what is wrong: an empty source or one with a NUL
    /// byte, an entry that is not a C identifier, a grid naming a tensor
    /// argument the signature does not have or beyond a CUDA launch's
    /// limits ([`Grid::check`]), or more parameters than a
    /// CUDA kernel takes ([`MAX_PARAM_BYTES`]). A source that does not
    /// compile fails its first launch on a GPU ([`crate::CudaError::Compile`]).
    pub fn new(
        desc: Signature,
        code: impl Into<String>,
        entry: Entry,
        grid: Grid,
    ) -> Result<SourceKernel, String> {
        let code = code.into();
        let name = desc.qualified_name();
        let bad = |what: String| Err(format!("CUDA kernel {name}: {what}"));
        if code.trim().is_empty() {
            return bad("the source is empty".into());
        }
        if code.contains('\0') {
            return bad("the source has a NUL byte".into());
        }
        let (Entry::One(symbol) | Entry::PerDType(symbol)) = &entry;
        let ident = symbol
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && symbol
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            return bad(format!("entry {symbol:?} is not a C identifier"));
        }
        let tensors = desc.args.len();
        if let Grid::Elements(n) | Grid::Rows(n) = grid
            && n >= tensors
        {
            return bad(format!(
                "the grid follows tensor argument {n}, and the signature has {tensors}"
            ));
        }
        if let Err(why) = grid.check() {
            return bad(format!("grid: {why}"));
        }
        let bytes = tensors * TENSOR_PARAM_BYTES + desc.scalars.len() * 8;
        if bytes > MAX_PARAM_BYTES {
            return bad(format!(
                "{tensors} tensors and {} scalars take {bytes} bytes of parameters; a CUDA kernel takes at most {MAX_PARAM_BYTES}",
                desc.scalars.len()
            ));
        }
        Ok(SourceKernel {
            desc,
            body: CudaBody::Source(CudaSource {
                code: Cow::Owned(code),
                entry,
                grid,
            }),
        })
    }
}

impl Kernel for SourceKernel {
    fn descriptor(&self) -> &Signature {
        &self.desc
    }

    fn run(&self, _ctx: &mut KernelContext<'_>) -> Result<(), String> {
        Err(format!(
            "{} has only a CUDA body: it runs on CUDA chips",
            self.desc.qualified_name()
        ))
    }

    fn cpu(&self) -> bool {
        false
    }

    fn cuda(&self) -> Option<&CudaBody> {
        Some(&self.body)
    }
}

#[cfg(test)]
mod tests {
    use strata_boundary::{ArgSpec, Rank};
    use strata_wire::Access;

    use super::*;

    fn sig(first: Option<DTypes>) -> Signature {
        Signature {
            name: "k".into(),
            version: 1,
            args: first
                .into_iter()
                .map(|d| ArgSpec::new("x", Access::Read, d, Rank::Any))
                .collect(),
            scalars: vec![],
        }
    }

    fn source(entry: Entry) -> CudaSource {
        CudaSource {
            code: "".into(),
            entry,
            grid: Grid::Elements(0),
        }
    }

    #[test]
    fn symbols_follow_the_first_arguments_dtypes() {
        let per = source(Entry::PerDType("k".into()));
        let two = sig(Some(DTypes::OneOf(vec![DType::BF16, DType::Fp8E4M3Fn])));
        assert_eq!(per.symbols(&two), ["k_bf16", "k_fp8e4m3fn"]);
        let any = per.symbols(&sig(Some(DTypes::Any)));
        assert_eq!(any.len(), DType::ALL.len());
        assert!(any.contains(&"k_c128".to_owned()) && any.contains(&"k_fp4e2m1".to_owned()));
        assert_eq!(per.symbols(&sig(None)), ["k"], "no tensor: the bare name");
        assert!(
            per.symbols(&sig(Some(DTypes::Unknown("F8".into()))))
                .is_empty()
        );
        let one = source(Entry::One("main".into()));
        assert_eq!(one.symbols(&two), ["main"]);
        assert_eq!(one.symbols(&sig(None)), ["main"]);
    }
}
