//! The built-in kernels' CUDA bodies: sources under `kernel/cuda/` for
//! the element-by-element kernels, reductions and softmax, and library
//! calls for the matrix kernels.

use std::borrow::Cow;

use crate::kernel::cuda::{CudaBody, CudaSource, Entry, Grid, LibraryCall};

/// `noop`: an empty kernel on one thread (what a launch costs).
pub(super) fn noop() -> CudaBody {
    CudaBody::Source(CudaSource {
        code: Cow::Borrowed(include_str!("../cuda/noop.cu")),
        entry: Entry::One(Cow::Borrowed("noop")),
        grid: Grid::Fixed {
            blocks: [1, 1, 1],
            threads: [1, 1, 1],
            shared: 0,
        },
    })
}

/// A source with one entry per dtype, `name_<dtype>`.
fn per_dtype(name: &'static str, code: &'static str, grid: Grid) -> CudaBody {
    CudaBody::Source(CudaSource {
        code: Cow::Borrowed(code),
        entry: Entry::PerDType(Cow::Borrowed(name)),
        grid,
    })
}

/// `fill`: a thread per element of `out`.
pub(super) fn fill() -> CudaBody {
    per_dtype("fill", include_str!("../cuda/fill.cu"), Grid::Elements(0))
}

/// `copy`: a thread per element of `dst`.
pub(super) fn copy() -> CudaBody {
    per_dtype("copy", include_str!("../cuda/copy.cu"), Grid::Elements(1))
}

/// `add`: a thread per element of `out`.
pub(super) fn add() -> CudaBody {
    per_dtype("add", include_str!("../cuda/add.cu"), Grid::Elements(2))
}

/// `mul`: a thread per element of `out`.
pub(super) fn mul() -> CudaBody {
    per_dtype("mul", include_str!("../cuda/mul.cu"), Grid::Elements(2))
}

/// `axpy`: a thread per element of `y`.
pub(super) fn axpy() -> CudaBody {
    per_dtype("axpy", include_str!("../cuda/axpy.cu"), Grid::Elements(1))
}

/// `transpose`: a thread per element of `out`.
pub(super) fn transpose() -> CudaBody {
    per_dtype(
        "transpose",
        include_str!("../cuda/transpose.cu"),
        Grid::Elements(1),
    )
}

/// `softmax`: a block per row of `x`.
pub(super) fn softmax() -> CudaBody {
    per_dtype("softmax", include_str!("../cuda/softmax.cu"), Grid::Rows(0))
}

/// `reduce_sum`: a block per row of `x`.
pub(super) fn reduce_sum() -> CudaBody {
    per_dtype(
        "reduce_sum",
        include_str!("../cuda/reduce_sum.cu"),
        Grid::Rows(0),
    )
}

/// A matrix kernel's library call.
pub(super) fn library(call: LibraryCall) -> CudaBody {
    CudaBody::Library(call)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every built-in runs on a CUDA chip: the matrix kernels through a
    /// library, the others through a source with an entry per dtype
    /// (the NVRTC and host-build tests check that the source defines
    /// them).
    #[test]
    fn every_builtin_has_a_cuda_body() {
        let mut sources = 0;
        for k in super::super::all() {
            let desc = k.descriptor();
            let library = match desc.name.as_str() {
                "matmul" => Some(LibraryCall::Matmul { accumulate: false }),
                "matmul_acc" => Some(LibraryCall::Matmul { accumulate: true }),
                "gemm" => Some(LibraryCall::Gemm),
                "potrf" => Some(LibraryCall::Potrf),
                "trsm" => Some(LibraryCall::Trsm),
                "syrk" => Some(LibraryCall::Syrk),
                _ => None,
            };
            match (k.cuda(), library) {
                (Some(CudaBody::Library(call)), Some(want)) => assert_eq!(*call, want),
                (Some(CudaBody::Source(s)), None) => {
                    sources += 1;
                    let symbols = s.symbols(desc);
                    if desc.name == "noop" {
                        assert_eq!(symbols, ["noop"]);
                    } else {
                        assert!(
                            symbols
                                .iter()
                                .all(|s| s.starts_with(&format!("{}_", desc.name)))
                        );
                    }
                }
                (body, want) => panic!("{}: body {body:?}, expected {want:?}", desc.name),
            }
        }
        assert_eq!(sources, 9);
    }
}
