//! The built-in kernels, all on arbitrary strided views (transposed,
//! stepped, offset):
//!
//! | name | arguments | scalars | dtypes |
//! |---|---|---|---|
//! | `noop` | | | (does nothing: for measuring dispatch) |
//! | `fill` | out W | value (in out's dtype; real for complex dtypes) | numeric, complex |
//! | `copy` | src R, dst W (same shape) | | any byte-sized |
//! | `add`, `mul` | a R, b R, out W (same shape) | | numeric, complex |
//! | `axpy` | x R, y RW (same shape): y = αx + y | α (f64, real) | F32, F64, F16, BF16, C64, C128 |
//! | `matmul` | a R `[m,k]`, b R `[k,n]`, c W `[m,n]`: c = a·b | | F32, F64, F16, BF16, C64, C128 |
//! | `matmul_acc` | a R, b R, c RW: c += a·b | | F32, F64, F16, BF16, C64, C128 |
//! | `reduce_sum` | x R `[.., n]`, out W `[..]` (or `[1]` for rank 1): sum over the last axis | | F32, F64, F16, BF16, C64, C128 |
//! | `softmax` | x R, out W (same shape): along the last axis | | F32, F64, F16, BF16 |
//! | `transpose` | x R `[.., a, b]`, out W `[.., b, a]`: swaps the last two axes | | any byte-sized |
//! | `potrf` | a RW `[n,n]`: a ← L, the lower Cholesky factor (strict upper triangle untouched) | | F32, F64 |
//! | `trsm` | l R `[n,n]`, b RW `[m,n]`: b ← b·l⁻ᵀ, l lower triangular | | F32, F64 |
//! | `syrk` | a R `[m,k]`, c RW `[m,m]`: c ← c − a·aᵀ | | F32, F64 |
//! | `gemm` | a R `[m,k]`, b R `[k,n]`, c RW `[m,n]`: c ← α·a·b + β·c (c not read when β = 0) | α, β (f64) | F32, F64 |
//!
//! The last four are a right-looking tiled Cholesky's tile calls. Integer
//! arithmetic wraps. Matrix products go through the `gemm` crate (strided,
//! single-threaded: a chip's worker owns one core); F16/BF16 matmuls
//! convert to f32 in scratch memory first. `potrf`, `trsm` and `syrk`
//! recurse in halves down to 32×32 blocks so that nearly every flop is a
//! GEMM. Reductions and softmax accumulate in f64 (complex sums in two
//! f64s). Complex dtypes (C64, C128) are numpy's layout, the real part
//! first; a scalar being one 64-bit word, `fill` takes a real value for
//! them (imaginary part 0) and `axpy` a real α.
//!
//! Each also runs on a CUDA chip (`cuda.rs`): the matrix kernels as
//! cuBLAS / cuSOLVER calls, the others as CUDA sources under
//! `kernel/cuda/` that write the same bits as the kernels here (the
//! reductions and softmax: to an ulp or so, summing in another order).

mod blas;
mod cuda;
mod elementwise;
mod linalg;

use std::sync::Arc;

use strata_wire::{Access, DType, Tensor};

use super::cuda::{CudaBody, LibraryCall};
use super::element::{COMPLEX_DTYPES, FLOAT_DTYPES, NUMERIC_DTYPES, byte_dtypes};
use super::{ArgSpec, DTypes, Kernel, KernelContext, Rank, ScalarKind, ScalarSpec, Signature};

