//! Nested strided byte sets, the solver's representation of a footprint.
//!
//! A [`Set`] is `{ base + Σ_k i_k·s_k + j : 0 ≤ i_k < n_k, 0 ≤ j < width }`
//! with its dims sorted by ascending stride and *nested*: every stride is at
//! least the extent of everything inside it (`s_1 ≥ width`,
//! `s_{k+1} ≥ width + Σ_{l≤k} (n_l − 1)·s_l`). Nested sets are unions of
//! disjoint, ordered blocks at every level, which is what makes the
//! intersection test in `solve` exact. Counts are ≥ 2 (a count of 1 adds
//! nothing and is dropped).

use super::arith::{div_floor, rem};

/// Most dims a set may hold: 5 from a tensor plus room for the solver's
/// temporary splits (each lift adds one dim that the next step removes).
pub(super) const MAX_SET_DIMS: usize = 8;

/// One level of a set: `n` blocks `s` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Dim {
    pub(super) n: i128,
    pub(super) s: i128,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Set {
    pub(super) base: i128,
    pub(super) width: i128,
    len: usize,
    dims: [Dim; MAX_SET_DIMS],
}

impl Set {
    /// The contiguous run `[base, base + width)`.
    pub(super) fn run(base: i128, width: i128) -> Set {
        Set {
            base,
            width,
            len: 0,
            dims: [Dim::default(); MAX_SET_DIMS],
        }
    }

    /// A set from its parts, in place (no copy per level). `dims` must be
    /// nested, counts ≥ 2, and at most [`MAX_SET_DIMS`] long (extra levels
    /// are ignored).
    pub(super) fn from_parts(base: i128, width: i128, dims: impl Iterator<Item = Dim>) -> Set {
        let mut s = Set::run(base, width);
        for (slot, d) in s.dims.iter_mut().zip(dims) {
            *slot = d;
            s.len += 1;
        }
        s
    }

    pub(super) fn dims(&self) -> &[Dim] {
        self.dims.get(..self.len).unwrap_or_default()
    }

    pub(super) fn rank(&self) -> usize {
        self.len
    }

    /// Adds an outermost dim. Counts of 1 are dropped. `None` when the set
    /// is full (the caller then falls back to a conservative answer).
    #[must_use]
    pub(super) fn push(mut self, d: Dim) -> Option<Set> {
        self.add(d).then_some(self)
    }

    /// `push` in place (sets are large to move); `false` when full.
    #[must_use]
    pub(super) fn add(&mut self, d: Dim) -> bool {
        if d.n == 1 {
            return true;
        }
        let Some(slot) = self.dims.get_mut(self.len) else {
            return false;
        };
        *slot = d;
        self.len += 1;
        true
    }

    /// The outermost dim; only called on sets with at least one dim.
    pub(super) fn outer(&self) -> Dim {
        self.len
            .checked_sub(1)
            .and_then(|i| self.dims.get(i))
            .copied()
            .unwrap_or(Dim { n: 1, s: 1 })
    }

    pub(super) fn set_outer(&mut self, d: Dim) {
        if let Some(slot) = self.len.checked_sub(1).and_then(|i| self.dims.get_mut(i)) {
            *slot = d;
        }
    }

    /// The set without its outermost dim: one block, at the same base.
    pub(super) fn inner(&self) -> Set {
        let mut s = *self;
        s.len = s.len.saturating_sub(1);
        s
    }

    pub(super) fn shifted(&self, by: i128) -> Set {
        let mut s = *self;
        s.base += by;
        s
    }

    /// Bytes from the first to one past the last byte of the set.
    pub(super) fn extent(&self) -> i128 {
        self.width + self.dims().iter().map(|d| (d.n - 1) * d.s).sum::<i128>()
    }

    pub(super) fn bounds(&self) -> (i128, i128) {
        (self.base, self.base + self.extent())
    }

    /// Whether the nesting invariant holds (module docs).
    pub(super) fn is_nested(&self) -> bool {
        let mut inner = self.width;
        self.width > 0
            && self.dims().iter().all(|d| {
                let ok = d.n >= 2 && d.s >= inner;
                inner += (d.n - 1) * d.s;
                ok
            })
    }

