//! View geometry every layer needs: which bytes of its buffer a view
//! touches, walked as maximal runs, and the packed form in which a view's
//! bytes travel over the network (only the view's own bytes, run after
//! run).
//!
//! It lives here rather than in the chip runtime because the wire's
//! consumers — the gRPC conversions (which bound a peer's packed length),
//! the driver (which packs and lands staged bytes) and the worker — all
//! need it, and none of them should depend on a device to get it.

use std::cmp::Reverse;

use crate::Tensor;

/// `v` as a `usize`, saturating (a count that does not fit in memory makes
/// the caller's slice lookup fail rather than wrap).
fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// The run waiting to be reported: adjacent runs merge, a run inside it
/// (an element repeated by overlapping strides) is dropped.
fn emit(pending: &mut Option<(u64, u64)>, off: u64, len: u64, f: &mut dyn FnMut(usize, usize)) {
    match *pending {
        Some((s, l)) if s.saturating_add(l) == off => *pending = Some((s, l.saturating_add(len))),
        Some((s, l)) if off >= s && off.saturating_add(len) <= s.saturating_add(l) => {}
        Some((s, l)) => {
            f(to_usize(s), to_usize(l));
            *pending = Some((off, len));
        }
        None => *pending = Some((off, len)),
    }
}

/// Calls `f(offset, len)` for runs of bytes that together are exactly the
/// bytes the view touches (offsets from the view's first byte). Axes are
/// walked from the largest stride to the smallest so that runs come in
/// increasing order and adjacent ones merge; a view whose elements repeat
/// (overlapping strides) may report a byte more than once, which is
/// harmless for copies.
pub fn for_each_run(view: &Tensor, mut f: impl FnMut(usize, usize)) {
    if view.is_contiguous() {
        f(0, to_usize(view.extent_bytes()));
        return;
    }
    let mut axes: Vec<(u64, u64)> = view
        .shape()
        .iter()
        .zip(view.strides())
        .map(|(&s, &t)| (u64::from(s), u64::from(t)))
        .collect();
    // Stable, so axes of equal stride keep their order.
    axes.sort_by_key(|&(_, t)| Reverse(t));
    let Some((&(inner_shape, inner_stride), outer)) = axes.split_last() else {
        return;
    };
    let bits = u64::from(view.dtype().bits());
    // Rows along the innermost axis are one run when its stride is 1
    // (whole bytes only); otherwise each element is its own run.
    let (inner_count, inner_run) = if inner_stride == 1 && bits >= 8 {
        (1, inner_shape.saturating_mul(bits) / 8)
    } else {
        (inner_shape, 0)
    };
    // The products below are bounded by the view's extent, which a valid
    // tensor keeps within its buffer's u64 size; saturating keeps the walk
    // total for any input.
    let mut pending: Option<(u64, u64)> = None;
    let mut idx = vec![0u64; outer.len()];
    loop {
        let base = outer.iter().zip(&idx).fold(0u64, |acc, (&(_, t), &i)| {
            acc.saturating_add(i.saturating_mul(t))
        });
        for j in 0..inner_count {
            let elem = base.saturating_add(j.saturating_mul(inner_stride));
            let first_bit = elem.saturating_mul(bits);
            if inner_run > 0 {
                emit(&mut pending, first_bit / 8, inner_run, &mut f);
            } else {
                // Sub-byte elements live in byte ⌊bit / 8⌋.
                let first = first_bit / 8;
                let last = first_bit.saturating_add(bits.saturating_sub(1)) / 8;
                emit(&mut pending, first, last - first + 1, &mut f);
            }
        }
        let mut advanced = false;
        for (i, &(s, _)) in idx.iter_mut().zip(outer).rev() {
            *i += 1;
            if *i < s {
                advanced = true;
                break;
            }
            *i = 0;
        }
        if !advanced {
            if let Some((s, l)) = pending {
                f(to_usize(s), to_usize(l));
            }
            return;
        }
    }
}

/// The element strides of `view` packed: its elements one after another,
/// axes taken by decreasing stride (the order [`for_each_run`] walks, so a
/// packed copy is exactly the view's runs back to back). `None` unless the
/// view's elements are whole bytes and nest without interleaving (each
/// axis's stride at least the span of the axes inside it), which makes
/// every element a distinct byte range and the walk increasing: tiles,
/// rows, columns and their transposes pack; views whose elements overlap
/// or interleave do not.
pub fn packed_strides(view: &Tensor) -> Option<[u32; crate::MAX_DIMS]> {
    if view.dtype().bits() < 8 {
        return None;
    }
    // (shape, stride, axis), axes by decreasing stride (stable).
    let mut axes: Vec<(u64, u64, usize)> = view
        .shape()
        .iter()
        .zip(view.strides())
        .enumerate()
        .map(|(k, (&n, &t))| (u64::from(n), u64::from(t), k))
        .collect();
    axes.sort_by_key(|&(_, t, _)| Reverse(t));
    // Nesting: walking from the innermost axis out, each stride covers
    // the span of those inside it.
    let mut span = 1u64;
    for &(shape, stride, _) in axes.iter().rev() {
        if shape > 1 && stride < span {
            return None;
        }
        if shape > 1 {
            span = stride.checked_mul(shape)?;
        }
    }
    let mut strides = [0u32; crate::MAX_DIMS];
    let mut inner = 1u64;
    for &(shape, _, k) in axes.iter().rev() {
        *strides.get_mut(k)? = u32::try_from(inner).ok()?;
        inner = inner.checked_mul(shape)?;
    }
    Some(strides)
}

