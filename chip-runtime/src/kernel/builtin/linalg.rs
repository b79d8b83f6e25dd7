//! Matmul, reductions and softmax.

use half::{bf16, f16};
use strata_wire::Tensor;

use crate::kernel::KernelContext;
use crate::kernel::dense::{self, MatMut, MatRef};
use crate::kernel::element::{ComplexElement, Element, Typed};
use crate::kernel::view::{Geometry, View, ViewMut};
use crate::{if_complex, with_float};

pub(super) fn check_matmul(args: &[Tensor], _: &[u64]) -> Result<(), (usize, String)> {
    let (a, b, c) = (args[0].shape(), args[1].shape(), args[2].shape());
    if b[0] != a[1] {
        return Err((
            1,
            format!(
                "shape {b:?} does not chain with a's {a:?}: needs {} rows",
                a[1]
            ),
        ));
    }
    if c != [a[0], b[1]] {
        return Err((
            2,
            format!(
                "shape {c:?} is not [{}, {}] (rows of a, columns of b)",
                a[0], b[1]
            ),
        ));
    }
    Ok(())
}

pub(super) fn matmul(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    gemm(ctx, 0.0)
}

pub(super) fn matmul_acc(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    gemm(ctx, 1.0)
}

/// `c = a·b + beta·c`, through the crate's SGEMM or DGEMM (the `gemm`
/// crate's complex GEMM for C64 and C128); 16-bit floats are widened
/// into f32 scratch memory first and narrowed back after.
fn gemm(ctx: &mut KernelContext<'_>, beta: f32) -> Result<(), String> {
    if_complex!(ctx.arg(0)?.dtype(), T => {
        let a = ctx.input::<T>(0)?;
        let b = ctx.input::<T>(1)?;
        let mut c = ctx.output::<T>(2)?;
        dense::complex_gemm(&a, &b, &mut c, beta != 0.0)
    });
    match ctx.arg(0)?.dtype() {
        strata_wire::DType::F32 => gemm_in_place::<f32>(ctx, beta),
        strata_wire::DType::F64 => gemm_in_place::<f64>(ctx, beta),
        strata_wire::DType::F16 => gemm_widened::<f16>(ctx, beta),
        strata_wire::DType::BF16 => gemm_widened::<bf16>(ctx, beta),
        other => Err(format!("matmul does not support {other}")),
    }
}

/// `c = a·b + beta·c` on the views themselves.
fn gemm_in_place<T: dense::Real>(ctx: &mut KernelContext<'_>, beta: f32) -> Result<(), String> {
    let a = ctx.input::<T>(0)?;
    let b = ctx.input::<T>(1)?;
    let mut c = ctx.output::<T>(2)?;
    dense::gemm(
        MatRef::of(&a, "a")?,
        MatRef::of(&b, "b")?,
        &mut MatMut::of(&mut c, "c")?,
        T::ONE,
        T::from_f64(f64::from(beta)),
    );
    Ok(())
}

fn gemm_widened<T: Element>(ctx: &mut KernelContext<'_>, beta: f32) -> Result<(), String> {
    let a = ctx.input::<T>(0)?;
    let b = ctx.input::<T>(1)?;
    let mut c = ctx.output::<T>(2)?;
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let mut scratch = ctx.scratch(4 * (m * k + k * n + m * n))?;
    let buf = scratch.as_mut_slice::<f32>();
    let (wa, rest) = buf.split_at_mut(m * k);
    let (wb, wc) = rest.split_at_mut(k * n);
    widen(&a, wa);
    widen(&b, wb);
    let read_c = beta != 0.0;
    if read_c {
        c.geometry()
            .for_each_index(|idx| wc[idx[0] * n + idx[1]] = c.get(idx).to_f64() as f32);
    }
    {
        let va = contiguous(wa, m, k);
        let vb = contiguous(wb, k, n);
        let mut vc = contiguous_mut(wc, m, n);
        dense::gemm(
            MatRef::of(&va, "a")?,
            MatRef::of(&vb, "b")?,
            &mut MatMut::of(&mut vc, "c")?,
            1.0,
            beta,
        );
    }
    let g = *c.geometry();
    g.for_each_index(|idx| c.set(idx, T::from_f64(f64::from(wc[idx[0] * n + idx[1]]))));
    Ok(())
}

fn widen<T: Element>(v: &View<'_, T>, out: &mut [f32]) {
    let cols = v.shape()[1];
    v.geometry()
        .for_each_index(|idx| out[idx[0] * cols + idx[1]] = v.get(idx).to_f64() as f32);
}

