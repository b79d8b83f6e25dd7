//! The overlap engine: do two views share a byte (docs/scheduling.md#the-overlap-engine)?
//!
//! Dependency inference trusts this test with users' data. A wrong
//! [`Overlap::Disjoint`] drops a real dependency and corrupts bytes; a wrong
//! [`Overlap::Partial`] only adds a needless edge. So the engine is built to
//! be *sound always* and *exact on the classes that matter*:
//!
//! - A view becomes a [`Footprint`]: its byte set as a nested strided set
//!   (dims with count 1 dropped, dims sorted by stride, contiguous or
//!   overlapping runs merged, progressions that continue each other merged).
//!   That canonical form forgets rank, axis order, dtype and how rows are
//!   laid out in the buffer, so transposed, permuted, reshaped and
//!   row-wrapping views of the same bytes all look alike. A view whose levels
//!   interleave is widened to a superset and marked inexact.
//! - Two footprints are compared by an exact solver (see `solve`): bounding
//!   ranges first, then level by level, with a number-theoretic leaf for two
//!   strided progressions. It answers "may share" when a problem would need
//!   a search beyond a small fixed step budget.
//! - `Covers` is proven, never guessed: every byte of `b` must avoid every
//!   gap of `a`.
//!
//! Cost per pair is a bounded number of steps, each O(ndims), with no
//! allocation.
//!
//! ```
//! use strata_wire::{overlap, Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, Overlap, Tensor};
//! let id = CanonicalIdentity::new([1; 8], 1, 1)?;
//! let buf = BufferDescriptor::new(id, 256, AddressSpace::Host, Access::ReadWrite, Backing::Memfd { st_dev: 1, st_ino: 2 })?;
//! let tile = |r0: u64, c0: u64, rows: u32, cols: u32| Tensor::new(buf, r0 * 16 + c0, &[rows, cols], &[16, 1], DType::U8);
//! let left = tile(0, 0, 16, 4)?;
//! let right = tile(0, 8, 16, 4)?;
//! assert_eq!(overlap(&left, &right), Overlap::Disjoint);
//! let all = Tensor::new(buf, 0, &[256], &[1], DType::U8)?;
//! assert_eq!(overlap(&all, &right), Overlap::Covers);
//! # Ok::<(), strata_wire::Error>(())
//! ```

mod arith;
mod set;
mod solve;

use std::ops::Range;

use crate::{CanonicalIdentity, MAX_DIMS, Tensor};
use set::{Dim, Set, normalize};

/// How two views relate, as seen from the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Overlap {
    /// No byte is shared (or the views are over different buffers).
    Disjoint,
    /// Every byte of the second view is a byte of the first.
    Covers,
    /// Some byte may be shared, and the first does not provably cover the
    /// second.
    Partial,
}

/// The bytes one view touches, in the canonical form the engine compares.
///
/// Computing it once per view and comparing footprints saves the
/// normalization when one view is compared with many.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Footprint {
    identity: CanonicalIdentity,
    set: Compact,
    exact: bool,
}

/// A nested set stored in 64-bit fields (every value of a valid view fits),
/// a third of the solver's 128-bit form: indexes keep many footprints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Compact {
    base: u64,
    width: u64,
    len: u8,
    dims: [(u64, u64); MAX_DIMS],
}

impl Compact {
    /// The compact form, or `None` if a value does not fit (never for a
    /// footprint of a valid tensor).
    fn of(s: &Set) -> Option<Compact> {
        let mut c = Compact {
            base: u64::try_from(s.base).ok()?,
            width: u64::try_from(s.width).ok()?,
            len: u8::try_from(s.dims().len()).ok()?,
            dims: [(0, 0); MAX_DIMS],
        };
        if s.dims().len() > MAX_DIMS {
            return None;
        }
        for (slot, d) in c.dims.iter_mut().zip(s.dims()) {
            *slot = (u64::try_from(d.n).ok()?, u64::try_from(d.s).ok()?);
        }
        Some(c)
    }

    fn dims(&self) -> &[(u64, u64)] {
        self.dims.get(..usize::from(self.len)).unwrap_or_default()
    }

    #[inline]
    fn set(&self) -> Set {
        let dims = self.dims().iter().map(|&(n, s)| Dim {
            n: i128::from(n),
            s: i128::from(s),
        });
        Set::from_parts(i128::from(self.base), i128::from(self.width), dims)
    }

    fn bounds(&self) -> (u64, u64) {
        let extent = self.dims().iter().fold(self.width, |e, &(n, s)| {
            e.saturating_add((n - 1).saturating_mul(s))
        });
        (self.base, self.base.saturating_add(extent))
    }
}

impl Footprint {
    /// The footprint of `view`.
    pub fn of(view: &Tensor) -> Footprint {
        let (set, exact) = byte_set(view);
        let (compact, exact) = match Compact::of(&set) {
            Some(c) => (c, exact),
            None => {
                // Unreachable for valid tensors; stay sound with the
                // bounding run (no longer exact).
                let (lo, hi) = set.bounds();
                let lo = u64::try_from(lo).unwrap_or(0);
                let hi = u64::try_from(hi).unwrap_or(u64::MAX);
                let run = Compact {
                    base: lo,
                    width: hi - lo,
                    len: 0,
                    dims: [(0, 0); MAX_DIMS],
                };
                (run, false)
            }
        };
        Footprint {
            identity: *view.identity(),
            set: compact,
            exact,
        }
    }

