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

/// How a staged copy of a view is laid out in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// As in the buffer, from the view's first byte (`extent_bytes`): what
    /// views that do not pack (sub-byte elements, interleaved or
    /// overlapping axes) get.
    Extent,
    /// Element after element ([`strata_wire::geometry::packed_strides`]):
    /// a 64×64 tile of a 1024-wide F32 matrix takes 16 KiB, not 258.
    Packed,
}

impl Layout {
    /// The layout of `view`'s staged copy.
    pub(crate) fn of(view: &Tensor) -> Layout {
        if strata_wire::geometry::packed_strides(view).is_some() {
            Layout::Packed
        } else {
            Layout::Extent
        }
    }

    /// Device bytes of `view`'s copy.
    pub(crate) fn len(self, view: &Tensor) -> u64 {
        match self {
            Layout::Extent => view.extent_bytes(),
            Layout::Packed => view
                .element_count()
                .saturating_mul(u64::from(view.dtype().bits() / 8)),
        }
    }

    /// The bytes a copy of `view` moves ([`Layout::copy_in`]'s and
    /// [`Layout::copy_out`]'s count), without moving them: what a chip in
    /// timing mode charges its link.
    pub(crate) fn view_bytes(self, view: &Tensor) -> u64 {
        let mut total = 0u64;
        for_each_run(view, |_, len| total += len as u64);
        total
    }

    /// Whether a copy-in writes every byte of the copy (otherwise the rest
    /// must be zeroed: it holds an earlier owner's bytes).
    pub(crate) fn filled_by_copy_in(self, view: &Tensor) -> bool {
        self == Layout::Packed || view.is_contiguous()
    }

    /// Copies the view's bytes from host memory (`host` is the view's first
    /// byte) into its copy at `dev`; returns the bytes copied.
    ///
    /// # Safety
    /// `host` is valid for `extent_bytes()` bytes, `dev` for
    /// [`Layout::len`], and they do not overlap.
    pub(crate) unsafe fn copy_in(self, view: &Tensor, host: *const u8, dev: *mut u8) -> u64 {
        match self {
            // SAFETY: the caller's guarantee.
            Layout::Extent => unsafe { copy_view(view, host, dev) },
            Layout::Packed => {
                let mut at = 0usize;
                for_each_run(view, |off, len| {
                    // SAFETY: runs lie inside the extent; a packed view's
                    // runs add up to exactly `len` bytes (tested).
                    unsafe { std::ptr::copy_nonoverlapping(host.add(off), dev.add(at), len) };
                    at += len;
                });
                at as u64
            }
        }
    }

    /// The reverse of [`Layout::copy_in`]: the copy at `dev` back into
    /// host memory, view bytes only.
    ///
    /// # Safety
    /// As for [`Layout::copy_in`]; `host` is writable.
    pub(crate) unsafe fn copy_out(self, view: &Tensor, dev: *const u8, host: *mut u8) -> u64 {
        match self {
            // SAFETY: the caller's guarantee.
            Layout::Extent => unsafe { copy_view(view, dev, host) },
            Layout::Packed => {
                let mut at = 0usize;
                for_each_run(view, |off, len| {
                    // SAFETY: as in `copy_in`, the other way.
                    unsafe { std::ptr::copy_nonoverlapping(dev.add(at), host.add(off), len) };
                    at += len;
                });
                at as u64
            }
        }
    }

    /// Copies one copy of `view` into another on the chip.
    ///
    /// # Safety
    /// Both valid for [`Layout::len`] bytes, not overlapping.
    pub(crate) unsafe fn copy_on_chip(self, view: &Tensor, src: *const u8, dst: *mut u8) -> u64 {
        match self {
            // SAFETY: the caller's guarantee.
            Layout::Extent => unsafe { copy_view(view, src, dst) },
            Layout::Packed => {
                let len = self.len(view) as usize;
                // SAFETY: the caller's guarantee.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
                len as u64
            }
        }
    }

    /// The kernel's view of a copy at device address `addr`.
    ///
    /// # Errors
    /// A copy that would wrap the address space.
    pub(crate) fn chip_tensor(
        self,
        view: &Tensor,
        addr: u64,
    ) -> Result<strata_wire::ChipTensor, strata_wire::Error> {
        use strata_wire::{AddressSpace, ChipTensor};
        match self {
            Layout::Extent => ChipTensor::staged(view, addr, AddressSpace::Device),
            Layout::Packed => ChipTensor::packed(view, addr, AddressSpace::Device),
        }
    }
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
