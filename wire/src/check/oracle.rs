//! The brute-force overlap oracle: enumerate the bytes of small views.

use super::views::ViewClass;
use crate::{Overlap, Tensor};

/// Views with more elements than this are not enumerated by the oracle.
pub const ORACLE_MAX_ELEMENTS: u64 = 1 << 16;

/// Every byte offset `view` touches, sorted and deduplicated; `None` when
/// the view has more than [`ORACLE_MAX_ELEMENTS`] elements.
pub fn byte_set(view: &Tensor) -> Option<Vec<u64>> {
    if view.element_count() > ORACLE_MAX_ELEMENTS {
        return None;
    }
    let bits = u128::from(view.dtype().bits());
    let mut out = Vec::new();
    let shape = view.shape();
    let strides = view.strides();
    let mut index = vec![0u32; shape.len()];
    loop {
        let elem: u128 = index
            .iter()
            .zip(strides)
            .map(|(&i, &s)| u128::from(i) * u128::from(s))
            .sum();
        // In bits, u128: byte offsets may be close to 2^64.
        let first_bit = u128::from(view.byte_offset()) * 8 + elem * bits;
        let last_bit = first_bit + bits - 1;
        out.extend((first_bit / 8..=last_bit / 8).map(|b| b as u64));
        // Odometer over the index, innermost axis fastest.
        let mut axis = shape.len();
        loop {
            if axis == 0 {
                out.sort_unstable();
                out.dedup();
                return Some(out);
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

/// The true relation of two views, by enumerating their bytes; `None` when
/// a view is too large to enumerate.
pub fn overlap_by_bytes(a: &Tensor, b: &Tensor) -> Option<Overlap> {
    if a.identity() != b.identity() {
        return Some(Overlap::Disjoint);
    }
    let (sa, sb) = (byte_set(a)?, byte_set(b)?);
    let shared = sb.iter().filter(|x| sa.binary_search(x).is_ok()).count();
    Some(match shared {
        0 => Overlap::Disjoint,
        n if n == sb.len() => Overlap::Covers,
        _ => Overlap::Partial,
    })
}

/// Panics unless `got` is a sound answer for the true relation `truth`, and
/// the exact answer on exact classes.
pub fn check_answer(class: ViewClass, a: &Tensor, b: &Tensor, got: Overlap, truth: Overlap) {
    match (got, truth) {
        (Overlap::Disjoint, Overlap::Covers | Overlap::Partial) => {
            panic!("wrong Disjoint ({class:?}): {a:?} vs {b:?}")
        }
        (Overlap::Covers, Overlap::Disjoint | Overlap::Partial) => {
            panic!("wrong Covers ({class:?}): {a:?} vs {b:?} is {truth:?}")
        }
        _ => {}
    }
    if class.is_exact() {
        assert_eq!(
            got, truth,
            "inexact answer on exact class {class:?}: {a:?} vs {b:?}"
        );
    }
}
