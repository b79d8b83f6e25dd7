//! The tiled-factorization kernels: `potrf`, `trsm`, `syrk` and `gemm` on
//! F32 and F64 strided views (a transpose is a view with swapped strides).

use strata_wire::{DType, Tensor};

use crate::kernel::KernelContext;
use crate::kernel::dense::{self, MatMut, MatRef, Packed, Real};

/// Runs `$body` with `$T` bound to f32 or f64.
macro_rules! with_real {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            other => Err(format!("dtype {other} is not F32 or F64")),
        }
    };
}

fn square(args: &[Tensor], i: usize, name: &str) -> Result<usize, (usize, String)> {
    let s = args[i].shape();
    if s[0] == s[1] {
        Ok(s[0] as usize)
    } else {
        Err((i, format!("{name} has shape {s:?}, which is not square")))
    }
}

pub(super) fn check_potrf(args: &[Tensor], _: &[u64]) -> Result<(), (usize, String)> {
    square(args, 0, "a").map(|_| ())
}

pub(super) fn check_trsm(args: &[Tensor], _: &[u64]) -> Result<(), (usize, String)> {
    let n = square(args, 0, "l")?;
    let b = args[1].shape();
    if b[1] as usize == n {
        Ok(())
    } else {
        Err((
            1,
            format!("b has shape {b:?}: needs {n} columns (the order of l)"),
        ))
    }
}

pub(super) fn check_syrk(args: &[Tensor], _: &[u64]) -> Result<(), (usize, String)> {
    let m = square(args, 1, "c")?;
    let a = args[0].shape();
    if a[0] as usize == m {
        Ok(())
    } else {
        Err((
            0,
            format!("a has shape {a:?}: needs {m} rows (the order of c)"),
        ))
    }
}

pub(super) fn potrf(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    with_real!(ctx.arg(0)?.dtype(), T => {
        let mut a = ctx.output::<T>(0)?;
        dense::potrf(MatMut::of(&mut a, "a")?).map_err(|(j, d)| {
            format!(
                "a is not positive definite: its leading minor of order {} is not positive \
                 (pivot {})",
                j + 1,
                crate::kernel::Element::to_f64(d)
            )
        })
    })
}

pub(super) fn trsm(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    with_real!(ctx.arg(0)?.dtype(), T => {
        let l = ctx.input::<T>(0)?;
        let mut b = ctx.output::<T>(1)?;
        packed(MatRef::of(&l, "l")?, MatMut::of(&mut b, "b")?, dense::trsm)
            .map_err(|(j, _)| format!("l is singular: l[{j}, {j}] is zero"))
    })
}

pub(super) fn syrk(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    with_real!(ctx.arg(0)?.dtype(), T => {
        let a = ctx.input::<T>(0)?;
        let mut c = ctx.output::<T>(1)?;
        packed(MatRef::of(&a, "a")?, MatMut::of(&mut c, "c")?, dense::syrk);
        Ok(())
    })
}

pub(super) fn gemm(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    let (alpha, beta) = (ctx.scalar_f64(0)?, ctx.scalar_f64(1)?);
    with_real!(ctx.arg(0)?.dtype(), T => {
        let a = ctx.input::<T>(0)?;
        let b = ctx.input::<T>(1)?;
        let mut c = ctx.output::<T>(2)?;
        gemm_as::<T>(&a, &b, &mut c, alpha, beta)
    })
}

fn gemm_as<T: Real>(
    a: &crate::kernel::view::View<'_, T>,
    b: &crate::kernel::view::View<'_, T>,
    c: &mut crate::kernel::view::ViewMut<'_, T>,
    alpha: f64,
    beta: f64,
) -> Result<(), String> {
    dense::gemm(
        MatRef::of(a, "a")?,
        MatRef::of(b, "b")?,
        &mut MatMut::of(c, "c")?,
        T::from_f64(alpha),
        T::from_f64(beta),
    );
    Ok(())
}

/// Runs `f` on `a` and `c`, each packed first when its lines are spread
/// (see [`Packed`]) and GEMM does not pack them itself; a packed `c` is
/// copied back whatever `f` returns, as the kernel would have left it in
/// place.
fn packed<T: Real, R>(
    a: MatRef<'_, T>,
    mut c: MatMut<'_, T>,
    f: impl FnOnce(MatRef<'_, T>, MatMut<'_, T>) -> R,
) -> R {
    if dense::blocked_gemm_here() {
        return f(a, c);
    }
    let pa = Packed::of(a);
    let a = pa.as_ref().map_or(a, Packed::as_ref);
    match Packed::of(c.rb()) {
        Some(mut pc) => {
            let r = f(a, pc.as_mut());
            pc.unpack(&mut c);
            r
        }
        None => f(a, c),
    }
}
