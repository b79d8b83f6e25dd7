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

use crate::ids::{SeqMap, SeqSet, TaskId};

/// How an entry touches its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Read since the last write of its bytes.
    Read,
    /// Written.
    Write,
}

/// The tasks of one entry: the writer of a write; every live reader of a
/// read (readers of identical footprints share one entry, so that N
/// readers of one view cost one entry, not N).
#[derive(Debug, Clone)]
pub(crate) enum Tasks {
    /// One task (every write, and most reads).
    One(TaskId),
    /// Two or more readers, or fewer after some finished: a set, so that
    /// joining and leaving cost O(1) however many read.
    Many(SeqSet<TaskId>),
}

impl Tasks {
    /// Whether `t` is one of them.
    pub(crate) fn contains(&self, t: TaskId) -> bool {
        match self {
            Tasks::One(x) => *x == t,
            Tasks::Many(s) => s.contains(&t),
        }
    }

    /// How many.
    pub(crate) fn len(&self) -> usize {
        match self {
            Tasks::One(_) => 1,
            Tasks::Many(s) => s.len(),
        }
    }

    /// Each of them (in no particular order).
    pub(crate) fn iter(&self) -> impl Iterator<Item = TaskId> + '_ {
        let (one, many) = match self {
            Tasks::One(t) => (Some(*t), None),
            Tasks::Many(s) => (None, Some(s.iter().copied())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    fn add(&mut self, t: TaskId) -> bool {
        match self {
            Tasks::One(x) if *x == t => false,
            Tasks::One(x) => {
                let mut s = SeqSet::default();
                s.insert(*x);
                s.insert(t);
                *self = Tasks::Many(s);
                true
            }
            Tasks::Many(s) => s.insert(t),
        }
    }

    /// Removes `t`; whether none is left.
    fn remove(&mut self, t: TaskId) -> bool {
        match self {
            Tasks::One(x) => *x == t,
            Tasks::Many(s) => {
                s.remove(&t);
                s.is_empty()
            }
        }
    }
}

/// One live access.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) kind: Kind,
    pub(crate) tasks: Tasks,
    pub(crate) footprint: Footprint,
    /// The task failed, was skipped or cancelled: it never wrote these
    /// bytes, so whoever reads them must be skipped too. Only writes are
    /// poisoned.
    pub(crate) poisoned: bool,
}

impl Entry {
    /// The task of a write entry (for a read, one of its readers).
    pub(crate) fn task(&self) -> TaskId {
        match &self.tasks {
            Tasks::One(t) => *t,
            Tasks::Many(s) => s.iter().copied().min().unwrap_or(TaskId(0)),
        }
    }
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

/// While a grid holds at most this many entries, a footprint with a
/// different innermost stride re-chooses it (a cheap rebuild).
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

/// Where entries lie: their rectangles, in a cell hash or an R-tree. A
/// grid holds ids only; the footprints live in the [`BufferIndex`].
#[derive(Debug)]
pub(crate) struct Grid {
    row: u64,
    /// Cell height (rows) and width (columns), in grid units.
    cell: (u64, u64),
    /// The entries in each cell: a few at a time (inline: a cell that
    /// empties and fills again, as a tile's does, allocates nothing).
    /// Keyed by the cell's number in row-major order ([`Grid::key`]): the
    /// cells of views submitted one after another (rows, tiles) are then
    /// neighbours in the table too.
    cells: SeqMap<u64, smallvec::SmallVec<[u64; 3]>>,
    wide: RTree<Item, Params>,
    pub(crate) len: usize,
}

impl Default for Grid {
    fn default() -> Self {
        Grid {
            row: 4096,
            cell: (1, 4096),
            cells: SeqMap::default(),
            wide: RTree::new_with_params(),
            len: 0,
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

impl Grid {
    /// The number of cell (`cr`, `cc`): rows of cells times cells per row
    /// (coordinates are clamped to 2³⁰, so it fits).
    fn key(&self, cr: i64, cc: i64) -> u64 {
        let per_row = clamp(self.row) / i64::try_from(self.cell.1).unwrap_or(1).max(1) + 2;
        u64::try_from(cr.saturating_mul(per_row).saturating_add(cc)).unwrap_or(u64::MAX)
    }

    /// Appends the ids of entries whose rectangles meet `fp`'s (a
    /// superset of those that share a byte; possibly with repeats).
    pub(crate) fn candidates(&self, fp: &Footprint, out: &mut Vec<u64>) {
        let rs = rects(fp, self.row);
        if cell_count(&rs, self.cell) <= SCAN_CELLS {
            for r in rs.iter() {
                let (r0, r1, c0, c1) = cell_span(r, self.cell);
                for cr in r0..=r1 {
                    for cc in c0..=c1 {
                        if let Some(list) = self.cells.get(&self.key(cr, cc)) {
                            out.extend_from_slice(list);
                        }
                    }
                }
            }
        } else {
            out.extend(self.cells.values().flatten());
        }
        if self.wide.size() > 0 {
            for r in rs.iter() {
                out.extend(
                    self.wide
                        .locate_in_envelope_intersecting(*r)
                        .map(|i| i.entry),
                );
            }
        }
    }

    pub(crate) fn place(&mut self, id: u64, fp: &Footprint) {
        let rs = rects(fp, self.row);
        if cell_count(&rs, self.cell) <= SMALL_CELLS {
            for r in rs.iter() {
                let (r0, r1, c0, c1) = cell_span(r, self.cell);
                for cr in r0..=r1 {
                    for cc in c0..=c1 {
                        let key = self.key(cr, cc);
                        let list = self.cells.entry(key).or_default();
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

    /// Takes out entry `id`, placed with footprint `fp`. Where an entry
    /// lives is a function of its footprint and the grid, so it is
    /// recomputed rather than stored.
    pub(crate) fn unplace(&mut self, id: u64, fp: &Footprint) {
        self.len = self.len.saturating_sub(1);
        let rs = rects(fp, self.row);
        if cell_count(&rs, self.cell) <= SMALL_CELLS {
            for r in rs.iter() {
                let (r0, r1, c0, c1) = cell_span(r, self.cell);
                for cr in r0..=r1 {
                    for cc in c0..=c1 {
                        let key = self.key(cr, cc);
                        if let Some(list) = self.cells.get_mut(&key) {
                            if let Some(pos) = list.iter().position(|x| *x == id) {
                                list.swap_remove(pos);
                            }
                            if list.is_empty() {
                                self.cells.remove(&key);
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
    }

    /// Whether a new entry of footprint `fp` would re-choose the grid,
    /// following the shape of what it is given while it is small: the
    /// grid's row becomes the footprint's innermost stride and a cell the
    /// size of its first rectangle (a tile).
    pub(crate) fn wants_regrid(&self, fp: &Footprint) -> Option<(u64, (u64, u64))> {
        if self.len > REGRID_LIMIT {
            return None;
        }
        let row = fp.levels().next().map_or(self.row, |(_, s)| s).max(1);
        let shape = rects(fp, row).first().map_or((1, row), |r| {
            let (lo, hi) = (r.lower(), r.upper());
            (
                u64::try_from(hi[0] - lo[0] + 1).unwrap_or(1),
                u64::try_from(hi[1] - lo[1] + 1).unwrap_or(row),
            )
        });
        ((row, shape) != (self.row, self.cell)).then_some((row, shape))
    }

    /// Re-chooses the grid and places `placed` again.
    pub(crate) fn regrid<'a>(
        &mut self,
        (row, cell): (u64, (u64, u64)),
        placed: impl Iterator<Item = (u64, &'a Footprint)>,
    ) {
        self.row = row;
        self.cell = cell;
        self.cells.clear();
        self.wide = RTree::new_with_params();
        for (id, fp) in placed {
            self.place(id, fp);
        }
    }

    /// The cells and the R-tree hold exactly the rectangles of `placed`.
    pub(crate) fn check<'a>(
        &self,
        placed: impl Iterator<Item = &'a Footprint>,
    ) -> Result<(), String> {
        let (mut in_cells, mut in_tree, mut n) = (0usize, 0usize, 0usize);
        for fp in placed {
            n += 1;
            let rs = rects(fp, self.row);
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
        if in_tree != self.wide.size() || cells > in_cells || n != self.len {
            return Err(format!(
                "index: tree holds {} (expected {in_tree}), cells hold {cells} (at most {in_cells}), {} entries counted (expected {n})",
                self.wide.size(),
                self.len
            ));
        }
        Ok(())
    }
}

/// Live accesses to one buffer: write entries and read entries in
/// separate grids (a reader looks for writers only, so however many read
/// the same bytes, a new reader's query costs what a private reader's
/// does), and read entries grouped by footprint (a reader of bytes that
/// others read with the same view joins their entry: O(1)).
#[derive(Debug, Default)]
pub(crate) struct BufferIndex {
    writes: Grid,
    reads: Grid,
    /// By entry id: ids are handed out in increasing order. Boxed: a
    /// table of 10⁶ live entries moves 8-byte slots when it grows, not
    /// 180-byte ones.
    entries: SeqMap<u64, Box<Entry>>,
    /// The read entry of each footprint read.
    groups: FxHashMap<Footprint, u64>,
}

impl BufferIndex {
    /// Live entries that share a byte with `fp`, with how `fp` relates to
    /// each (`Covers` when `fp` covers the entry): writes only, or reads
    /// too.
    #[cfg(test)]
    pub(crate) fn matches(&self, fp: &Footprint, reads: bool) -> Vec<(u64, Overlap)> {
        let mut out = Vec::new();
        self.matches_into(fp, reads, &mut Vec::new(), &mut out);
        out
    }

    /// [`BufferIndex::matches`] into `out` (cleared first), with
    /// `candidates` as scratch: buffers the caller keeps, so that a query
    /// allocates nothing.
    pub(crate) fn matches_into(
        &self,
        fp: &Footprint,
        reads: bool,
        candidates: &mut Vec<u64>,
        out: &mut Vec<(u64, Overlap)>,
    ) {
        candidates.clear();
        out.clear();
        self.writes.candidates(fp, candidates);
        if reads {
            self.reads.candidates(fp, candidates);
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
        self.entries.get(&id).map(|e| &**e)
    }

    /// Adds a write entry under `id`.
    pub(crate) fn insert_write(
        &mut self,
        id: u64,
        task: TaskId,
        footprint: Footprint,
        poisoned: bool,
    ) {
        self.add(
            id,
            Entry {
                kind: Kind::Write,
                tasks: Tasks::One(task),
                footprint,
                poisoned,
            },
        );
    }

    /// Records that `task` reads `footprint`: it joins the read entry of
    /// that footprint, or a new one under `new_id()`. Returns the entry,
    /// and whether `task` is new to it (a task reading one view twice is
    /// one reader).
    pub(crate) fn add_reader(
        &mut self,
        task: TaskId,
        footprint: Footprint,
        new_id: impl FnOnce() -> u64,
    ) -> (u64, bool) {
        if let Some(&id) = self.groups.get(&footprint) {
            if let Some(e) = self.entries.get_mut(&id) {
                return (id, e.tasks.add(task));
            }
        }
        let id = new_id();
        self.groups.insert(footprint, id);
        self.add(
            id,
            Entry {
                kind: Kind::Read,
                tasks: Tasks::One(task),
                footprint,
                poisoned: false,
            },
        );
        (id, true)
    }

    fn add(&mut self, id: u64, e: Entry) {
        let grid = match e.kind {
            Kind::Read => &mut self.reads,
            Kind::Write => &mut self.writes,
        };
        if let Some(shape) = grid.wants_regrid(&e.footprint) {
            let kind = e.kind;
            grid.regrid(
                shape,
                self.entries
                    .iter()
                    .filter(|(_, x)| x.kind == kind)
                    .map(|(id, x)| (*id, &x.footprint)),
            );
        }
        grid.place(id, &e.footprint);
        grid.len += 1;
        self.entries.insert(id, Box::new(e));
    }

    /// Marks a write entry poisoned.
    pub(crate) fn poison(&mut self, id: u64) {
        if let Some(e) = self.entries.get_mut(&id) {
            if e.kind == Kind::Write {
                e.poisoned = true;
            }
        }
    }

    /// Takes `task` out of entry `id`; the entry goes when no task is left
    /// in it, and is returned then.
    pub(crate) fn leave(&mut self, id: u64, task: TaskId) -> Option<Entry> {
        let e = self.entries.get_mut(&id)?;
        if e.tasks.remove(task) {
            return self.remove(id);
        }
        None
    }

    /// Removes an entry, whoever holds it.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = *self.entries.remove(&id)?;
        match e.kind {
            Kind::Read => {
                self.reads.unplace(id, &e.footprint);
                if self.groups.get(&e.footprint) == Some(&id) {
                    self.groups.remove(&e.footprint);
                }
            }
            Kind::Write => self.writes.unplace(id, &e.footprint),
        }
        Some(e)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Live entries (a read entry counts once, whatever its readers).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = (&u64, &Entry)> {
        self.entries.iter().map(|(id, e)| (id, &**e))
    }

    /// The grids hold exactly the entries' rectangles, and each read entry
    /// is its footprint's group.
    pub(crate) fn check(&self) -> Result<(), String> {
        for kind in [Kind::Read, Kind::Write] {
            let grid = match kind {
                Kind::Read => &self.reads,
                Kind::Write => &self.writes,
            };
            grid.check(
                self.entries
                    .values()
                    .filter(|e| e.kind == kind)
                    .map(|e| &e.footprint),
            )?;
        }
        let reads = self
            .entries
            .values()
            .filter(|e| e.kind == Kind::Read)
            .count();
        if reads != self.groups.len() {
            return Err(format!(
                "index: {reads} read entries but {} groups",
                self.groups.len()
            ));
        }
        for (fp, id) in &self.groups {
            match self.entries.get(id) {
                Some(e) if e.kind == Kind::Read && e.footprint == *fp && !e.poisoned => {}
                _ => {
                    return Err(format!(
                        "index: group {id} is not a read entry of its footprint"
                    ));
                }
            }
        }
        if let Some((id, _)) = self.entries.iter().find(|(_, e)| e.tasks.len() == 0) {
            return Err(format!("index: entry {id} has no task"));
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
    /// byte, writes alone or reads too, however the grids were chosen; a
    /// reader of an identical footprint joins its entry.
    #[test]
    fn matches_agree_with_a_scan() {
        let mut rng = Rng(22);
        for class in ViewClass::ALL {
            let mut idx = BufferIndex::default();
            // (entry, footprint, is a write)
            let mut all: Vec<(u64, Footprint, bool)> = Vec::new();
            let mut next = 1000u64;
            for i in 0..300u64 {
                let (v, _) = view_pair(class, &mut rng);
                let fp = Footprint::of(&v);
                for reads in [false, true] {
                    let mut got: Vec<u64> = idx
                        .matches(&fp, reads)
                        .into_iter()
                        .map(|(id, _)| id)
                        .collect();
                    got.sort_unstable();
                    let mut want: Vec<u64> = all
                        .iter()
                        .filter(|(_, f, w)| (reads || *w) && fp.overlap(f) != Overlap::Disjoint)
                        .map(|(id, _, _)| *id)
                        .collect();
                    want.sort_unstable();
                    want.dedup();
                    assert_eq!(got, want, "{class:?} at {i}, reads {reads}");
                }
                if i % 2 == 0 {
                    idx.insert_write(i, TaskId(i), fp, false);
                    all.push((i, fp, true));
                } else {
                    // Every third read repeats an earlier read's footprint.
                    let fp = match all.iter().rev().find(|(_, _, w)| !*w) {
                        Some(&(_, f, _)) if i % 3 == 0 => f,
                        _ => fp,
                    };
                    let (id, new) = idx.add_reader(TaskId(i), fp, || {
                        next += 1;
                        next
                    });
                    assert!(new);
                    if let Some(&(old, _, _)) = all.iter().find(|(_, f, w)| !*w && *f == fp) {
                        assert_eq!(id, old, "{class:?} at {i}: a second reader joins");
                    }
                    all.push((id, fp, false));
                    assert!(!idx.add_reader(TaskId(i), fp, || unreachable!()).1);
                }
                if i % 3 == 0 {
                    let (id, _, w) = all.remove(0);
                    if w {
                        idx.remove(id).unwrap();
                    } else {
                        let reader = idx.get(id).unwrap().task();
                        let gone = idx.leave(id, reader).is_some();
                        assert_eq!(gone, !all.iter().any(|(x, _, _)| *x == id));
                    }
                }
                idx.check().unwrap();
            }
        }
    }
}
