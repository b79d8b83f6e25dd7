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
//!   interleave keeps its own levels instead and is compared as a union of
//!   nested pieces (see `pieces`); one that would need more than 16 pieces
//!   is widened to a superset and marked inexact.
//! - Two footprints are compared by an exact solver (see `solve`): bounding
//!   ranges first, then level by level, with a number-theoretic leaf for two
//!   strided progressions. It answers "may share" when a problem would need
//!   a search beyond a small fixed step budget.
//! - `Covers` is proven, never guessed: every byte of `b` must avoid every
//!   gap of `a` (for a union: lie in some piece of it).
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
mod pieces;
mod set;
mod solve;

use std::ops::{ControlFlow, Range};

use crate::{CanonicalIdentity, MAX_DIMS, Tensor};
use pieces::{Pieces, Raw};
use set::{Dim, Set};

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
    form: Form,
}

/// What a footprint's [`Compact`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Form {
    /// The view's byte set, nested: exact.
    Nested,
    /// The view's own levels, which interleave: `base` in bytes, `width`
    /// and the levels in bytes, or in nibbles for FP4 (then the first
    /// nibble is `2·base`). Exact, through its pieces (see `pieces`), when
    /// they are few; with `many`, compared piece by piece as they are
    /// made, which can prove that nothing is shared but not that it
    /// covers.
    Raw { nibbles: bool, many: bool },
    /// A nested superset of the view's bytes.
    Widened,
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
        Compact::from_parts(s.base, s.width, s.dims())
    }

    fn from_parts(base: i128, width: i128, dims: &[Dim]) -> Option<Compact> {
        let mut c = Compact {
            base: u64::try_from(base).ok()?,
            width: u64::try_from(width).ok()?,
            len: u8::try_from(dims.len()).ok()?,
            dims: [(0, 0); MAX_DIMS],
        };
        if dims.len() > MAX_DIMS {
            return None;
        }
        for (slot, d) in c.dims.iter_mut().zip(dims) {
            *slot = (u64::try_from(d.n).ok()?, u64::try_from(d.s).ok()?);
        }
        Some(c)
    }

    /// The bounding run of `s`, for a set too large to store (never for a
    /// footprint of a valid tensor).
    fn bounding(s: &Set) -> Compact {
        let (lo, hi) = s.bounds();
        let lo = u64::try_from(lo).unwrap_or(0);
        let hi = u64::try_from(hi).unwrap_or(u64::MAX);
        Compact {
            base: lo,
            width: hi - lo,
            len: 0,
            dims: [(0, 0); MAX_DIMS],
        }
    }

    fn dims(&self) -> &[(u64, u64)] {
        self.dims.get(..usize::from(self.len)).unwrap_or_default()
    }

    fn solver_dims(&self) -> impl Iterator<Item = Dim> + '_ {
        self.dims().iter().map(|&(n, s)| Dim {
            n: i128::from(n),
            s: i128::from(s),
        })
    }

    #[inline]
    fn set(&self) -> Set {
        Set::from_parts(
            i128::from(self.base),
            i128::from(self.width),
            self.solver_dims(),
        )
    }

    /// The view a [`Form::Raw`] footprint holds.
    fn raw(&self, nibbles: bool) -> Raw {
        let mut dims = [Dim::default(); MAX_DIMS];
        for (slot, d) in dims.iter_mut().zip(self.solver_dims()) {
            *slot = d;
        }
        let base = i128::from(self.base);
        Raw {
            base: if nibbles { 2 * base } else { base },
            width: i128::from(self.width),
            nibbles,
            len: usize::from(self.len),
            dims,
        }
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
        let raw = raw_view(view);
        let (superset, exact) = raw.superset();
        let nested = |form| match Compact::of(&superset) {
            Some(set) => (set, form),
            // Unreachable for valid tensors; stay sound with the bounding
            // run (no longer exact).
            None => (Compact::bounding(&superset), Form::Widened),
        };
        let (set, form) = if exact {
            nested(Form::Nested)
        } else {
            // Interleaved levels: keep the view itself, noting whether
            // its pieces are few enough to hold at once.
            let mut cap = pieces::MAX_PIECES;
            let few = raw
                .for_each_piece(&mut cap, &mut |_| ControlFlow::Continue(()))
                .is_some();
            let byte_base = if raw.nibbles { raw.base / 2 } else { raw.base };
            match Compact::from_parts(byte_base, raw.width, raw.dims()) {
                Some(set) => (
                    set,
                    Form::Raw {
                        nibbles: raw.nibbles,
                        many: !few,
                    },
                ),
                None => nested(Form::Widened),
            }
        };
        Footprint {
            identity: *view.identity(),
            set,
            form,
        }
    }

    /// The buffer the bytes are in.
    pub fn identity(&self) -> &CanonicalIdentity {
        &self.identity
    }

    /// From the first byte to one past the last byte touched.
    pub fn byte_range(&self) -> Range<u64> {
        let (lo, hi) = self.bounds();
        lo..hi
    }

    /// Whether the engine compares this footprint by the view's exact byte
    /// set. Otherwise (a view whose levels interleave so much that it
    /// would need more than 16 nested pieces) it compares its pieces one by
    /// one as they are made, up to a bound, or a superset: sound, but it
    /// may see a shared byte where there is none and never proves that it
    /// covers another view.
    pub fn is_exact(&self) -> bool {
        matches!(self.form, Form::Nested | Form::Raw { many: false, .. })
    }

    /// Byte offset of the first byte.
    pub fn base(&self) -> u64 {
        self.bounds().0
    }

    /// Bytes in each innermost contiguous run of [`Footprint::levels`].
    pub fn run_bytes(&self) -> u64 {
        self.nested().width
    }

    /// The levels of a nested set that holds every byte of the view (its
    /// exact byte set unless the view's levels interleave), innermost
    /// first, as `(count, byte stride)`: the bytes are within
    /// `base + Σ i_k·stride_k + [0, run_bytes)`. Strides increase and each
    /// level's stride is at least the extent of what is inside it; an index
    /// can use them to place the footprint in a row/column grid.
    pub fn levels(&self) -> impl Iterator<Item = (u64, u64)> + use<> {
        let c = self.nested();
        c.dims.into_iter().take(usize::from(c.len))
    }

    /// `set` for nested forms; the nested superset of a raw one.
    fn nested(&self) -> Compact {
        match self.form {
            Form::Nested | Form::Widened => self.set,
            Form::Raw { nibbles, .. } => {
                let (s, _) = self.set.raw(nibbles).superset();
                Compact::of(&s).unwrap_or_else(|| Compact::bounding(&s))
            }
        }
    }

    fn bounds(&self) -> (u64, u64) {
        match self.form {
            Form::Nested | Form::Widened => self.set.bounds(),
            Form::Raw { nibbles, .. } => {
                let (lo, hi) = self.set.raw(nibbles).byte_bounds();
                (
                    u64::try_from(lo).unwrap_or(0),
                    u64::try_from(hi).unwrap_or(u64::MAX),
                )
            }
        }
    }

    /// Makes `into` the exact pieces of the view, or its nested set (a
    /// superset, for a view of many pieces) as one piece.
    fn pieces(&self, into: &mut Pieces) {
        match self.form {
            Form::Nested | Form::Widened => into.set_one(&self.set.set()),
            Form::Raw { nibbles, many } => {
                let raw = self.set.raw(nibbles);
                // `of` checked that the pieces are few.
                if many || !into.set_raw(&raw) {
                    into.set_one(&raw.superset().0);
                }
            }
        }
    }

    /// The view of a footprint of many pieces.
    fn many(&self) -> Option<Raw> {
        match self.form {
            Form::Raw {
                nibbles,
                many: true,
            } => Some(self.set.raw(nibbles)),
            _ => None,
        }
    }

    /// How `self` relates to `other`; [`Overlap::Covers`] means every byte of
    /// `other` is a byte of `self`.
    pub fn overlap(&self, other: &Footprint) -> Overlap {
        if self.identity != other.identity {
            return Overlap::Disjoint;
        }
        // Disjoint bounding ranges need no solver (and no 128-bit sets).
        let ((alo, ahi), (blo, bhi)) = (self.bounds(), other.bounds());
        if ahi <= blo || bhi <= alo {
            return Overlap::Disjoint;
        }
        let raw = |f: &Footprint| matches!(f.form, Form::Raw { .. });
        if raw(self) || raw(other) {
            return self.refined(other);
        }
        let exact = self.form == Form::Nested;
        // Two single runs (contiguous views, the common case) are their
        // bounding ranges: they share a byte, and `self` covers `other`
        // exactly when its range holds `other`'s (a run that is only a
        // superset of its view's bytes proves nothing, as below).
        let run = |c: &Compact| c.len == 0 && c.width > 0;
        if run(&self.set) && run(&other.set) {
            return if exact && alo <= blo && bhi <= ahi {
                Overlap::Covers
            } else {
                Overlap::Partial
            };
        }
        let mut budget = solve::STEP_BUDGET;
        let (a, b) = (self.set.set(), other.set.set());
        match solve::intersects(&a, &b, &mut budget) {
            Some(false) => Overlap::Disjoint,
            None => Overlap::Partial,
            // A superset of `other` inside `self` proves `other` inside it;
            // a superset of `self` proves nothing.
            Some(true) if exact && solve::contains(&a, &b, &mut budget) == Some(true) => {
                Overlap::Covers
            }
            Some(true) => Overlap::Partial,
        }
    }

    /// `overlap` when a side's levels interleave: the nested supersets
    /// first (most pairs that share nothing end there), then the exact
    /// pieces.
    fn refined(&self, other: &Footprint) -> Overlap {
        let mut budget = solve::STEP_BUDGET;
        let (a, b) = (self.nested().set(), other.nested().set());
        if solve::intersects(&a, &b, &mut budget) == Some(false) {
            return Overlap::Disjoint;
        }
        let (mut a, mut b) = (Pieces::new(), Pieces::new());
        self.pieces(&mut a);
        other.pieces(&mut b);
        let mut budget = pieces::UNION_BUDGET;
        let meet = match (self.many(), other.many()) {
            (None, None) => pieces::intersects(&a, &b, &mut budget),
            (Some(x), None) => pieces::stream(&x, &b, &mut budget),
            (None, Some(y)) => pieces::stream(&y, &a, &mut budget),
            // Against the other's superset, a "may share" proves nothing.
            (Some(x), Some(y)) => match pieces::stream(&x, &b, &mut budget) {
                Some(false) => Some(false),
                _ => pieces::stream(&y, &a, &mut budget).filter(|m| !m),
            },
        };
        match meet {
            Some(false) => Overlap::Disjoint,
            None => Overlap::Partial,
            // Pieces of a widened `other` are a superset, which proves
            // containment as well.
            Some(true) if self.is_exact() && pieces::covers(&a, &b, &mut budget) == Some(true) => {
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

/// The bytes of a view as given: in bytes, or in nibbles for sub-byte
/// elements (whose views start on a byte).
fn raw_view(view: &Tensor) -> Raw {
    let bits = view.dtype().bits();
    let (unit, nibbles) = if bits >= 8 {
        (i128::from(bits / 8), false)
    } else {
        (1, true)
    };
    let mut dims = [Dim::default(); MAX_DIMS];
    let mut len = 0;
    for (&n, &s) in view.shape().iter().zip(view.strides()) {
        if n > 1 {
            if let Some(slot) = dims.get_mut(len) {
                *slot = Dim {
                    n: i128::from(n),
                    s: i128::from(s) * unit,
                };
                len += 1;
            }
        }
    }
    let base = i128::from(view.byte_offset());
    Raw {
        base: if nibbles { 2 * base } else { base },
        width: unit,
        nibbles,
        len,
        dims,
    }
}
