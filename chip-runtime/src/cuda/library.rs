//! The matrix kernels' CUDA bodies: cuBLAS and cuSOLVER calls on the
//! lane's stream.
//!
//! The libraries are column-major and strata's views row-major: a view
//! whose rows are contiguous is, to the library, its transpose; one whose
//! columns are contiguous is itself ([`super::shape::ColMajor`]). A view
//! with neither is refused, naming it.

use std::ffi::c_void;

use cudarc::cublas::sys as blas;
use cudarc::cusolver::sys as solver;
use cudarc::driver::sys;
use strata_wire::{ChipTensor, DType};

use super::engine::{Gpu, Raw};
use super::probe::{Library, require_library};
use super::shape::{ColMajor, GemmCall, gemm_call, gemm_on};
use crate::Error;
use crate::chip::engine::{Held, Placed, ScratchFn};
use crate::error::CudaError;
use crate::kernel::cuda::LibraryCall;

/// A lane's library handles, made on first use, bound to its stream.
#[derive(Debug, Default)]
pub(crate) struct Handles {
    /// cuBLAS's handle and the stream it is bound to.
    blas: Option<(Raw<blas::cublasHandle_t>, Raw<sys::CUstream>)>,
    /// cuSOLVER's handle and the stream it is bound to.
    solver: Option<(Raw<solver::cusolverDnHandle_t>, Raw<sys::CUstream>)>,
}

impl Handles {
    fn blas(&mut self, gpu: &Gpu, stream: sys::CUstream) -> Result<blas::cublasHandle_t, Error> {
        if let Some((h, bound)) = &mut self.blas {
            if bound.0 != stream {
                // SAFETY: our handle, a stream of this context (the lane
                // moved between its normal and urgent streams).
                blas_ok(gpu, "cublasSetStream", unsafe {
                    blas::cublasSetStream_v2(h.0, stream.cast())
                })?;
                *bound = Raw(stream);
            }
            return Ok(h.0);
        }
        require_library(Library::Cublas)?;
        let mut h: blas::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current.
        blas_ok(gpu, "cublasCreate", unsafe {
            blas::cublasCreate_v2(&mut h)
        })?;
        // SAFETY: a handle just made, a stream of this context.
        blas_ok(gpu, "cublasSetStream", unsafe {
            blas::cublasSetStream_v2(h, stream.cast())
        })?;
        self.blas = Some((Raw(h), Raw(stream)));
        Ok(h)
    }

    fn solver(
        &mut self,
        gpu: &Gpu,
        stream: sys::CUstream,
    ) -> Result<solver::cusolverDnHandle_t, Error> {
        if let Some((h, bound)) = &mut self.solver {
            if bound.0 != stream {
                // SAFETY: as for cuBLAS's.
                solver_ok(gpu, "cusolverDnSetStream", unsafe {
                    solver::cusolverDnSetStream(h.0, stream.cast())
                })?;
                *bound = Raw(stream);
            }
            return Ok(h.0);
        }
        require_library(Library::Cusolver)?;
        let mut h: solver::cusolverDnHandle_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current.
        solver_ok(gpu, "cusolverDnCreate", unsafe {
            solver::cusolverDnCreate(&mut h)
        })?;
        // SAFETY: a handle just made, a stream of this context.
        solver_ok(gpu, "cusolverDnSetStream", unsafe {
            solver::cusolverDnSetStream(h, stream.cast())
        })?;
        self.solver = Some((Raw(h), Raw(stream)));
        Ok(h)
    }

    /// Destroys the handles (the context is current, the stream idle).
    pub(crate) fn destroy(&mut self) {
        if let Some((h, _)) = self.blas.take() {
            // SAFETY: made by us, destroyed once.
            unsafe { blas::cublasDestroy_v2(h.0) };
        }
        if let Some((h, _)) = self.solver.take() {
            // SAFETY: made by us, destroyed once.
            unsafe { solver::cusolverDnDestroy(h.0) };
        }
    }
}

fn blas_ok(gpu: &Gpu, call: &'static str, s: blas::cublasStatus_t) -> Result<(), Error> {
    let ok = s == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
    status(gpu, call, ok, || (format!("{s:?}"), s as u32))
}

fn solver_ok(gpu: &Gpu, call: &'static str, s: solver::cusolverStatus_t) -> Result<(), Error> {
    let ok = s == solver::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS;
    status(gpu, call, ok, || (format!("{s:?}"), s as u32))
}