    /// Every byte of the set, for tests.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> Vec<i128> {
        let mut out: Vec<i128> = (0..self.width).map(|j| self.base + j).collect();
        for d in self.dims() {
            let prev = std::mem::take(&mut out);
            for i in 0..d.n {
                out.extend(prev.iter().map(|p| p + i * d.s));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Builds the nested set of `base + Σ i_k·s_k + [0, width)` for dims in any
/// order. Returns the set and whether it is exact; when two levels
/// interleave (a stride shorter than the extent inside it that is not a
/// mergeable multiple), the inner levels are widened to their bounding run,
/// a superset, and the result is marked inexact.
pub(super) fn normalize(base: i128, width: i128, dims: &[Dim]) -> (Set, bool) {
    match fold(base, width, dims, true) {
        Ok(done) => done,
        // Not returned when widening; stay sound anyway.
        Err(_) => (Set::run(base, extent_of(width, dims)), false),
    }
}

/// Where a view's levels first interleave: `dims[dim]` has a stride shorter
/// than `inner`, the extent of the levels inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Interleave {
    pub(super) dim: usize,
    pub(super) inner: i128,
}

/// The nested set of `base + Σ i_k·s_k + [0, width)` when its levels nest
/// (after merging runs and progressions), or where they first interleave.
pub(super) fn nest(base: i128, width: i128, dims: &[Dim]) -> Result<Set, Interleave> {
    fold(base, width, dims, false).map(|(set, _)| set)
}

/// `normalize` (`widen`) and `nest` (not): one pass over the dims sorted by
/// stride, merging what continues the set so far and stacking the rest.
fn fold(base: i128, width: i128, dims: &[Dim], widen: bool) -> Result<(Set, bool), Interleave> {
    let mut sorted = [(Dim::default(), 0); MAX_SET_DIMS];
    let mut len = 0;
    for (i, d) in dims.iter().enumerate().filter(|(_, d)| d.n > 1) {
        if let Some(slot) = sorted.get_mut(len) {
            *slot = (*d, i);
            len += 1;
        }
    }
    let sorted = sorted.get_mut(..len).unwrap_or_default();
    sorted.sort_unstable_by_key(|(d, _)| d.s);

    let mut out = Set::run(base, width);
    let mut exact = true;
    for &(d, i) in sorted.iter() {
        if out.len > 0 {
            let last = out.outer();
            // {i·s1 : i < n1} + {j·c·s1 : j < n2} is the progression of
            // n1 + c·(n2 − 1) steps of s1 when c ≤ n1 (no holes).
            if rem(d.s, last.s) == 0 && div_floor(d.s, last.s) <= last.n {
                out.set_outer(Dim {
                    n: last.n + div_floor(d.s, last.s) * (d.n - 1),
                    s: last.s,
                });
                continue;
            }
        }
        let inner_extent = out.extent();
        if d.s < inner_extent && out.len > 0 {
            if !widen {
                return Err(Interleave {
                    dim: i,
                    inner: inner_extent,
                });
            }
            // Interleaved levels: widen what is inside to its bounding run.
            out = Set::run(base, inner_extent);
            exact = false;
        }
        if out.len == 0 && d.s <= out.width {
            // Runs that touch or overlap form one longer run.
            out.width += (d.n - 1) * d.s;
            continue;
        }
        if !out.add(d) {
            // Cannot happen for tensors (≤ 5 dims); stay sound anyway.
            let e = out.extent() + (d.n - 1) * d.s;
            out = Set::run(base, e);
            exact = false;
        }
    }
    debug_assert!(
        out.is_nested(),
        "normalize produced a non-nested set: {out:?}"
    );
    Ok((out, exact))
}

/// Bytes from the first to one past the last byte of
/// `base + Σ i_k·s_k + [0, width)`.
pub(super) fn extent_of(width: i128, dims: &[Dim]) -> i128 {
    width + dims.iter().map(|d| (d.n - 1) * d.s).sum::<i128>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of the dims exactly as given, before normalization.
    fn brute(base: i128, width: i128, dims: &[Dim]) -> Vec<i128> {
        let raw = dims
            .iter()
            .try_fold(Set::run(base, width), |s, d| s.push(*d));
        raw.expect("at most 8 dims").bytes()
    }

    #[test]
    fn normalize_is_exact_or_a_superset() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            i128::from((seed >> 33) % m)
        };
        for _ in 0..20_000 {
            let ndims = usize::try_from(next(4)).unwrap();
            let dims: Vec<Dim> = (0..ndims)
                .map(|_| Dim {
                    n: next(4) + 1,
                    s: next(12) + 1,
                })
                .collect();
            let width = next(4) + 1;
            let base = next(10);
            let (set, exact) = normalize(base, width, &dims);
            assert!(set.is_nested(), "{dims:?} w={width} -> {set:?}");
            let want = brute(base, width, &dims);
            let got = set.bytes();
            if exact {
                assert_eq!(got, want, "{dims:?} w={width} -> {set:?}");
            } else {
                assert!(
                    want.iter().all(|b| got.binary_search(b).is_ok()),
                    "{dims:?} -> {set:?}"
                );
            }
        }
    }
}