/// Bytes in the packed form of a view: the sum of its runs' lengths.
pub fn packed_len(view: &Tensor) -> u64 {
    let mut n = 0u64;
    for_each_run(view, |_, len| n = n.saturating_add(len as u64));
    n
}

/// [`packed_len`] for a view from an untrusted peer: `None` without
/// walking it when it has more than `max_elements` elements (a view with
/// overlapping strides can have 2^64 of them over a few bytes, and the
/// walk visits every one).
pub fn packed_len_bounded(view: &Tensor, max_elements: u64) -> Option<u64> {
    if view.element_count() > max_elements {
        return None;
    }
    Some(packed_len(view))
}

/// Copies the view's bytes out of `extent` (the view's bytes from its
/// first byte, laid out as in the buffer) into a packed string, run after
/// run; `None` when `extent` is shorter than the view's extent.
pub fn pack(view: &Tensor, extent: &[u8]) -> Option<Vec<u8>> {
    if (extent.len() as u64) < view.extent_bytes() {
        return None;
    }
    let mut out = Vec::with_capacity(to_usize(packed_len(view)).min(extent.len()));
    let mut short = false;
    for_each_run(view, |off, len| {
        match off.checked_add(len).and_then(|end| extent.get(off..end)) {
            Some(run) => out.extend_from_slice(run),
            None => short = true,
        }
    });
    (!short).then_some(out)
}

/// Copies a packed string back into `extent` (laid out from the view's
/// first byte). Returns `false`, copying nothing, when `packed` is not
/// exactly [`packed_len`] bytes or `extent` is short.
pub fn unpack(view: &Tensor, packed: &[u8], extent: &mut [u8]) -> bool {
    if packed.len() as u64 != packed_len(view) || (extent.len() as u64) < view.extent_bytes() {
        return false;
    }
    let mut at = 0usize;
    let mut fits = true;
    for_each_run(view, |off, len| {
        let dst = off
            .checked_add(len)
            .and_then(|end| extent.get_mut(off..end));
        let src = at.checked_add(len).and_then(|end| packed.get(at..end));
        match (dst, src) {
            (Some(d), Some(s)) => d.copy_from_slice(s),
            _ => fits = false,
        }
        at = at.saturating_add(len);
    });
    fits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{Rng, ViewClass, byte_set, view_pair};

    /// A view that packs is exactly its runs back to back, element (i₀, …)
    /// at Σ iₖ·packedₖ: the packed copy of a buffer holds each element's
    /// bytes where the packed strides say. Tiles and transposes pack.
    #[test]
    fn packed_strides_place_every_element_where_pack_puts_it() {
        let mut rng = Rng(11);
        let mut packed_views = 0;
        for class in ViewClass::ALL {
            for _ in 0..2000 {
                let (v, _) = view_pair(class, &mut rng);
                let Some(ps) = packed_strides(&v) else {
                    continue;
                };
                packed_views += 1;
                let size = u64::from(v.dtype().bits() / 8);
                let bytes = byte_set(&v).unwrap();
                assert_eq!(
                    bytes.len() as u64,
                    v.element_count() * size,
                    "{v:?}: elements share bytes"
                );
                let extent: Vec<u8> = (0..v.extent_bytes())
                    .map(|i| (i * 31 % 251) as u8)
                    .collect();
                let packed = pack(&v, &extent).unwrap();
                assert_eq!(packed.len() as u64, v.element_count() * size);
                let n = v.ndims();
                let mut idx = vec![0u64; n];
                loop {
                    let at: u64 = (0..n).map(|k| idx[k] * u64::from(ps[k])).sum::<u64>() * size;
                    let from: u64 = (0..n)
                        .map(|k| idx[k] * u64::from(v.strides()[k]))
                        .sum::<u64>()
                        * size;
                    for b in 0..size {
                        assert_eq!(
                            packed[usize::try_from(at + b).unwrap()],
                            extent[usize::try_from(from + b).unwrap()],
                            "{v:?} at {idx:?}"
                        );
                    }
                    let mut k = n;
                    loop {
                        if k == 0 {
                            break;
                        }
                        k -= 1;
                        idx[k] += 1;
                        if idx[k] < u64::from(v.shape()[k]) {
                            break;
                        }
                        idx[k] = 0;
                        if k == 0 {
                            k = usize::MAX;
                            break;
                        }
                    }
                    if k == usize::MAX || (n > 0 && idx.iter().all(|&i| i == 0)) {
                        break;
                    }
                }
            }
        }
        assert!(packed_views > 1000, "{packed_views}");
        // A 2×3 tile of a row-major 8×8 matrix, and its transpose.
        let buf = crate::check::test_buffer(64 * 4);
        let tile = Tensor::new(buf, 9 * 4, &[2, 3], &[8, 1], crate::DType::F32).unwrap();
        assert_eq!(packed_strides(&tile).unwrap()[..2], [3, 1]);
        let t = Tensor::new(buf, 9 * 4, &[3, 2], &[1, 8], crate::DType::F32).unwrap();
        assert_eq!(packed_strides(&t).unwrap()[..2], [1, 3]);
        // Interleaved rows do not pack.
        let inter = Tensor::new(buf, 0, &[4, 4], &[3, 2], crate::DType::F32).unwrap();
        assert!(packed_strides(&inter).is_none());
    }
}
