//! Moving exactly a view's bytes: between host and device memory when
//! staging, and into or out of a packed byte string when a view's bytes
//! travel over the network.
//!
//! A staged copy keeps the view's layout: byte `first + d` of the buffer
//! (where `first` is the view's first byte) goes to byte `d` of the device
//! block. Only the bytes of the view's elements move, in maximal runs, so a
//! write-back never touches bytes between elements that other tasks may own.

use strata_wire::Tensor;

pub use strata_wire::geometry::{for_each_run, pack, packed_len, packed_len_bounded, unpack};

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
                let packed = pack(&v, &extent).expect("the whole extent packs");
                if let Some(short) = extent.len().checked_sub(1) {
                    assert!(
                        pack(&v, &extent[..short]).is_none(),
                        "a short extent is refused"
                    );
                }
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
