//! Exact byte sets of views whose levels interleave, as unions of nested
//! sets.
//!
//! A view is `base + Σ i_k·s_k + [0, width)`. When a level's stride is
//! shorter than the extent of the levels inside it, the blocks overlap and
//! the set is not nested, so the solver cannot take it as it is. Splitting
//! that level's index by its residue modulo `r = ⌈extent / stride⌉` gives
//! `r` sets whose blocks are `r` strides apart, far enough not to overlap:
//!
//! ```text
//! Y + {0, s, 2s, …, (n−1)s}  =  ⋃_{c < r}  (Y + c·s + {0, rs, 2rs, …})
//! ```
//!
//! Each part is split again until every part nests (each split lowers the
//! product of the counts, so this ends), and the union of the parts is
//! exactly the view's bytes. Parts may share bytes with each other, which
//! intersection does not mind and containment handles (see `covered`).
//!
//! FP4 views are described in nibbles. A level with an odd stride is first
//! split by parity into two levels of even stride; with every stride even,
//! nibble `p` maps to byte `⌊p/2⌋` exactly (runs round outwards, strides
//! halve), and the byte description is split as above.
//!
//! A view that would need more than [`MAX_PIECES`] parts is not refined: its
//! footprint stays the widened superset, which is sound.

use std::ops::ControlFlow;

use super::arith::{div_ceil, div_floor, rem};
use super::set::{Dim, Interleave, Set, extent_of, nest, normalize};
use super::solve;
use crate::MAX_DIMS;

/// Most nested parts a view is split into.
pub(super) const MAX_PIECES: usize = 16;

/// Most pieces of a view compared one by one as they are made (a view of
/// more than [`MAX_PIECES`]).
const MAX_STREAMED: usize = 1024;

/// Steps (pieces made and solver steps) such a comparison may take.
const STREAM_BUDGET: u32 = 512;

/// Steps one refined decision (intersection and containment of unions)
/// may take before it answers "may share" or "does not cover".
pub(super) const UNION_BUDGET: u32 = 1024;

/// A view's bytes as given: `base + Σ i_k·s_k + [0, width)` in bytes, or in
/// nibbles when `nibbles` (then `base` is the first nibble).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Raw {
    pub(super) base: i128,
    pub(super) width: i128,
    pub(super) nibbles: bool,
    pub(super) len: usize,
    pub(super) dims: [Dim; MAX_DIMS],
}

impl Raw {
    pub(super) fn dims(&self) -> &[Dim] {
        self.dims.get(..self.len).unwrap_or_default()
    }

    /// From the first byte to one past the last byte.
    pub(super) fn byte_bounds(&self) -> (i128, i128) {
        let end = self.base + extent_of(self.width, self.dims());
        if self.nibbles {
            (div_floor(self.base, 2), div_floor(end - 1, 2) + 1)
        } else {
            (self.base, end)
        }
    }

    /// A nested superset of the bytes (the canonical set when the levels
    /// nest), and whether it is exact.
    pub(super) fn superset(&self) -> (Set, bool) {
        if !self.nibbles {
            return normalize(self.base, self.width, self.dims());
        }
        // Solve in nibbles, then map nibble p to byte ⌊p/2⌋. With every
        // stride even (and an even start) that map is exact: widths round
        // up and strides halve.
        let (nibbles, exact) = normalize(self.base, self.width, self.dims());
        if rem(nibbles.base, 2) == 0 && nibbles.dims().iter().all(|d| d.s % 2 == 0) {
            let halved = nibbles.dims().iter().map(|d| Dim { n: d.n, s: d.s / 2 });
            let mut dims = [Dim::default(); MAX_DIMS];
            let mut len = 0;
            for (slot, d) in dims.iter_mut().zip(halved) {
                *slot = d;
                len += 1;
            }
            let run = div_ceil(nibbles.width, 2);
            let (set, exact_bytes) = normalize(
                div_floor(nibbles.base, 2),
                run,
                dims.get(..len).unwrap_or_default(),
            );
            return (set, exact && exact_bytes);
        }
        let (lo, hi) = nibbles.bounds();
        let first = div_floor(lo, 2);
        (Set::run(first, div_floor(hi - 1, 2) + 1 - first), false)
    }

    /// Calls `emit` with nested byte sets whose union is exactly the view's
    /// bytes, until it breaks. `None` when more than `*cap` sets would be
    /// needed (`cap` counts down).
    pub(super) fn for_each_piece(
        &self,
        cap: &mut usize,
        emit: &mut dyn FnMut(&Set) -> ControlFlow<()>,
    ) -> Option<ControlFlow<()>> {
        let mut over = false;
        let mut counted = |s: &Set| match cap.checked_sub(1) {
            Some(left) => {
                *cap = left;
                emit(s)
            }
            None => {
                over = true;
                ControlFlow::Break(())
            }
        };
        let flow = if self.nibbles {
            parity(self.base, self.width, self.dims, self.len, 0, &mut counted)
        } else {
            split(self.base, self.width, self.dims, self.len, &mut counted)
        }?;
        (!over).then_some(flow)
    }
}