fn contiguous(s: &[f32], rows: usize, cols: usize) -> View<'_, f32> {
    let g = row_major(rows, cols);
    assert!(s.len() >= rows * cols);
    // SAFETY: `s` holds rows·cols initialized f32s laid out row-major, and
    // the view borrows it for its lifetime.
    unsafe { View::new(s.as_ptr(), g) }
}

fn contiguous_mut(s: &mut [f32], rows: usize, cols: usize) -> ViewMut<'_, f32> {
    let g = row_major(rows, cols);
    assert!(s.len() >= rows * cols);
    // SAFETY: as `contiguous`, with exclusive access through `&mut`.
    unsafe { ViewMut::new(s.as_mut_ptr(), g) }
}

fn row_major(rows: usize, cols: usize) -> Geometry {
    let r = u32::try_from(rows).unwrap_or(u32::MAX);
    let c = u32::try_from(cols).unwrap_or(u32::MAX);
    Geometry::new(&[r, c], &[c, 1])
}

pub(super) fn check_reduce(args: &[Tensor], _: &[u64]) -> Result<(), (usize, String)> {
    let (x, out) = (args[0].shape(), args[1].shape());
    let want: Vec<u32> = if x.len() == 1 {
        vec![1]
    } else {
        x[..x.len() - 1].to_vec()
    };
    if out != want.as_slice() {
        return Err((
            1,
            format!("shape {out:?} is not {want:?} (x's shape without its last axis)"),
        ));
    }
    Ok(())
}

pub(super) fn reduce_sum(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    if_complex!(ctx.arg(0)?.dtype(), T => {
        sum_last_axis::<T, _>(ctx, num_complex::Complex::new(0.0, 0.0), |s, v| s + v.widen(), T::narrow)
    });
    with_float!(ctx.arg(0)?.dtype(), T => sum_last_axis::<T, _>(ctx, 0.0, |s, v| s + v.to_f64(), T::from_f64))
}

/// `out[..] = done(Σ x[.., j])` over x's last axis, accumulated from
/// `zero` by `add` in a wider type.
fn sum_last_axis<T: Typed, A: Copy>(
    ctx: &mut KernelContext<'_>,
    zero: A,
    add: impl Fn(A, T) -> A,
    done: impl Fn(A) -> T,
) -> Result<(), String> {
    let x = ctx.input::<T>(0)?;
    let mut out = ctx.output::<T>(1)?;
    let n = x.geometry().ndims();
    let lane = x.shape()[n - 1];
    let mut idx = [0usize; 5];
    let g = *out.geometry();
    g.for_each_index(|o| {
        if n > 1 {
            idx[..n - 1].copy_from_slice(o);
        }
        let mut sum = zero;
        for j in 0..lane {
            idx[n - 1] = j;
            sum = add(sum, x.get(&idx[..n]));
        }
        out.set(o, done(sum));
    });
    Ok(())
}

pub(super) fn softmax(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    with_float!(ctx.arg(0)?.dtype(), T => {
        let x = ctx.input::<T>(0)?;
        let mut out = ctx.output::<T>(1)?;
        let n = x.geometry().ndims();
        let lane = x.shape()[n - 1];
        // Iterate over lanes: every index of x with the last axis at 0.
        let mut outer = *x.geometry();
        outer.collapse_last();
        let mut idx = [0usize; 5];
        outer.for_each_index(|o| {
            idx[..n].copy_from_slice(o);
            let mut max = f64::NEG_INFINITY;
            for j in 0..lane {
                idx[n - 1] = j;
                max = max.max(x.get(&idx[..n]).to_f64());
            }
            let mut sum = 0.0f64;
            for j in 0..lane {
                idx[n - 1] = j;
                sum += (x.get(&idx[..n]).to_f64() - max).exp();
            }
            for j in 0..lane {
                idx[n - 1] = j;
                let v = (x.get(&idx[..n]).to_f64() - max).exp() / sum;
                out.set(&idx[..n], T::from_f64(v));
            }
        });
        Ok(())
    })
}

pub(super) fn check_transpose(args: &[Tensor], _: &[u64]) -> Result<(), (usize, String)> {
    let (x, out) = (args[0].shape(), args[1].shape());
    let n = x.len();
    let mut want = x.to_vec();
    want.swap(n - 2, n - 1);
    if out != want.as_slice() {
        return Err((
            1,
            format!("shape {out:?} is not {want:?} (x's shape with the last two axes swapped)"),
        ));
    }
    Ok(())
}
