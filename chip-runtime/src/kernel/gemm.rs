//! Safe wrapper over `matrixmultiply`'s strided SGEMM, for the matmul
//! kernels. The only `unsafe` in kernel code lives here.

use super::view::{View, ViewMut};

/// `c = alpha·a·b + beta·c` for rank-2 f32 views `a: [m, k]`, `b: [k, n]`,
/// `c: [m, n]` with any strides. With `beta == 0`, `c` is not read.
///
/// # Panics
/// When the shapes do not chain (the kernels check them before running).
pub(crate) fn sgemm(
    a: &View<'_, f32>,
    b: &View<'_, f32>,
    c: &mut ViewMut<'_, f32>,
    alpha: f32,
    beta: f32,
) {
    let (pa, ga) = a.raw();
    let (pb, gb) = b.raw();
    let (m, k) = (ga.shape()[0], ga.shape()[1]);
    let n = gb.shape()[1];
    assert_eq!(gb.shape()[0], k, "inner dimensions differ");
    let gc = *c.geometry();
    assert_eq!(gc.shape(), &[m, n], "output shape");
    let (pc, _) = c.raw();
    let (sa, sb, sc) = (ga.strides(), gb.strides(), gc.strides());
    // SAFETY: each view's pointer and strides address exactly its elements
    // for indices inside its shape (View/ViewMut contract), the shapes chain
    // as asserted above, and `c` does not alias `a` or `b` (launch
    // validation refuses written arguments that share bytes with others;
    // scratch blocks are distinct). Strides are positive and fit isize.
    unsafe {
        matrixmultiply::sgemm(
            m, k, n, alpha, pa, sa[0], sa[1], pb, sb[0], sb[1], beta, pc, sc[0], sc[1],
        );
    }
}
