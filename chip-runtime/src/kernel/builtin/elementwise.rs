//! Element-by-element kernels: fill, copy, add, mul, axpy, transpose.

use crate::kernel::KernelContext;
use crate::kernel::element::{ComplexElement, Element, Typed};
use crate::{if_complex, with_bits, with_float, with_numeric};

/// A `fill` value an integer dtype cannot hold is refused before the
/// launch, on every kind of chip (a GPU kernel cannot fail with a
/// message): the value as given and the range.
pub(super) fn check_fill(
    args: &[strata_wire::Tensor],
    scalars: &[u64],
) -> Result<(), (usize, String)> {
    let (Some(out), Some(&value)) = (args.first(), scalars.first()) else {
        return Ok(());
    };
    let dtype = out.dtype();
    if matches!(dtype, strata_wire::DType::C64 | strata_wire::DType::C128) {
        return Ok(());
    }
    let misfit: Result<(), String> = with_numeric!(dtype, T => {
        match T::scalar_misfit(value) {
            Some((given, range)) => Err(format!(
                "value {given} does not fit out's dtype {} ({range})",
                T::DTYPE.name()
            )),
            None => Ok(()),
        }
    });
    misfit.map_err(|why| (0, why))
}

pub(super) fn fill(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    let value = ctx.scalar(0)?;
    // A complex view is filled with a real value (f64 bits), its
    // imaginary part 0: a scalar is one 64-bit word.
    if_complex!(ctx.arg(0)?.dtype(), T => {
        let mut out = ctx.output::<T>(0)?;
        let v = T::real(f64::from_bits(value));
        let g = *out.geometry();
        g.for_each_index(|idx| out.set(idx, v));
        Ok(())
    });
    with_numeric!(ctx.arg(0)?.dtype(), T => {
        if let Some((given, range)) = T::scalar_misfit(value) {
            return Err(format!(
                "value {given} does not fit out's dtype {} ({range})",
                T::DTYPE.name()
            ));
        }
        let mut out = ctx.output::<T>(0)?;
        let v = T::from_scalar(value);
        let g = *out.geometry();
        g.for_each_index(|idx| out.set(idx, v));
        Ok(())
    })
}

pub(super) fn copy(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    with_bits!(ctx.arg(0)?.dtype(), T => {
        let src = ctx.input_raw::<T>(0)?;
        let mut dst = ctx.output_raw::<T>(1)?;
        src.geometry().for_each_index(|idx| dst.set(idx, src.get(idx)));
        Ok(())
    })
}

pub(super) fn add(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    if_complex!(ctx.arg(0)?.dtype(), T => binary::<T>(ctx, |a, b| a + b));
    with_numeric!(ctx.arg(0)?.dtype(), T => binary::<T>(ctx, T::add))
}

pub(super) fn mul(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    if_complex!(ctx.arg(0)?.dtype(), T => binary::<T>(ctx, |a, b| a * b));
    with_numeric!(ctx.arg(0)?.dtype(), T => binary::<T>(ctx, T::mul))
}

fn binary<T: Typed>(ctx: &mut KernelContext<'_>, op: fn(T, T) -> T) -> Result<(), String> {
    let a = ctx.input::<T>(0)?;
    let b = ctx.input::<T>(1)?;
    let mut out = ctx.output::<T>(2)?;
    a.geometry()
        .for_each_index(|idx| out.set(idx, op(a.get(idx), b.get(idx))));
    Ok(())
}

pub(super) fn axpy(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    let alpha = ctx.scalar_f64(0)?;
    // α is real for complex views too.
    if_complex!(ctx.arg(0)?.dtype(), T => {
        let x = ctx.input::<T>(0)?;
        let mut y = ctx.output::<T>(1)?;
        x.geometry()
            .for_each_index(|idx| y.set(idx, x.get(idx).scale(alpha) + y.get(idx)));
        Ok(())
    });
    with_float!(ctx.arg(0)?.dtype(), T => {
        let x = ctx.input::<T>(0)?;
        let mut y = ctx.output::<T>(1)?;
        x.geometry().for_each_index(|idx| {
            let v = alpha * x.get(idx).to_f64() + y.get(idx).to_f64();
            y.set(idx, T::from_f64(v));
        });
        Ok(())
    })
}

pub(super) fn transpose(ctx: &mut KernelContext<'_>) -> Result<(), String> {
    with_bits!(ctx.arg(0)?.dtype(), T => {
        let x = ctx.input_raw::<T>(0)?;
        let mut out = ctx.output_raw::<T>(1)?;
        let n = x.geometry().ndims();
        let mut to = [0usize; 5];
        x.geometry().for_each_index(|idx| {
            to[..n].copy_from_slice(idx);
            to.swap(n - 2, n - 1);
            out.set(&to[..n], x.get(idx));
        });
        Ok(())
    })
}
