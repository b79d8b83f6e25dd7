//! Exact intersection and containment of nested sets.
//!
//! `intersects` decides whether two nested sets share a byte by peeling
//! their outermost levels:
//!
//! 1. disjoint bounding ranges: no;
//! 2. one side a single run: walk the other side's blocks that the run
//!    touches (at most two partial blocks per level);
//! 3. both sides one level deep: a bounded linear congruence, counted with
//!    `floor_sum` in O(log) steps;
//! 4. otherwise let A be the side with the larger outer stride S and count
//!    the blocks of A that B's range touches. Two or fewer: test each block
//!    (A loses a level). Same outer stride: the blocks line up, so only the
//!    one or two block offsets `k` with `−extent(B_in) < d + k·S <
//!    extent(A_in)` can meet, and each reduces to the inner sets. B's
//!    stride divides S: split B's outer level into whole groups of S bytes
//!    plus a remainder ("lifting"), which brings it to stride S. Few blocks:
//!    test each. Small common multiple L of both strides: lift both to L.
//! 5. Anything else is answered `None` ("may share"), as is a problem that
//!    exhausts the step budget. Callers treat `None` as an overlap, so the
//!    answer is never a wrong "disjoint".
//!
//! Containment `B ⊆ A` is `bounds(B) ⊆ bounds(A)` and B meeting none of the
//! gaps of A: the complement of a nested set inside its bounds is the
//! disjoint union, over its levels k, of the gaps between consecutive
//! blocks of level k, and each of those gap families is itself a nested set.

use super::arith::{div_ceil, div_floor, floor_sum, lcm, rem};
use super::set::{Dim, Set};

/// Blocks of one side that may be tested one by one.
const ENUMERATE_CAP: i128 = 16;

/// Steps one overlap decision may take before it answers "may share".
pub(super) const STEP_BUDGET: u32 = 512;

/// Whether `a` and `b` share a byte; `None` when the solver cannot tell
/// (treat as yes).
pub(super) fn intersects(a: &Set, b: &Set, budget: &mut u32) -> Option<bool> {
    *budget = budget.checked_sub(1)?;
    let (alo, ahi) = a.bounds();
    let (blo, bhi) = b.bounds();
    if ahi <= blo || bhi <= alo {
        return Some(false);
    }
    if a.rank() == 0 {
        return Some(hits_run(b, alo, ahi));
    }
    if b.rank() == 0 {
        return Some(hits_run(a, blo, bhi));
    }
    if a.rank() == 1 && b.rank() == 1 {
        return single_levels(a, b);
    }
    let (a, b) = if a.outer().s >= b.outer().s {
        (a, b)
    } else {
        (b, a)
    };
    let Dim { n: na, s: sa } = a.outer();
    let a_in = a.inner();
    let ea = a_in.extent();
    let (blo, bhi) = b.bounds();
    let i_lo = div_ceil(blo - a.base - ea + 1, sa).max(0);
    let i_hi = div_floor(bhi - 1 - a.base, sa).min(na - 1);
    if i_lo > i_hi {
        return Some(false);
    }
    let touched = i_hi - i_lo + 1;
    let t = b.outer().s;
    if touched <= 2 {
        return any((i_lo..=i_hi).map(|i| (a_in.shifted(i * sa), *b)), budget);
    }
    if t == sa {
        return same_stride(a, b, budget);
    }
    if rem(sa, t) == 0 {
        let (b1, b2) = lift(b, sa)?;
        return any([b1, b2].into_iter().flatten().map(|bx| (*a, bx)), budget);
    }
    if touched <= ENUMERATE_CAP {
        return any((i_lo..=i_hi).map(|i| (a_in.shifted(i * sa), *b)), budget);
    }
    let l = lcm(sa, t)?;
    if div_floor(l, sa) <= ENUMERATE_CAP {
        let (a1, a2) = lift(a, l)?;
        let (b1, b2) = lift(b, l)?;
        let pairs = [a1, a2]
            .into_iter()
            .flatten()
            .flat_map(|ax| [b1, b2].into_iter().flatten().map(move |bx| (ax, bx)));
        return any(pairs, budget);
    }
    None
}