/// A library call's status: an execution failure may be the context's,
/// reported as that when it is.
fn status(
    gpu: &Gpu,
    call: &'static str,
    ok: bool,
    what: impl FnOnce() -> (String, u32),
) -> Result<(), Error> {
    if ok {
        return Ok(());
    }
    Err(gpu
        .lost()
        .unwrap_or_else(|| {
            let (name, code) = what();
            CudaError::Call {
                ordinal: gpu.ordinal,
                call,
                name,
                code,
            }
        })
        .into())
}

fn op(t: bool) -> blas::cublasOperation_t {
    if t {
        blas::cublasOperation_t::CUBLAS_OP_T
    } else {
        blas::cublasOperation_t::CUBLAS_OP_N
    }
}

fn int(v: u32, kernel: &str) -> Result<i32, Error> {
    i32::try_from(v).map_err(|_| Error::KernelFailed {
        kernel: kernel.into(),
        reason: format!("a dimension of {v} is more than cuBLAS takes (2^31 − 1)"),
    })
}

fn layout(t: &ChipTensor, name: &str, kernel: &str) -> Result<ColMajor, Error> {
    ColMajor::of(t).ok_or_else(|| Error::KernelFailed {
        kernel: kernel.into(),
        reason: format!(
            "{name} (shape {:?}, strides {:?}) has no axis of unit stride: the CUDA body takes matrices whose rows or columns are contiguous",
            t.shape(),
            t.strides()
        ),
    })
}

/// Runs `call` on `args` on the lane's stream.
#[allow(clippy::too_many_arguments)]
pub(crate) fn call<'a>(
    gpu: &Gpu,
    stream: Raw<sys::CUstream>,
    handles: &mut Handles,
    call: LibraryCall,
    kernel: &str,
    args: &[Placed],
    scalars: &[u64],
    scratch: ScratchFn<'a>,
) -> Result<Held<'a>, Error> {
    let stream = stream.0;
    let scalar = |i: usize| scalars.get(i).map_or(0.0, |b| f64::from_bits(*b));
    match call {
        LibraryCall::Matmul { accumulate } => {
            let g = gemm_call(&args[0].chip, &args[1].chip, &args[2].chip).map_err(|reason| {
                Error::KernelFailed {
                    kernel: kernel.into(),
                    reason,
                }
            })?;
            let beta = if accumulate { 1.0 } else { 0.0 };
            let h = handles.blas(gpu, stream)?;
            gemm(gpu, h, kernel, &g, args, 1.0, beta)?;
            Ok(Vec::new())
        }
        LibraryCall::Gemm => {
            let g = gemm_call(&args[0].chip, &args[1].chip, &args[2].chip).map_err(|reason| {
                Error::KernelFailed {
                    kernel: kernel.into(),
                    reason,
                }
            })?;
            let h = handles.blas(gpu, stream)?;
            gemm(gpu, h, kernel, &g, args, scalar(0), scalar(1))?;
            Ok(Vec::new())
        }
        LibraryCall::Syrk => {
            // c ← c − a·aᵀ on all of c (as the CPU body): one GEMM with
            // aᵀ read from a's memory.
            let (a, c) = (&args[0], &args[1]);
            let la = layout(&a.chip, "a", kernel)?;
            let lc = layout(&c.chip, "c", kernel)?;
            let (m, k) = (a.chip.shape()[0], a.chip.shape()[1]);
            let g = gemm_on(m, m, k, la, la.t(), lc);
            let three = [*a, *a, *c];
            let h = handles.blas(gpu, stream)?;
            gemm(gpu, h, kernel, &g, &three, -1.0, 1.0)?;
            Ok(Vec::new())
        }
        LibraryCall::Trsm => {
            let (l, b) = (&args[0], &args[1]);
            let ll = layout(&l.chip, "l", kernel)?;
            let lb = layout(&b.chip, "b", kernel)?;
            let (m, n) = (b.chip.shape()[0], b.chip.shape()[1]);
            use blas::cublasFillMode_t::{CUBLAS_FILL_MODE_LOWER, CUBLAS_FILL_MODE_UPPER};
            use blas::cublasSideMode_t::{CUBLAS_SIDE_LEFT, CUBLAS_SIDE_RIGHT};
            // Lᵀ stored (rows contiguous) is upper triangular to the library.
            let uplo = if ll.transposed {
                CUBLAS_FILL_MODE_UPPER
            } else {
                CUBLAS_FILL_MODE_LOWER
            };
            let (side, trans, rows, cols) = if lb.transposed {
                // bᵀ ← l⁻¹·bᵀ: op(stored) = l.
                (CUBLAS_SIDE_LEFT, ll.transposed, n, m)
            } else {
                // b ← b·l⁻ᵀ: op(stored) = lᵀ.
                (CUBLAS_SIDE_RIGHT, !ll.transposed, m, n)
            };
            let h = handles.blas(gpu, stream)?;
            let diag = blas::cublasDiagType_t::CUBLAS_DIAG_NON_UNIT;
            let (rows, cols) = (int(rows, kernel)?, int(cols, kernel)?);
            let (lda, ldb) = (int(ll.ld, kernel)?, int(lb.ld, kernel)?);
            // SAFETY: device pointers of live blocks holding the views, on
            // the handle's stream; sizes from the checked shapes.
            let s = unsafe {
                match l.chip.dtype() {
                    DType::F32 => blas::cublasStrsm_v2(
                        h,
                        side,
                        uplo,
                        op(trans),
                        diag,
                        rows,
                        cols,
                        &1f32,
                        l.base as *const f32,
                        lda,
                        b.base as *mut f32,
                        ldb,
                    ),
                    DType::F64 => blas::cublasDtrsm_v2(
                        h,
                        side,
                        uplo,
                        op(trans),
                        diag,
                        rows,
                        cols,
                        &1f64,
                        l.base as *const f64,
                        lda,
                        b.base as *mut f64,
                        ldb,
                    ),
                    other => return Err(dtype(kernel, other)),
                }
            };
            blas_ok(gpu, "cublasTrsm", s)?;
            Ok(Vec::new())
        }
        LibraryCall::Potrf => potrf(gpu, stream, handles, kernel, &args[0], scratch),
    }
}

