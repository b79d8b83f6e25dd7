//! The per-buffer index of live accesses: each footprint's rectangles in a
//! (row, column) grid of the buffer, kept in a hash of fixed-size cells
//! when they are small (tiles: O(1) per access whatever the number of live
//! entries) and in an R-tree when they span many cells (O(log k)). Finding
//! the accesses that may share bytes with a new one costs about O(cells +
//! log k + matches) for k live entries, and the overlap engine decides each
//! candidate exactly.
//!
//! The grid has rows of `S` bytes, where `S` is the innermost stride of the
//! footprints seen while the index is small (for the tiles of a row-major
//! matrix, its row pitch). Byte `b` sits in row `b / S`, column `b % S`.
//! A footprint whose levels are multiples of `S` and whose inner block fits
//! a row maps to one rectangle (two when the block wraps into the next
//! row); any other footprint maps to the rectangles of its bounding range
//! (at most three). Either way every byte of the footprint lies in its
//! rectangles, so two footprints that share a byte have intersecting
//! rectangles: the grid never hides a candidate, it only prunes.

use rstar::{AABB, RStarInsertionStrategy, RTree, RTreeObject, RTreeParams};
use rustc_hash::FxHashMap;
use strata_wire::{Footprint, Overlap};

use crate::ids::TaskId;

/// How an entry touches its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Read since the last write of its bytes.
    Read,
    /// Written.
    Write,
}

/// One live access.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) task: TaskId,
    pub(crate) kind: Kind,
    pub(crate) footprint: Footprint,
    /// The task failed, was skipped or cancelled: it never wrote these
    /// bytes, so whoever reads them must be skipped too.
    pub(crate) poisoned: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct Item {
    env: AABB<[i64; 2]>,
    entry: u64,
}

impl RTreeObject for Item {
    type Envelope = AABB<[i64; 2]>;
    fn envelope(&self) -> Self::Envelope {
        self.env
    }
}

/// Grid coordinates are clamped below this, keeping R-tree area arithmetic
/// inside i64; clamping is monotone, so intersecting rectangles stay
/// intersecting.
const COORD_MAX: i64 = 1 << 30;

/// While the index holds at most this many entries, a footprint with a
/// different innermost stride re-chooses the grid (a cheap rebuild).
const REGRID_LIMIT: usize = 64;

/// Wider nodes than rstar's default: a shallower tree touches fewer nodes
/// per query, which keeps the per-access cost nearly flat in the number of
/// live entries.
#[derive(Debug)]
pub(crate) struct Params;

impl RTreeParams for Params {
    const MIN_SIZE: usize = 6;
    const MAX_SIZE: usize = 16;
    const REINSERTION_COUNT: usize = 3;
    type DefaultInsertionStrategy = RStarInsertionStrategy;
}

/// An entry whose rectangles cover at most this many cells lives in the
/// cell hash; a larger one in the R-tree.
const SMALL_CELLS: u64 = 16;

/// A query covering more cells than this scans the small entries instead
/// of the cells.
const SCAN_CELLS: u64 = 1024;

/// Live accesses to one buffer.
#[derive(Debug)]
pub(crate) struct BufferIndex {
    row: u64,
    /// Cell height (rows) and width (columns), in grid units.
    cell: (u64, u64),
    /// The entries in each cell: a few at a time (inline: a cell that
    /// empties and fills again, as a tile's does, allocates nothing).
    cells: FxHashMap<(i64, i64), smallvec::SmallVec<[u64; 3]>>,
    wide: RTree<Item, Params>,
    entries: FxHashMap<u64, Entry>,
}

impl Default for BufferIndex {
    fn default() -> Self {
        BufferIndex {
            row: 4096,
            cell: (1, 4096),
            cells: FxHashMap::default(),
            wide: RTree::new_with_params(),
            entries: FxHashMap::default(),
        }
    }
}