/// Whether every byte of `b` is a byte of `a`; `None` when the solver
/// cannot tell (treat as no).
pub(super) fn contains(a: &Set, b: &Set, budget: &mut u32) -> Option<bool> {
    let (alo, ahi) = a.bounds();
    let (blo, bhi) = b.bounds();
    if blo < alo || bhi > ahi {
        return Some(false);
    }
    let mut inner = a.width;
    for (k, d) in a.dims().iter().enumerate() {
        let gap = d.s - inner;
        if gap > 0 {
            // Gaps after each level-k block but the last, repeated by the
            // levels outside k.
            let mut g = Set::run(a.base + inner, gap).push(Dim { n: d.n - 1, s: d.s })?;
            for outer in a.dims().iter().skip(k + 1) {
                if !g.add(*outer) {
                    return None;
                }
            }
            if intersects(&g, b, budget)? {
                return Some(false);
            }
        }
        inner += (d.n - 1) * d.s;
    }
    Some(true)
}

/// Some(true) if any pair intersects; otherwise None if any pair was
/// undecided; otherwise Some(false).
fn any(pairs: impl IntoIterator<Item = (Set, Set)>, budget: &mut u32) -> Option<bool> {
    let mut undecided = false;
    for (x, y) in pairs {
        match intersects(&x, &y, budget) {
            Some(true) => return Some(true),
            Some(false) => {}
            None => {
                if *budget == 0 {
                    return None;
                }
                undecided = true;
            }
        }
    }
    if undecided { None } else { Some(false) }
}

/// Both outer strides equal S: block i of A and block j of B can only meet
/// when `k = j − i` puts B's inner set within reach of A's.
fn same_stride(a: &Set, b: &Set, budget: &mut u32) -> Option<bool> {
    let Dim { n: na, s } = a.outer();
    let Dim { n: nb, .. } = b.outer();
    let (a_in, b_in) = (a.inner(), b.inner());
    let (ea, eb) = (a_in.extent(), b_in.extent());
    let d = b.base - a.base;
    // a.base + x = b.base + k·S + y with x ∈ [0, ea), y ∈ [0, eb):
    // −eb < d + k·S < ea. Both extents are ≤ S, so at most two k.
    let k_min = div_floor(-eb - d, s) + 1;
    let k_max = div_ceil(ea - d, s) - 1;
    let candidates = (k_min..=k_max).filter(|&k| (-k).max(0) < na.min(nb - k));
    any(candidates.map(|k| (a_in, b_in.shifted(k * s))), budget)
}

/// Rewrites the outer level (m blocks, stride T) of `x` as `q` groups of
/// `r = L/T` blocks at stride L, plus a remainder of `m − q·r` blocks.
/// Requires `L % T == 0`.
fn lift(x: &Set, l: i128) -> Option<(Option<Set>, Option<Set>)> {
    let Dim { n: m, s: t } = x.outer();
    let inner = x.inner();
    let r = div_floor(l, t);
    let (q, rest) = (div_floor(m, r), rem(m, r));
    let whole = if q >= 1 {
        Some(inner.push(Dim { n: r, s: t })?.push(Dim { n: q, s: l })?)
    } else {
        None
    };
    let tail = if rest >= 1 {
        Some(inner.shifted(q * l).push(Dim { n: rest, s: t })?)
    } else {
        None
    };
    Some((whole, tail))
}

/// Whether nested set `x` meets the run `[lo, hi)`.
fn hits_run(x: &Set, lo: i128, hi: i128) -> bool {
    let (xlo, xhi) = x.bounds();
    if xhi <= lo || hi <= xlo {
        return false;
    }
    if x.rank() == 0 {
        return true;
    }
    let Dim { n, s } = x.outer();
    let x_in = x.inner();
    let e = x_in.extent();
    let i_lo = div_ceil(lo - x.base - e + 1, s).max(0);
    let i_hi = div_floor(hi - 1 - x.base, s).min(n - 1);
    if i_lo > i_hi {
        return false;
    }
    // Blocks strictly between the first and last touched one lie wholly
    // inside the run (blocks are disjoint and ordered).
    if i_hi - i_lo >= 2 {
        return true;
    }
    let block_hits = |i: i128| {
        let start = x.base + i * s;
        (start >= lo && start + e <= hi) || hits_run(&x_in.shifted(i * s), lo, hi)
    };
    block_hits(i_lo) || (i_hi != i_lo && block_hits(i_hi))
}

