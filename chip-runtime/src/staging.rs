//! Moving exactly a view's bytes: between host and device memory when
//! staging, and into or out of a packed byte string when a view's bytes
//! travel over the network.
//!
//! A staged copy keeps the view's layout: byte `first + d` of the buffer
//! (where `first` is the view's first byte) goes to byte `d` of the device
//! block. Only the bytes of the view's elements move, in maximal runs, so a
//! write-back never touches bytes between elements that other tasks may own.

use strata_wire::Tensor;

/// Calls `f(offset, len)` for runs of bytes that together are exactly the
/// bytes the view touches (offsets from the view's first byte). Axes are
/// walked from the largest stride to the smallest so that runs come in
/// increasing order and adjacent ones merge; a view whose elements repeat
/// (overlapping strides) may report a byte more than once, which is harmless
/// for copies.
pub fn for_each_run(view: &Tensor, mut f: impl FnMut(usize, usize)) {
    if view.is_contiguous() {
        f(0, view.extent_bytes() as usize);
        return;
    }
    let n = view.ndims();
    let mut order: [usize; 5] = [0, 1, 2, 3, 4];
    order[..n].sort_by_key(|&k| std::cmp::Reverse(view.strides()[k]));
    let shape: Vec<u32> = order[..n].iter().map(|&k| view.shape()[k]).collect();
    let strides: Vec<u32> = order[..n].iter().map(|&k| view.strides()[k]).collect();
    let bits = view.dtype().bits() as usize;
    // Rows along the last axis are one run when its stride is 1 (whole
    // bytes only); otherwise each element is its own run.
    let (inner_count, inner_run) = if strides[n - 1] == 1 && bits >= 8 {
        (1, shape[n - 1] as usize * bits / 8)
    } else {
        (shape[n - 1] as usize, 0)
    };
    let mut pending: Option<(usize, usize)> = None;
    let mut emit = |off: usize, len: usize, f: &mut dyn FnMut(usize, usize)| match pending {
        Some((s, l)) if s + l == off => pending = Some((s, l + len)),
        Some((s, l)) if off >= s && off + len <= s + l => {}
        Some((s, l)) => {
            f(s, l);
            pending = Some((off, len));
        }
        None => pending = Some((off, len)),
    };
    let mut idx = [0usize; 5];
    loop {
        let base: usize = (0..n - 1).map(|k| idx[k] * strides[k] as usize).sum();
        for j in 0..inner_count {
            let elem = base + j * strides[n - 1] as usize;
            if inner_run > 0 {
                emit(elem * bits / 8, inner_run, &mut f);
            } else {
                // Sub-byte elements live in byte ⌊bit / 8⌋.
                let first = elem * bits / 8;
                let last = (elem * bits + bits - 1) / 8;
                emit(first, last - first + 1, &mut f);
            }
        }
        let mut axis = n - 1;
        loop {
            if axis == 0 {
                if let Some((s, l)) = pending {
                    f(s, l);
                }
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < shape[axis] as usize {
                break;
            }
            idx[axis] = 0;
        }
    }
}

/// Bytes in the packed form of a view: the sum of its runs' lengths.
pub fn packed_len(view: &Tensor) -> u64 {
    let mut n = 0u64;
    for_each_run(view, |_, len| n += len as u64);
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

/// Copies the view's bytes out of `extent` (the view's bytes from its first
/// byte, laid out as in the buffer) into a packed string, run after run.
///
/// # Panics
/// When `extent` is shorter than the view's extent.
pub fn pack(view: &Tensor, extent: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(packed_len(view) as usize);
    for_each_run(view, |off, len| {
        out.extend_from_slice(&extent[off..off + len])
    });
    out
}

/// Copies a packed string back into `extent` (laid out from the view's
/// first byte). Returns `false`, copying nothing, when `packed` is not
/// exactly [`packed_len`] bytes or `extent` is short.
pub fn unpack(view: &Tensor, packed: &[u8], extent: &mut [u8]) -> bool {
    if packed.len() as u64 != packed_len(view) || (extent.len() as u64) < view.extent_bytes() {
        return false;
    }
    let mut at = 0;
    for_each_run(view, |off, len| {
        extent[off..off + len].copy_from_slice(&packed[at..at + len]);
        at += len;
    });
    true
}

/// Copies the view's bytes from `src` to `dst`, both laid out from the
/// view's first byte; returns the bytes copied.
///
/// # Safety
/// `src` and `dst` are valid for `view.extent_bytes()` bytes and do not
/// overlap.
pub(crate) unsafe fn copy_view(view: &Tensor, src: *const u8, dst: *mut u8) -> u64 {
    let mut total = 0u64;
    for_each_run(view, |off, len| {
        // SAFETY: every run lies inside [0, extent) (tested against the
        // byte-set oracle), and the caller guarantees both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len) };
        total += len as u64;
    });
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::check::{Rng, ViewClass, byte_set, view_pair};

    /// The runs cover exactly the view's bytes: none outside the view (a
    /// write-back must not touch them), none missing.
    #[test]
    fn runs_are_exactly_the_view_bytes() {
        let mut rng = Rng(3);
        for class in ViewClass::ALL {
            for _ in 0..2000 {
                let (v, _) = view_pair(class, &mut rng);
                let first = v.byte_offset();
                let mut got = Vec::new();
                for_each_run(&v, |off, len| {
                    assert!(
                        len > 0 && off + len <= v.extent_bytes() as usize,
                        "run outside the extent"
                    );
                    got.extend((off..off + len).map(|b| b as u64 + first));
                });
                got.sort_unstable();
                got.dedup();
                assert_eq!(got, byte_set(&v).unwrap(), "{class:?} {v:?}");
                // pack ∘ unpack restores the view's bytes.
                let extent: Vec<u8> = (0..v.extent_bytes()).map(|i| (i * 7 % 251) as u8).collect();
                let packed = pack(&v, &extent);
                assert_eq!(packed.len() as u64, packed_len(&v));
                let mut back = vec![0u8; extent.len()];
                assert!(unpack(&v, &packed, &mut back));
                for b in byte_set(&v).unwrap() {
                    let i = (b - first) as usize;
                    assert_eq!(back[i], extent[i]);
                }
                assert!(
                    !unpack(&v, &packed[1..], &mut back),
                    "a short packed string is refused"
                );
            }
        }
    }
}