/// The cells rectangle `r` covers, as (first row, last row, first col,
/// last col) in cell units.
fn cell_span(r: &AABB<[i64; 2]>, cell: (u64, u64)) -> (i64, i64, i64, i64) {
    let (ch, cw) = (
        i64::try_from(cell.0).unwrap_or(1).max(1),
        i64::try_from(cell.1).unwrap_or(1).max(1),
    );
    let (lo, hi) = (r.lower(), r.upper());
    (lo[0] / ch, hi[0] / ch, lo[1] / cw, hi[1] / cw)
}

fn cell_count(rs: &[AABB<[i64; 2]>], cell: (u64, u64)) -> u64 {
    rs.iter()
        .map(|r| {
            let (r0, r1, c0, c1) = cell_span(r, cell);
            u64::try_from((r1 - r0 + 1).saturating_mul(c1 - c0 + 1)).unwrap_or(u64::MAX)
        })
        .fold(0u64, u64::saturating_add)
}

impl BufferIndex {
    /// Live entries that share a byte with `fp`, with how `fp` relates to
    /// each (`Covers` when `fp` covers the entry).
    #[cfg(test)]
    pub(crate) fn matches(&self, fp: &Footprint) -> Vec<(u64, Overlap)> {
        let mut out = Vec::new();
        self.matches_into(fp, &mut Vec::new(), &mut out);
        out
    }