type CheckFn = fn(&[Tensor], &[u64]) -> Result<(), (usize, String)>;
type RunFn = fn(&mut KernelContext<'_>) -> Result<(), String>;
type CostFn = fn(&[Tensor]) -> u64;

/// A built-in kernel: a descriptor, two functions, for the matrix
/// kernels a flop count, and its body for a CUDA chip.
struct Builtin {
    desc: Signature,
    check: CheckFn,
    run: RunFn,
    cost: Option<CostFn>,
    cuda: Option<CudaBody>,
}

impl Builtin {
    fn with_cuda(mut self, body: CudaBody) -> Self {
        self.cuda = Some(body);
        self
    }
}

impl Kernel for Builtin {
    fn descriptor(&self) -> &Signature {
        &self.desc
    }
    fn check(&self, args: &[Tensor], scalars: &[u64]) -> Result<(), (usize, String)> {
        (self.check)(args, scalars)
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        (self.run)(ctx)
    }
    fn flops(&self, args: &[Tensor]) -> Option<u64> {
        self.cost.map(|c| c(args))
    }
    fn cuda(&self) -> Option<&CudaBody> {
        self.cuda.as_ref()
    }
}

/// Axis `i` of argument `a`.
fn dim(args: &[Tensor], a: usize, i: usize) -> u64 {
    args.get(a)
        .and_then(|t| t.shape().get(i))
        .map_or(0, |&d| u64::from(d))
}

/// The usual flop counts: 2mkn for a product (matmul, gemm), n³/3 for
/// potrf, m·n² for trsm, m²k for syrk.
fn product_flops(a: &[Tensor]) -> u64 {
    2 * dim(a, 0, 0) * dim(a, 0, 1) * dim(a, 1, 1)
}
fn potrf_flops(a: &[Tensor]) -> u64 {
    dim(a, 0, 0).pow(3) / 3
}
fn trsm_flops(a: &[Tensor]) -> u64 {
    dim(a, 1, 0) * dim(a, 1, 1).pow(2)
}
fn syrk_flops(a: &[Tensor]) -> u64 {
    dim(a, 0, 0).pow(2) * dim(a, 0, 1)
}

fn arg(name: &str, access: Access, dtypes: DTypes, rank: Rank) -> ArgSpec {
    ArgSpec::new(name, access, dtypes, rank)
}

fn kernel(
    name: &str,
    args: Vec<ArgSpec>,
    scalars: Vec<ScalarSpec>,
    check: CheckFn,
    run: RunFn,
) -> Builtin {
    costed(name, args, scalars, check, run, None)
}

/// [`kernel`] with a flop count.
fn costed(
    name: &str,
    args: Vec<ArgSpec>,
    scalars: Vec<ScalarSpec>,
    check: CheckFn,
    run: RunFn,
    cost: Option<CostFn>,
) -> Builtin {
    Builtin {
        desc: Signature {
            name: name.to_owned(),
            version: 1,
            args,
            scalars,
        },
        check,
        run,
        cost,
        cuda: None,
    }
}

fn scalar(name: &str, kind: ScalarKind) -> ScalarSpec {
    ScalarSpec {
        name: name.to_owned(),
        kind,
    }
}

fn list(d: &[DType]) -> DTypes {
    DTypes::OneOf(d.to_vec())
}

fn list2(d: &[DType], more: &[DType]) -> DTypes {
    DTypes::OneOf([d, more].concat())
}

/// Every built-in kernel, version 1, each with its CUDA body.
pub fn all() -> Vec<Arc<dyn Kernel>> {
    use Access::{Read as R, ReadWrite as RW, Write as W};
    let same = |i| DTypes::SameAs(i);
    let builtins = vec![
        kernel("noop", vec![], vec![], |_, _| Ok(()), |_| Ok(())).with_cuda(cuda::noop()),
        kernel(
            "fill",
            vec![arg(
                "out",
                W,
                list2(NUMERIC_DTYPES, COMPLEX_DTYPES),
                Rank::Any,
            )],
            vec![scalar("value", ScalarKind::LikeArg(0))],
            elementwise::check_fill,
            elementwise::fill,
        )
        .with_cuda(cuda::fill()),
        kernel(
            "copy",
            vec![
                arg("src", R, DTypes::OneOf(byte_dtypes()), Rank::Any),
                arg("dst", W, same(0), Rank::SameAs(0)),
            ],
            vec![],
            |a, _| same_shape(a, 1, 0),
            elementwise::copy,
        )
        .with_cuda(cuda::copy()),
        binary("add", elementwise::add).with_cuda(cuda::add()),
        binary("mul", elementwise::mul).with_cuda(cuda::mul()),
        kernel(
            "axpy",
            vec![
                arg("x", R, list2(FLOAT_DTYPES, COMPLEX_DTYPES), Rank::Any),
                arg("y", RW, same(0), Rank::SameAs(0)),
            ],
            vec![scalar("alpha", ScalarKind::F64)],
            |a, _| same_shape(a, 1, 0),
            elementwise::axpy,
        )
        .with_cuda(cuda::axpy()),
        costed(
            "matmul",
            vec![
                arg(
                    "a",
                    R,
                    list2(FLOAT_DTYPES, COMPLEX_DTYPES),
                    Rank::Exactly(2),
                ),
                arg("b", R, same(0), Rank::Exactly(2)),
                arg("c", W, same(0), Rank::Exactly(2)),
            ],
            vec![],
            linalg::check_matmul,
            linalg::matmul,
            Some(product_flops),
        )
        .with_cuda(cuda::library(LibraryCall::Matmul { accumulate: false })),
        costed(
            "matmul_acc",
            vec![
                arg(
                    "a",
                    R,
                    list2(FLOAT_DTYPES, COMPLEX_DTYPES),
                    Rank::Exactly(2),
                ),
                arg("b", R, same(0), Rank::Exactly(2)),
                arg("c", RW, same(0), Rank::Exactly(2)),
            ],
            vec![],
            linalg::check_matmul,
            linalg::matmul_acc,
            Some(product_flops),
        )
        .with_cuda(cuda::library(LibraryCall::Matmul { accumulate: true })),
        kernel(
            "reduce_sum",
            vec![
                arg("x", R, list2(FLOAT_DTYPES, COMPLEX_DTYPES), Rank::Any),
                arg("out", W, same(0), Rank::Any),
            ],
            vec![],
            linalg::check_reduce,
            linalg::reduce_sum,
        )
        .with_cuda(cuda::reduce_sum()),
        kernel(
            "softmax",
            vec![
                arg("x", R, list(FLOAT_DTYPES), Rank::Any),
                arg("out", W, same(0), Rank::SameAs(0)),
            ],
            vec![],
            |a, _| same_shape(a, 1, 0),
            linalg::softmax,
        )
        .with_cuda(cuda::softmax()),
        kernel(
            "transpose",
            vec![
                arg("x", R, DTypes::OneOf(byte_dtypes()), Rank::AtLeast(2)),
                arg("out", W, same(0), Rank::SameAs(0)),
            ],
            vec![],
            linalg::check_transpose,
            elementwise::transpose,
        )
        .with_cuda(cuda::transpose()),
        costed(
            "potrf",
            vec![arg("a", RW, list(REAL), Rank::Exactly(2))],
            vec![],
            blas::check_potrf,
            blas::potrf,
            Some(potrf_flops),
        )
        .with_cuda(cuda::library(LibraryCall::Potrf)),
        costed(
            "trsm",
            vec![
                arg("l", R, list(REAL), Rank::Exactly(2)),
                arg("b", RW, same(0), Rank::Exactly(2)),
            ],
            vec![],
            blas::check_trsm,
            blas::trsm,
            Some(trsm_flops),
        )
        .with_cuda(cuda::library(LibraryCall::Trsm)),
        costed(
            "syrk",
            vec![
                arg("a", R, list(REAL), Rank::Exactly(2)),
                arg("c", RW, same(0), Rank::Exactly(2)),
            ],
            vec![],
            blas::check_syrk,
            blas::syrk,
            Some(syrk_flops),
        )
        .with_cuda(cuda::library(LibraryCall::Syrk)),
        costed(
            "gemm",
            vec![
                arg("a", R, list(REAL), Rank::Exactly(2)),
                arg("b", R, same(0), Rank::Exactly(2)),
                arg("c", RW, same(0), Rank::Exactly(2)),
            ],
            vec![
                scalar("alpha", ScalarKind::F64),
                scalar("beta", ScalarKind::F64),
            ],
            linalg::check_matmul,
            blas::gemm,
            Some(product_flops),
        )
        .with_cuda(cuda::library(LibraryCall::Gemm)),
    ];
    builtins
        .into_iter()
        .map(|b| Arc::new(b) as Arc<dyn Kernel>)
        .collect()
}

/// The dtypes of the factorization kernels.
const REAL: &[DType] = &[DType::F32, DType::F64];

/// `out = op(a, b)` element by element, on numeric dtypes of one shape.
fn binary(name: &str, run: RunFn) -> Builtin {
    use Access::{Read as R, Write as W};
    kernel(
        name,
        vec![
            arg("a", R, list2(NUMERIC_DTYPES, COMPLEX_DTYPES), Rank::Any),
            arg("b", R, DTypes::SameAs(0), Rank::SameAs(0)),
            arg("out", W, DTypes::SameAs(0), Rank::SameAs(0)),
        ],
        vec![],
        |a, _| same_shape(a, 1, 0).and(same_shape(a, 2, 0)),
        run,
    )
}

/// Argument `i` must have the shape of argument `j`.
fn same_shape(args: &[Tensor], i: usize, j: usize) -> Result<(), (usize, String)> {
    let (a, b) = (args[i].shape(), args[j].shape());
    if a == b {
        Ok(())
    } else {
        Err((
            i,
            format!("shape {a:?} differs from argument {j}'s shape {b:?}"),
        ))
    }
}
