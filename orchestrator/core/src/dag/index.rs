//! The per-buffer index of live accesses: an R-tree of each footprint's
//! cells in a (row, column) grid of the buffer, so that finding the
//! accesses that may share bytes with a new one costs about O(log k +
//! matches) for k live entries, with the overlap engine deciding each
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

use std::collections::HashMap;

use rstar::{AABB, RTree, RTreeObject};
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
    rects: Vec<AABB<[i64; 2]>>,
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

/// Live accesses to one buffer.
#[derive(Debug)]
pub(crate) struct BufferIndex {
    row: u64,
    tree: RTree<Item>,
    entries: HashMap<u64, Entry>,
}

impl Default for BufferIndex {
    fn default() -> Self {
        BufferIndex {
            row: 4096,
            tree: RTree::new(),
            entries: HashMap::new(),
        }
    }
}

impl BufferIndex {
    /// Live entries that share a byte with `fp`, with how `fp` relates to
    /// each (`Covers` when `fp` covers the entry).
    pub(crate) fn matches(&self, fp: &Footprint) -> Vec<(u64, Overlap)> {
        let mut out: Vec<(u64, Overlap)> = Vec::new();
        for env in rects(fp, self.row) {
            for item in self.tree.locate_in_envelope_intersecting(env) {
                if out.iter().any(|(id, _)| *id == item.entry) {
                    continue;
                }
                if let Some(e) = self.entries.get(&item.entry) {
                    let rel = fp.overlap(&e.footprint);
                    if rel != Overlap::Disjoint {
                        out.push((item.entry, rel));
                    }
                }
            }
        }
        out
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
            if let Some((_, s)) = footprint.levels().next() {
                if s != self.row && s > 0 {
                    self.regrid(s);
                }
            }
        }
        let rects = rects(&footprint, self.row);
        for env in &rects {
            self.tree.insert(Item {
                env: *env,
                entry: id,
            });
        }
        self.entries.insert(
            id,
            Entry {
                task,
                kind,
                footprint,
                poisoned: false,
                rects,
            },
        );
    }

    /// Removes an entry.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        for env in &e.rects {
            self.tree.remove(&Item {
                env: *env,
                entry: id,
            });
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

    fn regrid(&mut self, row: u64) {
        self.row = row;
        let mut items = Vec::new();
        for (id, e) in &mut self.entries {
            e.rects = rects(&e.footprint, row);
            items.extend(e.rects.iter().map(|env| Item {
                env: *env,
                entry: *id,
            }));
        }
        self.tree = RTree::bulk_load(items);
    }

    /// The R-tree holds exactly the entries' rectangles.
    pub(crate) fn check(&self) -> Result<(), String> {
        let rects: usize = self.entries.values().map(|e| e.rects.len()).sum();
        if rects != self.tree.size() {
            return Err(format!(
                "index: {} rectangles in the tree, entries have {rects}",
                self.tree.size()
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

/// Rectangles (inclusive corners, in rows of `row` bytes) that contain
/// every byte of `fp`.
fn rects(fp: &Footprint, row: u64) -> Vec<AABB<[i64; 2]>> {
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
            return vec![rect(r0, c0, r1, c0 + inner - 1)];
        }
        return vec![
            rect(r0, c0, r1, row - 1),
            rect(r0 + 1, 0, r1 + 1, c0 + inner - row - 1),
        ];
    }
    let (r1, c1) = ((hi - 1) / row, (hi - 1) % row);
    let (r0, c0) = (lo / row, lo % row);
    if r0 == r1 {
        return vec![rect(r0, c0, r0, c1)];
    }
    let mut out = vec![rect(r0, c0, r0, row - 1), rect(r1, 0, r1, c1)];
    if r1 > r0 + 1 {
        out.push(rect(r0 + 1, 0, r1 - 1, row - 1));
    }
    out
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