    /// [`BufferIndex::matches`] into `out` (cleared first), with
    /// `candidates` as scratch: buffers the caller keeps, so that a query
    /// allocates nothing.
    pub(crate) fn matches_into(
        &self,
        fp: &Footprint,
        candidates: &mut Vec<u64>,
        out: &mut Vec<(u64, Overlap)>,
    ) {
        let rs = rects(fp, self.row);
        candidates.clear();
        out.clear();
        if cell_count(&rs, self.cell) <= SCAN_CELLS {
            for r in rs.iter() {
                let (r0, r1, c0, c1) = cell_span(r, self.cell);
                for cr in r0..=r1 {
                    for cc in c0..=c1 {
                        if let Some(list) = self.cells.get(&(cr, cc)) {
                            candidates.extend_from_slice(list);
                        }
                    }
                }
            }
        } else {
            candidates.extend(self.cells.values().flatten());
        }
        if self.wide.size() > 0 {
            for r in rs.iter() {
                candidates.extend(
                    self.wide
                        .locate_in_envelope_intersecting(*r)
                        .map(|i| i.entry),
                );
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        out.extend(candidates.iter().filter_map(|&id| {
            let e = self.entries.get(&id)?;
            let rel = fp.overlap(&e.footprint);
            (rel != Overlap::Disjoint).then_some((id, rel))
        }));
    }

    pub(crate) fn get(&self, id: u64) -> Option<&Entry> {
        self.entries.get(&id)
    }

    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut Entry> {
        self.entries.get_mut(&id)
    }

    /// Adds an entry under `id`.
    pub(crate) fn insert(&mut self, id: u64, task: TaskId, kind: Kind, footprint: Footprint) {
        if self.entries.len() <= REGRID_LIMIT {
            self.maybe_regrid(&footprint);
        }
        self.place(id, &footprint);
        self.entries.insert(
            id,
            Entry {
                task,
                kind,
                footprint,
                poisoned: false,
            },
        );
    }

    /// Removes an entry.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        // Where an entry lives is a function of its footprint and the grid,
        // so it is recomputed rather than stored.
        let rs = rects(&e.footprint, self.row);
        if cell_count(&rs, self.cell) <= SMALL_CELLS {
            for r in rs.iter() {
                let (r0, r1, c0, c1) = cell_span(r, self.cell);
                for cr in r0..=r1 {
                    for cc in c0..=c1 {
                        if let Some(list) = self.cells.get_mut(&(cr, cc)) {
                            if let Some(pos) = list.iter().position(|x| *x == id) {
                                list.swap_remove(pos);
                            }
                            if list.is_empty() {
                                self.cells.remove(&(cr, cc));
                            }
                        }
                    }
                }
            }
        } else {
            for &env in rs.iter() {
                self.wide.remove(&Item { env, entry: id });
            }
        }
        Some(e)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = (&u64, &Entry)> {
        self.entries.iter()
    }

    fn place(&mut self, id: u64, fp: &Footprint) {
        let rs = rects(fp, self.row);
        if cell_count(&rs, self.cell) <= SMALL_CELLS {
            for r in rs.iter() {
                let (r0, r1, c0, c1) = cell_span(r, self.cell);
                for cr in r0..=r1 {
                    for cc in c0..=c1 {
                        let list = self.cells.entry((cr, cc)).or_default();
                        if !list.contains(&id) {
                            list.push(id);
                        }
                    }
                }
            }
        } else {
            for &env in rs.iter() {
                self.wide.insert(Item { env, entry: id });
            }
        }
    }

    /// While the index is small, follows the shape of what it is given: the
    /// grid's row becomes the footprint's innermost stride and a cell the
    /// size of its first rectangle (a tile).
    fn maybe_regrid(&mut self, fp: &Footprint) {
        let row = fp.levels().next().map_or(self.row, |(_, s)| s).max(1);
        let shape = rects(fp, row).first().map_or((1, row), |r| {
            let (lo, hi) = (r.lower(), r.upper());
            (
                u64::try_from(hi[0] - lo[0] + 1).unwrap_or(1),
                u64::try_from(hi[1] - lo[1] + 1).unwrap_or(row),
            )
        });
        if (row, shape) == (self.row, self.cell) {
            return;
        }
        self.row = row;
        self.cell = shape;
        self.cells.clear();
        self.wide = RTree::new_with_params();
        let ids: Vec<(u64, Footprint)> = self
            .entries
            .iter()
            .map(|(id, e)| (*id, e.footprint))
            .collect();
        for (id, fp) in ids {
            self.place(id, &fp);
        }
    }

    /// The cells and the R-tree hold exactly the entries' rectangles.
    pub(crate) fn check(&self) -> Result<(), String> {
        let (mut in_cells, mut in_tree) = (0usize, 0usize);
        for e in self.entries.values() {
            let rs = rects(&e.footprint, self.row);
            if cell_count(&rs, self.cell) <= SMALL_CELLS {
                in_cells += rs
                    .iter()
                    .map(|r| {
                        let (r0, r1, c0, c1) = cell_span(r, self.cell);
                        usize::try_from((r1 - r0 + 1) * (c1 - c0 + 1)).unwrap_or(0)
                    })
                    .sum::<usize>();
            } else {
                in_tree += rs.len();
            }
        }
        let cells: usize = self.cells.values().map(|l| l.len()).sum();
        if in_tree != self.wide.size() || cells > in_cells {
            return Err(format!(
                "index: tree holds {} (expected {in_tree}), cells hold {cells} (at most {in_cells})",
                self.wide.size()
            ));
        }
        Ok(())
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX).min(COORD_MAX)
}

fn rect(r0: u64, c0: u64, r1: u64, c1: u64) -> AABB<[i64; 2]> {
    AABB::from_corners([clamp(r0), clamp(c0)], [clamp(r1), clamp(c1)])
}

/// One to three rectangles, kept inline (every access computes them
/// several times: an allocation each time showed in the engine's
/// profile).
#[derive(Clone, Copy)]
struct Rects {
    r: [AABB<[i64; 2]>; 3],
    n: usize,
}

impl Rects {
    fn of(rs: &[AABB<[i64; 2]>]) -> Rects {
        let mut r = [AABB::from_point([0, 0]); 3];
        r[..rs.len()].copy_from_slice(rs);
        Rects { r, n: rs.len() }
    }
}

impl std::ops::Deref for Rects {
    type Target = [AABB<[i64; 2]>];
    fn deref(&self) -> &Self::Target {
        &self.r[..self.n]
    }
}

impl std::fmt::Debug for Rects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Rectangles (inclusive corners, in rows of `row` bytes) that contain
/// every byte of `fp`.
fn rects(fp: &Footprint, row: u64) -> Rects {
    let range = fp.byte_range();
    let (lo, hi) = (range.start, range.end.max(range.start + 1));
    let base = fp.base();
    // The first level whose stride is a multiple of the row: everything
    // inside it is the block; the levels from it on only move the block by
    // whole rows.
    let mut inner = fp.run_bytes();
    let mut rows_span = 0u64;
    let mut blocked = false;
    // Every level from the first whole-row one on must be whole rows too.
    let mut gridded = true;
    for (n, s) in fp.levels() {
        if !blocked && s % row == 0 {
            blocked = true;
        }
        if blocked {
            gridded &= s % row == 0;
            rows_span = rows_span.saturating_add((n - 1).saturating_mul(s / row));
        } else {
            inner = inner.saturating_add((n - 1).saturating_mul(s));
        }
    }
    let (r0, c0) = (base / row, base % row);
    if blocked && gridded && inner <= row {
        let r1 = r0 + rows_span;
        if c0 + inner <= row {
            return Rects::of(&[rect(r0, c0, r1, c0 + inner - 1)]);
        }
        return Rects::of(&[
            rect(r0, c0, r1, row - 1),
            rect(r0 + 1, 0, r1 + 1, c0 + inner - row - 1),
        ]);
    }
    let (r1, c1) = ((hi - 1) / row, (hi - 1) % row);
    let (r0, c0) = (lo / row, lo % row);
    if r0 == r1 {
        return Rects::of(&[rect(r0, c0, r0, c1)]);
    }
    if r1 > r0 + 1 {
        return Rects::of(&[
            rect(r0, c0, r0, row - 1),
            rect(r1, 0, r1, c1),
            rect(r0 + 1, 0, r1 - 1, row - 1),
        ]);
    }
    Rects::of(&[rect(r0, c0, r0, row - 1), rect(r1, 0, r1, c1)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::check::{Rng, ViewClass, byte_set, view_pair};

    /// Every byte of a footprint lies in one of its rectangles, for every
    /// view class and several grid widths.
    #[test]
    fn rectangles_contain_every_byte() {
        let mut rng = Rng(21);
        for class in ViewClass::ALL {
            for _ in 0..3000 {
                let (v, _) = view_pair(class, &mut rng);
                let fp = Footprint::of(&v);
                for row in [1u64, 3, 8, 16, 40, 64, 100] {
                    let rs = rects(&fp, row);
                    for b in byte_set(&v).unwrap() {
                        let (r, c) = (clamp(b / row), clamp(b % row));
                        assert!(
                            rs.iter().any(|e| {
                                use rstar::Envelope;
                                e.contains_point(&[r, c])
                            }),
                            "{class:?} row {row}: byte {b} outside {rs:?} of {v:?}"
                        );
                    }
                }
            }
        }
    }

    /// The index finds exactly the entries the overlap engine says share a
    /// byte, however the grid was chosen.
    #[test]
    fn matches_agree_with_a_scan() {
        let mut rng = Rng(22);
        for class in ViewClass::ALL {
            let mut idx = BufferIndex::default();
            let mut all = Vec::new();
            for i in 0..200u64 {
                let (v, _) = view_pair(class, &mut rng);
                let fp = Footprint::of(&v);
                let mut got: Vec<u64> = idx.matches(&fp).into_iter().map(|(id, _)| id).collect();
                got.sort_unstable();
                let want: Vec<u64> = all
                    .iter()
                    .filter(|(_, f): &&(u64, Footprint)| fp.overlap(f) != Overlap::Disjoint)
                    .map(|(id, _)| *id)
                    .collect();
                assert_eq!(got, want, "{class:?} at {i}");
                idx.insert(i, TaskId(i), Kind::Write, fp);
                all.push((i, fp));
                if i % 3 == 0 {
                    let (id, _) = all.remove(0);
                    idx.remove(id).unwrap();
                }
                idx.check().unwrap();
            }
        }
    }
}