/// Two one-level sets `A = {xa + s·i + [0, wa)}` (i < n) and
/// `B = {xb + t·j + [0, wb)}` (j < m) meet iff some i, j give
/// `1 − wa ≤ (xa + s·i) − (xb + t·j) ≤ wb − 1` (the difference is the
/// offset within B's run minus the offset within A's run). For fixed i a suitable j
/// exists iff the window holds a multiple of t inside B's range; the range
/// condition bounds i to an interval, and the window condition is
/// `(c − L + s·i) mod t ≤ R − L`, whose count over the interval is a
/// difference of two floor sums.
fn single_levels(a: &Set, b: &Set) -> Option<bool> {
    let Dim { n, s } = a.outer();
    let Dim { n: m, s: t } = b.outer();
    let c = a.base - b.base;
    let (lo, hi) = (1 - a.width, b.width - 1);
    let i0 = div_ceil(lo - c, s).max(0);
    let i1 = div_floor(t * (m - 1) + hi - c, s).min(n - 1);
    if i0 > i1 {
        return Some(false);
    }
    let k = hi - lo;
    if k >= t - 1 {
        return Some(true);
    }
    let count = i1 - i0 + 1;
    let b0 = c - lo + s * i0;
    let b1 = b0 - k - 1;
    // Shift b1 up to a non-negative offset: ⌊(s·u + b1)/t⌋ = ⌊(s·u + b1 + z·t)/t⌋ − z.
    let z = if b1 < 0 { div_ceil(-b1, t) } else { 0 };
    let u = |v: i128| u128::try_from(v).ok();
    let upper = floor_sum(u(count)?, u(t)?, u(s)?, u(b0)?);
    let lower = floor_sum(u(count)?, u(t)?, u(s)?, u(b1 + z * t)?)
        .wrapping_sub(u(count)?.wrapping_mul(u(z)?));
    Some(upper.wrapping_sub(lower) != 0)
}

#[cfg(test)]
mod tests {
    use super::super::set::normalize;
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, m: u64) -> i128 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            i128::from((self.0 >> 33) % m)
        }
        /// One level: a run of 1..=5 bytes repeated 2..=9 times, with gaps
        /// of 0..=8 bytes.
        fn progression(&mut self) -> Set {
            let run = Set::run(self.next(50), self.next(5) + 1);
            let s = run.width + self.next(9);
            run.push(Dim {
                n: self.next(8) + 2,
                s,
            })
            .unwrap()
        }
        fn set(&mut self, max_stride: u64) -> (Set, bool) {
            let ndims = usize::try_from(self.next(4)).unwrap();
            let dims: Vec<Dim> = (0..ndims)
                .map(|_| Dim {
                    n: self.next(5) + 1,
                    s: self.next(max_stride) + 1,
                })
                .collect();
            normalize(self.next(40), self.next(6) + 1, &dims)
        }
    }

    /// Random nested sets against their byte lists: never a wrong answer,
    /// and the undecided rate stays small.
    #[test]
    fn intersects_and_contains_agree_with_bytes() {
        let mut rng = Lcg(99);
        let (mut undecided, mut total) = (0, 0);
        for round in 0..60_000 {
            let max_stride = if round % 2 == 0 { 24 } else { 64 };
            let (a, _) = rng.set(max_stride);
            let (b, _) = rng.set(max_stride);
            let (ab, bb) = (a.bytes(), b.bytes());
            let meet = ab.iter().any(|x| bb.binary_search(x).is_ok());
            let within = bb.iter().all(|x| ab.binary_search(x).is_ok());
            let mut budget = STEP_BUDGET;
            total += 1;
            match intersects(&a, &b, &mut budget) {
                Some(got) => assert_eq!(got, meet, "intersects {a:?} {b:?}"),
                None => undecided += 1,
            }
            let mut budget = STEP_BUDGET;
            if let Some(got) = contains(&a, &b, &mut budget) {
                assert_eq!(got, within, "contains {a:?} {b:?}");
            }
        }
        assert!(undecided * 100 < total, "{undecided} of {total} undecided");
    }

    #[test]
    fn single_levels_agree_with_bytes() {
        let mut rng = Lcg(7);
        for _ in 0..100_000 {
            let (a, b) = (rng.progression(), rng.progression());
            let (ab, bb) = (a.bytes(), b.bytes());
            let meet = ab.iter().any(|x| bb.binary_search(x).is_ok());
            assert_eq!(single_levels(&a, &b), Some(meet), "{a:?} {b:?}");
        }
    }
}