    /// The buffer the bytes are in.
    pub fn identity(&self) -> &CanonicalIdentity {
        &self.identity
    }

    /// From the first byte to one past the last byte touched.
    pub fn byte_range(&self) -> Range<u64> {
        let (lo, hi) = self.set.bounds();
        lo..hi
    }

    /// Whether the footprint is exactly the view's byte set (otherwise it is
    /// a superset, which only happens for views whose levels interleave or
    /// FP4 views with odd strides).
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// Byte offset of the first byte.
    pub fn base(&self) -> u64 {
        self.set.base
    }

    /// Bytes in each innermost contiguous run.
    pub fn run_bytes(&self) -> u64 {
        self.set.width
    }

    /// The levels of the footprint, innermost first, as `(count, byte
    /// stride)`: the bytes are `base + Σ i_k·stride_k + [0, run_bytes)`.
    /// Strides increase and each level's stride is at least the extent of
    /// what is inside it; an index can use them to place the footprint in a
    /// row/column grid.
    pub fn levels(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.set.dims().iter().copied()
    }

    /// How `self` relates to `other`; [`Overlap::Covers`] means every byte of
    /// `other` is a byte of `self`.
    pub fn overlap(&self, other: &Footprint) -> Overlap {
        if self.identity != other.identity {
            return Overlap::Disjoint;
        }
        let mut budget = solve::STEP_BUDGET;
        // Disjoint bounding ranges need no solver (and no 128-bit sets).
        let ((alo, ahi), (blo, bhi)) = (self.set.bounds(), other.set.bounds());
        if ahi <= blo || bhi <= alo {
            return Overlap::Disjoint;
        }
        // Two single runs (contiguous views, the common case) are their
        // bounding ranges: they share a byte, and `self` covers `other`
        // exactly when its range holds `other`'s (a run that is only a
        // superset of its view's bytes proves nothing, as below).
        let run = |c: &Compact| c.len == 0 && c.width > 0;
        if run(&self.set) && run(&other.set) {
            return if self.exact && alo <= blo && bhi <= ahi {
                Overlap::Covers
            } else {
                Overlap::Partial
            };
        }
        let (a, b) = (self.set.set(), other.set.set());
        match solve::intersects(&a, &b, &mut budget) {
            Some(false) => Overlap::Disjoint,
            None => Overlap::Partial,
            // A superset of `other` inside `self` proves `other` inside it;
            // a superset of `self` proves nothing.
            Some(true) if self.exact && solve::contains(&a, &b, &mut budget) == Some(true) => {
                Overlap::Covers
            }
            Some(true) => Overlap::Partial,
        }
    }
}

/// How `a` relates to `b`: [`Overlap::Disjoint`] only when they are over
/// different buffers or share no byte, [`Overlap::Covers`] only when every
/// byte of `b` is a byte of `a`, [`Overlap::Partial`] otherwise.
pub fn overlap(a: &Tensor, b: &Tensor) -> Overlap {
    if a.identity() != b.identity() {
        return Overlap::Disjoint;
    }
    Footprint::of(a).overlap(&Footprint::of(b))
}

/// The byte set of a view as a nested set, and whether it is exact.
fn byte_set(view: &Tensor) -> (Set, bool) {
    let base = i128::from(view.byte_offset());
    let mut dims = [Dim::default(); 5];
    let bits = view.dtype().bits();
    if bits >= 8 {
        let elem = i128::from(bits / 8);
        for (d, (&n, &s)) in dims.iter_mut().zip(view.shape().iter().zip(view.strides())) {
            *d = Dim {
                n: i128::from(n),
                s: i128::from(s) * elem,
            };
        }
        return normalize(base, elem, &dims);
    }
    // Sub-byte elements: solve in nibbles, then map nibble p to byte ⌊p/2⌋.
    // With every stride even (the start is always byte-aligned) that map is
    // exact: widths round up and strides halve.
    for (d, (&n, &s)) in dims.iter_mut().zip(view.shape().iter().zip(view.strides())) {
        *d = Dim {
            n: i128::from(n),
            s: i128::from(s),
        };
    }
    let (nibbles, exact) = normalize(2 * base, 1, &dims);
    if nibbles.dims().iter().all(|d| d.s % 2 == 0) {
        let mut halved = [Dim::default(); 5];
        for (h, d) in halved.iter_mut().zip(nibbles.dims()) {
            *h = Dim { n: d.n, s: d.s / 2 };
        }
        let (set, exact_bytes) = normalize(nibbles.base / 2, (nibbles.width + 1) / 2, &halved);
        return (set, exact && exact_bytes);
    }
    let (lo, hi) = nibbles.bounds();
    (Set::run(lo / 2, (hi - 1) / 2 + 1 - lo / 2), false)
}