fn dtype(kernel: &str, d: DType) -> Error {
    Error::KernelFailed {
        kernel: kernel.into(),
        reason: format!("its CUDA body does not compute on {d}"),
    }
}

/// One GEMM: `c = α·a·b + β·c` as `g` lays it out (`args` = a, b, c).
fn gemm(
    gpu: &Gpu,
    h: blas::cublasHandle_t,
    kernel: &str,
    g: &GemmCall,
    args: &[Placed],
    alpha: f64,
    beta: f64,
) -> Result<(), Error> {
    let (first, second) = (&args[g.first], &args[1 - g.first]);
    let c = &args[2];
    let (m, n, k) = (
        int(g.mnk.0, kernel)?,
        int(g.mnk.1, kernel)?,
        int(g.mnk.2, kernel)?,
    );
    let (lda, ldb, ldc) = (
        int(g.first_ld, kernel)?,
        int(g.second_ld, kernel)?,
        int(g.c_ld, kernel)?,
    );
    let (ta, tb) = (op(g.first_t), op(g.second_t));
    let (pa, pb, pc) = (first.base, second.base, c.base);
    // SAFETY: in every arm, device pointers of live blocks holding the
    // views, sized by the checked shapes and these leading dimensions; the
    // scalars live across the call (host pointer mode).
    let s = unsafe {
        match c.chip.dtype() {
            DType::F32 => blas::cublasSgemm_v2(
                h,
                ta,
                tb,
                m,
                n,
                k,
                &(alpha as f32),
                pa as *const f32,
                lda,
                pb as *const f32,
                ldb,
                &(beta as f32),
                pc as *mut f32,
                ldc,
            ),
            DType::F64 => blas::cublasDgemm_v2(
                h,
                ta,
                tb,
                m,
                n,
                k,
                &alpha,
                pa as *const f64,
                lda,
                pb as *const f64,
                ldb,
                &beta,
                pc as *mut f64,
                ldc,
            ),
            DType::C64 => {
                let (al, be) = (
                    blas::cuComplex {
                        x: alpha as f32,
                        y: 0.0,
                    },
                    blas::cuComplex {
                        x: beta as f32,
                        y: 0.0,
                    },
                );
                blas::cublasCgemm_v2(
                    h,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    &al,
                    pa as *const blas::cuComplex,
                    lda,
                    pb as *const blas::cuComplex,
                    ldb,
                    &be,
                    pc as *mut blas::cuComplex,
                    ldc,
                )
            }
            DType::C128 => {
                let (al, be) = (
                    blas::cuDoubleComplex { x: alpha, y: 0.0 },
                    blas::cuDoubleComplex { x: beta, y: 0.0 },
                );
                blas::cublasZgemm_v2(
                    h,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    &al,
                    pa as *const blas::cuDoubleComplex,
                    lda,
                    pb as *const blas::cuDoubleComplex,
                    ldb,
                    &be,
                    pc as *mut blas::cuDoubleComplex,
                    ldc,
                )
            }
            d @ (DType::F16 | DType::BF16) => {
                let t = if d == DType::F16 {
                    blas::cudaDataType_t::CUDA_R_16F
                } else {
                    blas::cudaDataType_t::CUDA_R_16BF
                };
                let (al, be) = (alpha as f32, beta as f32);
                blas::cublasGemmEx(
                    h,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    std::ptr::from_ref(&al).cast::<c_void>(),
                    pa as *const c_void,
                    t,
                    lda,
                    pb as *const c_void,
                    t,
                    ldb,
                    std::ptr::from_ref(&be).cast::<c_void>(),
                    pc as *mut c_void,
                    t,
                    ldc,
                    blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            other => return Err(dtype(kernel, other)),
        }
    };
    blas_ok(gpu, "cublasGemm", s)
}

/// `a ← L` (lower Cholesky factor, the strict upper triangle untouched),
/// cuSOLVER's potrf; a matrix that is not positive definite fails the
/// task, naming the order of the failing minor.
fn potrf<'a>(
    gpu: &Gpu,
    stream: sys::CUstream,
    handles: &mut Handles,
    kernel: &str,
    a: &Placed,
    scratch: ScratchFn<'a>,
) -> Result<Held<'a>, Error> {
    let la = layout(&a.chip, "a", kernel)?;
    let n = int(a.chip.shape()[0], kernel)?;
    let lda = int(la.ld, kernel)?;
    // The stored matrix's upper triangle is a's lower one when a's rows are
    // contiguous (the library sees aᵀ).
    let uplo = if la.transposed {
        solver::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER
    } else {
        solver::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER
    };
    let h = handles.solver(gpu, stream)?;
    let mut lwork = 0i32;
    let elem = u64::from(a.chip.dtype().bits() / 8);
    // SAFETY: a valid handle and out-pointer; the matrix pointer is only
    // used to choose the workspace size.
    let s = unsafe {
        match a.chip.dtype() {
            DType::F32 => {
                solver::cusolverDnSpotrf_bufferSize(h, uplo, n, a.base as *mut f32, lda, &mut lwork)
            }
            DType::F64 => {
                solver::cusolverDnDpotrf_bufferSize(h, uplo, n, a.base as *mut f64, lda, &mut lwork)
            }
            other => return Err(dtype(kernel, other)),
        }
    };
    solver_ok(gpu, "cusolverDnPotrf_bufferSize", s)?;
    let (work, free_work) = scratch(u64::try_from(lwork.max(1)).unwrap_or(1) * elem)?;
    let (info, free_info) = scratch(64)?;
    let held: Held<'a> = vec![free_work, free_info];
    // SAFETY: the workspace and info are fresh scratch blocks of the sizes
    // asked; the matrix is the live view.
    let s = unsafe {
        match a.chip.dtype() {
            DType::F32 => solver::cusolverDnSpotrf(
                h,
                uplo,
                n,
                a.base as *mut f32,
                lda,
                work as *mut f32,
                lwork,
                info as *mut i32,
            ),
            _ => solver::cusolverDnDpotrf(
                h,
                uplo,
                n,
                a.base as *mut f64,
                lda,
                work as *mut f64,
                lwork,
                info as *mut i32,
            ),
        }
    };
    solver_ok(gpu, "cusolverDnPotrf", s)?;
    let mut minor = 0i32;
    // SAFETY: `info` holds the int potrf writes; ordered after it on the
    // stream, and waited for before `minor` is read.
    let r = unsafe {
        sys::cuMemcpyDtoHAsync_v2(std::ptr::from_mut(&mut minor).cast(), info, 4, stream)
    };
    gpu.check("cuMemcpyDtoHAsync", r)?;
    // SAFETY: our stream.
    gpu.check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(stream)
    })?;
    if minor > 0 {
        return Err(Error::KernelFailed {
            kernel: kernel.into(),
            reason: format!(
                "a is not positive definite: its leading minor of order {minor} is not positive"
            ),
        });
    }
    if minor < 0 {
        return Err(Error::KernelFailed {
            kernel: kernel.into(),
            reason: format!("cuSOLVER's potrf refused its parameter {}", -minor),
        });
    }
    Ok(held)
}