/// Splits `dims` until every part nests (module docs). The parts of one
/// split are shifted copies of at most two shapes (the counts
/// `⌈(n − c)/r⌉` take two values), so each shape is split once and its
/// pieces are emitted at every shift.
fn split(
    base: i128,
    width: i128,
    dims: [Dim; MAX_DIMS],
    len: usize,
    emit: &mut dyn FnMut(&Set) -> ControlFlow<()>,
) -> Option<ControlFlow<()>> {
    let Interleave { dim, inner } = match nest(base, width, dims.get(..len)?) {
        Ok(set) => return Some(emit(&set)),
        Err(at) => at,
    };
    let d = *dims.get(dim)?;
    // r ≥ 2 (the stride is shorter than `inner`), and each part has fewer
    // blocks than `d`: parts c < n mod r have ⌊n/r⌋ + 1, the others ⌊n/r⌋.
    let r = div_ceil(inner, d.s).min(d.n);
    let (q, extra) = (div_floor(d.n, r), rem(d.n, r));
    for (n, shifts) in [(q + 1, 0..extra), (q, extra..r)] {
        if n == 0 || shifts.is_empty() {
            continue;
        }
        let mut part = dims;
        *part.get_mut(dim)? = Dim { n, s: r * d.s };
        let flow = split(base, width, part, len, &mut |p| {
            for c in shifts.clone() {
                emit(&p.shifted(c * d.s))?;
            }
            ControlFlow::Continue(())
        })?;
        if flow.is_break() {
            return Some(ControlFlow::Break(()));
        }
    }
    Some(ControlFlow::Continue(()))
}

/// Splits every odd nibble stride from `from` on by parity, then maps the
/// nibbles to bytes and splits those (module docs).
fn parity(
    base: i128,
    width: i128,
    dims: [Dim; MAX_DIMS],
    len: usize,
    from: usize,
    emit: &mut dyn FnMut(&Set) -> ControlFlow<()>,
) -> Option<ControlFlow<()>> {
    let odd = (from..len).find(|&k| dims.get(k).is_some_and(|d| d.n > 1 && d.s % 2 != 0));
    let Some(k) = odd else {
        // Every stride even: nibble base + E + j (E even, j < width) is
        // byte E/2 + ⌊(base + j)/2⌋, a run from ⌊base/2⌋.
        let first = div_floor(base, 2);
        let run = div_floor(base + width - 1, 2) + 1 - first;
        let mut bytes = dims;
        for d in bytes.iter_mut().take(len) {
            d.s /= 2;
        }
        return split(first, run, bytes, len, emit);
    };
    let d = *dims.get(k)?;
    for (c, n) in [(0, div_ceil(d.n, 2)), (1, div_floor(d.n, 2))] {
        let mut part = dims;
        *part.get_mut(k)? = Dim { n, s: 2 * d.s };
        if parity(base + c * d.s, width, part, len, k + 1, emit)?.is_break() {
            return Some(ControlFlow::Break(()));
        }
    }
    Some(ControlFlow::Continue(()))
}

/// A union of at most [`MAX_PIECES`] nested sets, filled in place (the
/// slots are large; only their tags are written until used).
pub(super) struct Pieces {
    len: usize,
    sets: [Option<Set>; MAX_PIECES],
}

impl Pieces {
    pub(super) fn new() -> Pieces {
        Pieces {
            len: 0,
            sets: [None; MAX_PIECES],
        }
    }

    /// Adds a piece; `false` when full.
    fn push(&mut self, set: &Set) -> bool {
        let Some(slot) = self.sets.get_mut(self.len) else {
            return false;
        };
        *slot = Some(*set);
        self.len += 1;
        true
    }

    /// Makes `self` the one piece `set`.
    pub(super) fn set_one(&mut self, set: &Set) {
        self.len = 0;
        self.push(set);
    }

