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