    /// Makes `self` the exact pieces of `raw`; `false` (and `self` empty)
    /// when it needs too many.
    pub(super) fn set_raw(&mut self, raw: &Raw) -> bool {
        self.len = 0;
        let mut cap = MAX_PIECES;
        let done = raw.for_each_piece(&mut cap, &mut |s| {
            if self.push(s) {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        });
        let whole = done.is_some_and(|d| d.is_continue());
        if !whole {
            self.len = 0;
        }
        whole
    }

    pub(super) fn sets(&self) -> impl Iterator<Item = &Set> + Clone {
        self.sets.iter().take(self.len).flatten()
    }

    fn count(&self) -> usize {
        self.len
    }
}

/// Whether the unions `a` and `b` share a byte; `None` when the solver
/// cannot tell (treat as yes).
pub(super) fn intersects(a: &Pieces, b: &Pieces, budget: &mut u32) -> Option<bool> {
    let mut undecided = false;
    for x in a.sets() {
        for y in b.sets() {
            match solve::intersects(x, y, budget) {
                Some(true) => return Some(true),
                Some(false) => {}
                None if *budget == 0 => return None,
                None => undecided = true,
            }
        }
    }
    if undecided { None } else { Some(false) }
}

/// Whether the view `raw` (of many pieces) shares a byte with the union
/// `b`, comparing each piece of `raw` as it is made; `None` when the
/// solver cannot tell, or `raw` has more than [`MAX_STREAMED`] pieces.
pub(super) fn stream(raw: &Raw, b: &Pieces, budget: &mut u32) -> Option<bool> {
    let mut own = STREAM_BUDGET.min(*budget);
    let flow = stream_within(raw, b, &mut own);
    *budget -= STREAM_BUDGET.min(*budget) - own;
    flow
}

fn stream_within(raw: &Raw, b: &Pieces, budget: &mut u32) -> Option<bool> {
    let (mut met, mut undecided) = (false, false);
    let mut cap = MAX_STREAMED;
    let done = raw.for_each_piece(&mut cap, &mut |x| {
        // Making a piece costs a step too.
        let Some(left) = budget.checked_sub(1) else {
            undecided = true;
            return ControlFlow::Break(());
        };
        *budget = left;
        for y in b.sets() {
            match solve::intersects(x, y, budget) {
                Some(true) => {
                    met = true;
                    return ControlFlow::Break(());
                }
                Some(false) => {}
                None if *budget == 0 => {
                    undecided = true;
                    return ControlFlow::Break(());
                }
                None => undecided = true,
            }
        }
        ControlFlow::Continue(())
    });
    if met {
        Some(true)
    } else if undecided || done.is_none() {
        None
    } else {
        Some(false)
    }
}

/// Whether every byte of `b` is a byte of `a`; `None` when the solver
/// cannot tell (treat as no).
pub(super) fn covers(a: &Pieces, b: &Pieces, budget: &mut u32) -> Option<bool> {
    // Cheap disproofs first: the first and last byte of each piece of `b`.
    for y in b.sets() {
        let (lo, hi) = y.bounds();
        if run_end(a, lo).is_none() || run_end(a, hi - 1).is_none() {
            return Some(false);
        }
    }
    for y in b.sets() {
        if !covered(a, y, budget)? {
            return Some(false);
        }
    }
    Some(true)
}

/// Whether the nested set `x` lies in the union `a`. One part of `a` that
/// holds `x` proves it; otherwise each run of `x` is walked across the
/// parts of `a`, and a byte of `x` in none of them disproves it.
fn covered(a: &Pieces, x: &Set, budget: &mut u32) -> Option<bool> {
    if a.sets().any(|p| p == x) {
        return Some(true);
    }
    let mut undecided = false;
    for p in a.sets() {
        match solve::contains(p, x, budget) {
            Some(true) => return Some(true),
            Some(false) => {}
            None => undecided = true,
        }
    }
    if a.count() == 1 {
        return if undecided { None } else { Some(false) };
    }
    // Each step below looks at every part.
    let cost = u32::try_from(a.count()).unwrap_or(u32::MAX);
    let mut index = [0i128; MAX_DIMS];
    let dims = x.dims();
    loop {
        let start = x.base + dims.iter().zip(&index).map(|(d, i)| i * d.s).sum::<i128>();
        let (mut at, end) = (start, start + x.width);
        while at < end {
            *budget = budget.checked_sub(cost)?;
            match run_end(a, at) {
                Some(next) => at = next,
                None => return Some(false),
            }
        }
        // The next run, innermost level fastest.
        let mut k = 0;
        loop {
            let (Some(i), Some(d)) = (index.get_mut(k), dims.get(k)) else {
                return Some(true);
            };
            *i += 1;
            if *i < d.n {
                break;
            }
            *i = 0;
            k += 1;
        }
    }
}

/// One past the last byte of the longest run of a part of `a` that holds
/// byte `at`; `None` when no part holds it.
fn run_end(a: &Pieces, at: i128) -> Option<i128> {
    a.sets().filter_map(|p| run_end_in(p, at)).max()
}

/// One past the end of the run of nested set `x` that holds byte `at`.
fn run_end_in(x: &Set, at: i128) -> Option<i128> {
    let mut off = at - x.base;
    if off < 0 {
        return None;
    }
    // Blocks of a nested level are disjoint and ordered: only block
    // min(⌊off/s⌋, n − 1) can hold the byte.
    for d in x.dims().iter().rev() {
        let i = div_floor(off, d.s).min(d.n - 1);
        off -= i * d.s;
    }
    (off < x.width).then_some(at - off + x.width)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of `base + Σ i_k·s_k + [0, width)` by enumeration.
    fn brute(base: i128, width: i128, dims: &[Dim]) -> Vec<i128> {
        // `bytes` enumerates whatever the levels, nested or not.
        Set::from_parts(base, width, dims.iter().copied()).bytes()
    }

    fn raw(base: i128, width: i128, nibbles: bool, dims: &[Dim]) -> Raw {
        let mut r = Raw {
            base,
            width,
            nibbles,
            len: dims.len(),
            dims: [Dim::default(); MAX_DIMS],
        };
        r.dims[..dims.len()].copy_from_slice(dims);
        r
    }

    fn union_bytes(p: &Pieces) -> Vec<i128> {
        let mut all: Vec<i128> = p.sets().flat_map(Set::bytes).collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Random interleaved views (bytes and nibbles): the pieces nest and
    /// their union is the view's byte set, exactly.
    #[test]
    fn pieces_are_exactly_the_view() {
        let mut seed = 0x0bad_cafe_u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            i128::from((seed >> 33) % m)
        };
        let mut refined = 0;
        for round in 0..20_000 {
            let nibbles = round % 3 == 0;
            let rank = usize::try_from(next(4) + 1).unwrap();
            let dims: Vec<Dim> = (0..rank)
                .map(|_| Dim {
                    n: next(6) + 1,
                    s: next(14) + 1,
                })
                .collect();
            let width = if nibbles { 1 } else { next(4) + 1 };
            let base = if nibbles { 2 * next(20) } else { next(20) };
            let r = raw(base, width, nibbles, &dims);
            let want = if nibbles {
                let mut b: Vec<i128> = brute(base, width, &dims)
                    .into_iter()
                    .map(|p| div_floor(p, 2))
                    .collect();
                b.dedup();
                b
            } else {
                brute(base, width, &dims)
            };
            let (sup, exact) = r.superset();
            let sup_bytes = sup.bytes();
            assert!(want.iter().all(|b| sup_bytes.binary_search(b).is_ok()));
            if exact {
                assert_eq!(sup_bytes, want);
            }
            let mut p = Pieces::new();
            if p.set_raw(&r) {
                refined += 1;
                assert!(p.sets().all(Set::is_nested), "{r:?}");
                assert_eq!(union_bytes(&p), want, "{r:?}");
            }
        }
        assert!(refined > 19_000, "only {refined} refined");
    }

    /// Containment and intersection of unions against their byte lists.
    #[test]
    fn unions_agree_with_bytes() {
        let mut seed = 0x5eed_u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            i128::from((seed >> 33) % m)
        };
        let draw = |next: &mut dyn FnMut(u64) -> i128| {
            let rank = usize::try_from(next(3) + 1).unwrap();
            let dims: Vec<Dim> = (0..rank)
                .map(|_| Dim {
                    n: next(5) + 1,
                    s: next(10) + 1,
                })
                .collect();
            raw(next(30), next(3) + 1, false, &dims)
        };
        let (mut proven, mut covering) = (0, 0);
        for _ in 0..20_000 {
            let (ra, rb) = (draw(&mut next), draw(&mut next));
            let (mut a, mut b) = (Pieces::new(), Pieces::new());
            if !a.set_raw(&ra) || !b.set_raw(&rb) {
                continue;
            }
            let (ab, bb) = (union_bytes(&a), union_bytes(&b));
            let meet = bb.iter().any(|x| ab.binary_search(x).is_ok());
            let within = bb.iter().all(|x| ab.binary_search(x).is_ok());
            let mut budget = UNION_BUDGET;
            if let Some(got) = intersects(&a, &b, &mut budget) {
                assert_eq!(got, meet, "{ra:?} {rb:?}");
            }
            let mut budget = UNION_BUDGET;
            let got = covers(&a, &b, &mut budget);
            if let Some(got) = got {
                assert_eq!(got, within, "{ra:?} {rb:?}");
            }
            covering += u32::from(within);
            proven += u32::from(within && got == Some(true));
        }
        assert!(proven * 100 >= covering * 99, "{proven} of {covering}");
    }
}
