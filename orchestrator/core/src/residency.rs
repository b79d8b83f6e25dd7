//! The versions of bytes that workers' device caches hold.
//!
//! A staged chip keeps the copies it made of host bytes between tasks,
//! keyed by the exact byte set (`strata_chip_runtime::cache`), but it cannot see
//! writes made elsewhere. The orchestrator, which sees every task end, names
//! for each argument the *version* of its bytes the task must see, and the
//! directory is where those versions come from:
//!
//! - every byte set gets a version the first time it is named, and keeps it
//!   until bytes of it may have changed;
//! - a task's successful write of a byte set gives it the version the task
//!   was sent with, and *forgets* every other byte set it shares a byte
//!   with (found through the same grid the DAG's index uses, and decided
//!   exactly by the overlap engine): their next use gets a fresh version,
//!   so no chip's copy of them is used again;
//! - [`Directory::forget`] and [`Directory::forget_buffer`] are for
//!   changes the directory cannot see (the driver's own writes).
//!
//! Versions are never handed out twice, so forgetting a *clean* byte set
//! is always safe: it costs a chip a copy-in, never a stale byte. That
//! also bounds the directory: it may forget whatever clean it likes.
//!
//! **Dirty byte sets.** A write kept on its chip instead of going back to
//! host memory ([`Directory::written_dirty`]) leaves its byte set *dirty*:
//! its newest bytes are in one worker's device memory only. A dirty byte
//! set is never forgotten (not by `forget`, not past the bound): the
//! directory is the only record of where those bytes are. Before a task
//! touches bytes overlapping a dirty byte set anywhere but in that very
//! copy (the same byte set, on the same worker), they must be written
//! back ([`Directory::to_flush`], then [`Directory::flushed`] once the
//! worker has); a lost worker's dirty byte sets are handed over as lost
//! ([`Directory::lost`]).
//!
//! RES-1: a byte set keeps its version exactly as long as none of its
//! bytes is written (checked against an oracle of every byte's writes),
//! and each buffer's grid holds exactly its byte sets
//! ([`Directory::check`]).
//! RES-2: no byte is in two dirty byte sets, and a dirty byte set is
//! remembered until it is written back or its worker is lost (checked
//! against an oracle of which copy holds each byte's newest value).

use rustc_hash::FxHashMap;
use strata_wire::{CanonicalIdentity, Footprint, Overlap, Tensor};

use crate::dag::index::Grid;
use crate::ids::SeqMap;
use crate::{TaskId, WorkerId};

/// Where a dirty byte set's newest bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dirty {
    /// The worker whose chip holds them.
    pub worker: WorkerId,
    /// The task that wrote them.
    pub task: TaskId,
    /// A view with the byte set (how the worker is told which copy to
    /// write back).
    pub view: Tensor,
}

/// One remembered byte set.
#[derive(Debug, Clone, Copy)]
struct Slot {
    fp: Footprint,
    version: u64,
    dirty: Option<Dirty>,
}

/// A dirty byte set to write back: which, at which version, where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToFlush {
    /// The byte set.
    pub fp: Footprint,
    /// Its version (a flush acknowledged for another version cleans
    /// nothing: the bytes were written again meanwhile).
    pub version: u64,
    /// Where its bytes are.
    pub dirty: Dirty,
}

/// The byte sets of one buffer the directory remembers.
#[derive(Debug, Default)]
struct Versions {
    by_footprint: FxHashMap<Footprint, u64>,
    /// By slot id.
    slots: SeqMap<u64, Slot>,
    grid: Grid,
    next_slot: u64,
    /// Slots that are dirty.
    dirty: usize,
}

impl Versions {
    /// Sets `fp`'s version and state; whether it is new here.
    fn insert(&mut self, fp: Footprint, version: u64, dirty: Option<Dirty>) -> bool {
        if let Some(&slot) = self.by_footprint.get(&fp) {
            if let Some(s) = self.slots.get_mut(&slot) {
                s.version = version;
                self.dirty =
                    self.dirty + usize::from(dirty.is_some()) - usize::from(s.dirty.is_some());
                s.dirty = dirty;
            }
            return false;
        }
        self.next_slot += 1;
        let slot = self.next_slot;
        if let Some(shape) = self.grid.wants_regrid(&fp) {
            self.grid
                .regrid(shape, self.slots.iter().map(|(id, s)| (*id, &s.fp)));
        }
        self.grid.place(slot, &fp);
        self.grid.len += 1;
        self.slots.insert(slot, Slot { fp, version, dirty });
        self.dirty += usize::from(dirty.is_some());
        self.by_footprint.insert(fp, slot);
        true
    }

    /// Forgets a slot; whether it was there.
    fn remove(&mut self, slot: u64) -> bool {
        match self.slots.remove(&slot) {
            Some(s) => {
                self.grid.unplace(slot, &s.fp);
                self.by_footprint.remove(&s.fp);
                self.dirty -= usize::from(s.dirty.is_some());
                true
            }
            None => false,
        }
    }

    /// Forgets every clean slot; how many.
    fn forget_clean(&mut self) -> usize {
        let clean: Vec<u64> = self
            .slots
            .iter()
            .filter(|(_, s)| s.dirty.is_none())
            .map(|(id, _)| *id)
            .collect();
        for &id in &clean {
            self.remove(id);
        }
        clean.len()
    }

    /// The slots sharing a byte with `fp` (`scratch` is reused).
    fn overlapping(&self, fp: &Footprint, scratch: &mut Vec<u64>) {
        scratch.clear();
        self.grid.candidates(fp, scratch);
        scratch.sort_unstable();
        scratch.dedup();
        scratch.retain(|id| {
            self.slots
                .get(id)
                .is_some_and(|s| s.fp.overlap(fp) != Overlap::Disjoint)
        });
    }
}

/// Byte sets remembered at most: past this the directory forgets
/// everything (every chip's next use of any byte set is a copy-in), which
/// bounds its memory however many buffers and byte sets a long job names
/// (buffers that are dropped are never named again). A tiled job names a
/// few thousand.
pub const MAX_REMEMBERED: usize = 1 << 16;

/// Versions of the byte sets named so far (module docs).
#[derive(Debug, Default)]
pub struct Directory {
    next: u64,
    buffers: FxHashMap<CanonicalIdentity, Versions>,
    /// Byte sets remembered, over all buffers.
    len: usize,
    /// Of those, dirty.
    dirty: usize,
    scratch: Vec<u64>,
}

impl Directory {
    /// An empty directory.
    pub fn new() -> Self {
        Directory::default()
    }

    /// A version never handed out before.
    pub fn fresh(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The version of the bytes `fp` names now: the one it was given, or a
    /// fresh one, remembered from now on.
    pub fn version(&mut self, fp: &Footprint) -> u64 {
        if let Some(v) = self
            .buffers
            .get(fp.identity())
            .and_then(|b| b.by_footprint.get(fp).and_then(|s| b.slots.get(s)))
            .map(|s| s.version)
        {
            return v;
        }
        let v = self.fresh();
        self.remember(fp, v, None);
        v
    }

    fn remember(&mut self, fp: &Footprint, version: u64, dirty: Option<Dirty>) {
        if self.len >= MAX_REMEMBERED {
            self.forget_clean();
        }
        let b = self.buffers.entry(*fp.identity()).or_default();
        let was = b.dirty;
        if b.insert(*fp, version, dirty) {
            self.len += 1;
        }
        self.dirty = self.dirty + b.dirty - was;
    }

    /// Forgets every clean byte set (past the bound).
    fn forget_clean(&mut self) {
        self.buffers.retain(|_, b| {
            b.forget_clean();
            !b.slots.is_empty()
        });
        self.len = self.dirty;
    }

    /// A task wrote `fp` successfully and the bytes now have `version`
    /// (the one it was sent with) in host memory: every other byte set
    /// sharing a byte with it is forgotten. Returns the dirty ones among
    /// them, which the caller should have had written back before the task
    /// ran (forgotten too: the task's bytes are newer).
    pub fn written(&mut self, fp: &Footprint, version: u64) -> Vec<ToFlush> {
        self.write(fp, version, None)
    }

    /// As [`Directory::written`], for a write kept on the chip of
    /// `dirty.worker`: `fp` is dirty from now on.
    pub fn written_dirty(&mut self, fp: &Footprint, version: u64, dirty: Dirty) -> Vec<ToFlush> {
        self.write(fp, version, Some(dirty))
    }

    fn write(&mut self, fp: &Footprint, version: u64, dirty: Option<Dirty>) -> Vec<ToFlush> {
        let mut superseded = Vec::new();
        let b = self.buffers.entry(*fp.identity()).or_default();
        b.overlapping(fp, &mut self.scratch);
        for &slot in &self.scratch {
            let Some(s) = b.slots.get(&slot).copied() else {
                continue;
            };
            if s.fp == *fp {
                continue;
            }
            if let Some(d) = s.dirty {
                superseded.push(ToFlush {
                    fp: s.fp,
                    version: s.version,
                    dirty: d,
                });
                self.dirty -= 1;
            }
            if b.remove(slot) {
                self.len -= 1;
            }
        }
        self.remember(fp, version, dirty);
        superseded
    }

    /// Forgets byte set `fp`: its next use gets a fresh version. A dirty
    /// byte set is kept (module docs).
    pub fn forget(&mut self, fp: &Footprint) {
        if let Some(b) = self.buffers.get_mut(fp.identity())
            && let Some(&slot) = b.by_footprint.get(fp)
            && b.slots.get(&slot).is_some_and(|s| s.dirty.is_none())
            && b.remove(slot)
        {
            self.len -= 1;
        }
    }

    /// Forgets every clean byte set of a buffer.
    pub fn forget_buffer(&mut self, identity: &CanonicalIdentity) {
        if let Some(b) = self.buffers.get_mut(identity) {
            self.len -= b.forget_clean();
            if b.slots.is_empty() {
                self.buffers.remove(identity);
            }
        }
    }

    /// The dirty byte sets to write back before a task touches `fp`: every
    /// one sharing a byte with it, but for `fp` itself kept on `worker`
    /// when the task finds that copy on its chip (`None`: it does not use
    /// the chip's copies).
    pub fn to_flush(&mut self, fp: &Footprint, worker: Option<WorkerId>, out: &mut Vec<ToFlush>) {
        let Some(b) = self.buffers.get(fp.identity()) else {
            return;
        };
        if b.dirty == 0 {
            return;
        }
        b.overlapping(fp, &mut self.scratch);
        for id in &self.scratch {
            let Some(s) = b.slots.get(id) else { continue };
            let Some(d) = s.dirty else { continue };
            if s.fp == *fp && Some(d.worker) == worker {
                continue;
            }
            out.push(ToFlush {
                fp: s.fp,
                version: s.version,
                dirty: d,
            });
        }
    }

    /// Every dirty byte set.
    pub fn all_dirty(&self) -> Vec<ToFlush> {
        if self.dirty == 0 {
            return Vec::new();
        }
        self.buffers
            .values()
            .flat_map(|b| b.slots.values())
            .filter_map(|s| {
                s.dirty.map(|d| ToFlush {
                    fp: s.fp,
                    version: s.version,
                    dirty: d,
                })
            })
            .collect()
    }

    /// Byte sets now dirty.
    pub fn dirty_len(&self) -> usize {
        self.dirty
    }

    /// A worker wrote `f` back: its byte set is clean, unless it was
    /// written again since (another version).
    pub fn flushed(&mut self, f: &ToFlush) {
        if let Some(b) = self.buffers.get_mut(f.fp.identity())
            && let Some(&slot) = b.by_footprint.get(&f.fp)
            && let Some(s) = b.slots.get_mut(&slot)
            && s.version == f.version
            && s.dirty == Some(f.dirty)
        {
            s.dirty = None;
            b.dirty -= 1;
            self.dirty -= 1;
        }
    }

    /// `f` could not be written back (its worker is lost): forgotten, if
    /// it is still dirty at that version; whether it was.
    pub fn lose(&mut self, f: &ToFlush) -> bool {
        if let Some(b) = self.buffers.get_mut(f.fp.identity())
            && let Some(&slot) = b.by_footprint.get(&f.fp)
            && b.slots
                .get(&slot)
                .is_some_and(|s| s.version == f.version && s.dirty == Some(f.dirty))
            && b.remove(slot)
        {
            self.len -= 1;
            self.dirty -= 1;
            return true;
        }
        false
    }

    /// `worker` is lost, and with it the bytes it held dirty: their byte
    /// sets, forgotten here, are returned.
    pub fn lost(&mut self, worker: WorkerId) -> Vec<ToFlush> {
        let gone: Vec<ToFlush> = self
            .all_dirty()
            .into_iter()
            .filter(|f| f.dirty.worker == worker)
            .collect();
        for f in &gone {
            if let Some(b) = self.buffers.get_mut(f.fp.identity())
                && let Some(&slot) = b.by_footprint.get(&f.fp)
                && b.remove(slot)
            {
                self.len -= 1;
                self.dirty -= 1;
            }
        }
        gone
    }

    /// Byte sets remembered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it remembers nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each buffer's grid holds exactly its byte sets.
    ///
    /// # Errors
    /// The first inconsistency.
    pub fn check(&self) -> Result<(), String> {
        let total: usize = self.buffers.values().map(|b| b.slots.len()).sum();
        if total != self.len {
            return Err(format!("{total} byte sets counted as {}", self.len));
        }
        let dirty: usize = self
            .buffers
            .values()
            .flat_map(|b| b.slots.values())
            .filter(|s| s.dirty.is_some())
            .count();
        if dirty != self.dirty || dirty != self.buffers.values().map(|b| b.dirty).sum::<usize>() {
            return Err(format!("{dirty} dirty byte sets counted as {}", self.dirty));
        }
        for b in self.buffers.values() {
            let dirty: Vec<&Slot> = b.slots.values().filter(|s| s.dirty.is_some()).collect();
            for (i, x) in dirty.iter().enumerate() {
                if let Some(y) = dirty[i + 1..]
                    .iter()
                    .find(|y| x.fp.overlap(&y.fp) != Overlap::Disjoint)
                {
                    return Err(format!(
                        "RES-2: dirty byte sets {:?} and {:?} share bytes",
                        x.fp.byte_range(),
                        y.fp.byte_range()
                    ));
                }
            }
        }
        for b in self.buffers.values() {
            if b.by_footprint.len() != b.slots.len() {
                return Err(format!(
                    "{} footprints for {} slots",
                    b.by_footprint.len(),
                    b.slots.len()
                ));
            }
            b.grid.check(b.slots.values().map(|s| &s.fp))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use strata_wire::check::{Rng, byte_set, test_buffer};
    use strata_wire::{DType, Tensor};

    /// A random 2-D view of a 32×32 byte matrix (tiles, rows, columns,
    /// strided and transposed windows).
    fn view(rng: &mut Rng) -> Tensor {
        let buf = test_buffer(1024);
        let (h, w) = (1 + rng.next_u64() % 8, 1 + rng.next_u64() % 8);
        let (sr, sc) = (32 * (1 + rng.next_u64() % 2), 1 + rng.next_u64() % 2);
        let r0 = rng.next_u64() % (32 - (h - 1) * (sr / 32));
        let c0 = rng.next_u64() % (32 - (w - 1) * sc);
        Tensor::new(
            buf,
            r0 * 32 + c0,
            &[h as u32, w as u32],
            &[sr as u32, sc as u32],
            DType::U8,
        )
        .unwrap()
    }

    /// Against an oracle of every byte's writes: two uses of one byte set
    /// get the same version exactly when none of its bytes was written in
    /// between (by any byte set): never stale, and never forgotten for
    /// nothing.
    #[test]
    fn versions_change_exactly_when_bytes_may_have() {
        for seed in 0..200 {
            let mut rng = Rng(seed);
            let mut dir = Directory::new();
            let pool: Vec<Tensor> = (0..12).map(|_| view(&mut rng)).collect();
            // Oracle: per byte, how many writes it has seen.
            let mut writes = [0u64; 1024];
            // Per view: the version last seen and the byte writes then.
            let mut seen: HashMap<usize, (u64, Vec<u64>)> = HashMap::new();
            for _ in 0..300 {
                let i = (rng.next_u64() % pool.len() as u64) as usize;
                let fp = Footprint::of(&pool[i]);
                let bytes = byte_set(&pool[i]).unwrap();
                if rng.next_u64() % 3 == 0 {
                    let v = dir.fresh();
                    dir.written(&fp, v);
                    for &b in &bytes {
                        writes[b as usize] += 1;
                    }
                    seen.insert(i, (v, bytes.iter().map(|&b| writes[b as usize]).collect()));
                } else {
                    let v = dir.version(&fp);
                    let now: Vec<u64> = bytes.iter().map(|&b| writes[b as usize]).collect();
                    if let Some((was, then)) = seen.get(&i) {
                        if *then == now {
                            assert_eq!(
                                v, *was,
                                "seed {seed}: an unchanged byte set lost its version"
                            );
                        } else {
                            assert_ne!(v, *was, "seed {seed}: a changed byte set kept its version");
                        }
                    }
                    seen.insert(i, (v, now));
                }
                dir.check().unwrap();
            }
        }
    }

    /// Dirty byte sets against an oracle of where each byte's newest value
    /// is (host memory, or one worker's chip): before every use on a
    /// worker, `to_flush` names exactly the byte sets holding newer bytes
    /// than host memory of the bytes used, but for the use's own copy on
    /// its own worker; once they are written back, a write keeps RES-2;
    /// a lost worker hands over exactly the byte sets it held dirty; and
    /// forgetting (driver writes, the bound) never drops a dirty one.
    #[test]
    fn dirty_bytes_are_found_before_every_other_use() {
        for seed in 0..200 {
            let mut rng = Rng(0xd1e7 + seed);
            let mut dir = Directory::new();
            let pool: Vec<Tensor> = (0..10).map(|_| view(&mut rng)).collect();
            let views: HashMap<Footprint, Tensor> =
                pool.iter().map(|t| (Footprint::of(t), *t)).collect();
            let bytes_of = |fp: &Footprint| byte_set(&views[fp]).unwrap();
            let mut newest: Vec<Option<WorkerId>> = vec![None; 1024];
            for step in 0..300u64 {
                let i = (rng.next_u64() % pool.len() as u64) as usize;
                let fp = Footprint::of(&pool[i]);
                let w = WorkerId((rng.next_u64() % 3) as u32);
                let mut need = Vec::new();
                dir.to_flush(&fp, Some(w), &mut need);
                for f in &need {
                    for b in bytes_of(&f.fp) {
                        if newest[b as usize] == Some(f.dirty.worker) {
                            newest[b as usize] = None;
                        }
                    }
                    dir.flushed(f);
                }
                for b in bytes_of(&fp) {
                    if let Some(x) = newest[b as usize] {
                        assert_eq!(x, w, "seed {seed} step {step}: byte {b} left on {x}");
                        let own = dir
                            .all_dirty()
                            .into_iter()
                            .any(|f| f.fp == fp && f.dirty.worker == w);
                        assert!(
                            own,
                            "seed {seed} step {step}: byte {b} newest on {w}, not in the use's copy"
                        );
                    }
                }
                match rng.next_u64() % 8 {
                    0..=2 => {
                        dir.version(&fp);
                    }
                    3 | 4 => {
                        let v = dir.fresh();
                        assert!(
                            dir.written(&fp, v).is_empty(),
                            "seed {seed}: a dirty byte set was overwritten"
                        );
                        for b in bytes_of(&fp) {
                            newest[b as usize] = None;
                        }
                    }
                    5 | 6 => {
                        let v = dir.fresh();
                        let d = Dirty {
                            worker: w,
                            task: TaskId(step + 1),
                            view: pool[i],
                        };
                        assert!(
                            dir.written_dirty(&fp, v, d).is_empty(),
                            "seed {seed}: a dirty byte set was overwritten"
                        );
                        for b in bytes_of(&fp) {
                            newest[b as usize] = Some(w);
                        }
                    }
                    _ => {
                        // The driver wrote, or a lost worker.
                        if rng.next_u64() % 2 == 0 {
                            dir.forget(&fp);
                        } else {
                            let gone = dir.lost(w);
                            let mut held: Vec<u64> =
                                gone.iter().flat_map(|f| bytes_of(&f.fp)).collect();
                            held.sort_unstable();
                            held.dedup();
                            let want: Vec<u64> = (0..1024u64)
                                .filter(|&b| newest[b as usize] == Some(w))
                                .collect();
                            assert_eq!(held, want, "seed {seed} step {step}: lost bytes of {w}");
                            for b in want {
                                newest[b as usize] = None;
                            }
                        }
                    }
                }
                dir.check()
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            }
        }
    }

    /// Untouched byte sets keep their versions: writes elsewhere in the
    /// buffer, even between them, do not disturb them.
    #[test]
    fn disjoint_writes_keep_versions() {
        let buf = test_buffer(1024);
        let tile = |r: u64, c: u64| {
            Tensor::new(buf, r * 256 + c * 8, &[8, 8], &[32, 1], DType::U8).unwrap()
        };
        let mut dir = Directory::new();
        let a = Footprint::of(&tile(0, 0));
        let va = dir.version(&a);
        for c in 1..4 {
            let v = dir.fresh();
            dir.written(&Footprint::of(&tile(0, c)), v);
        }
        assert_eq!(dir.version(&a), va);
        let v = dir.fresh();
        // A column of one byte through tile (0, 0) changes it.
        let col = Tensor::new(buf, 3, &[4], &[32], DType::U8).unwrap();
        dir.written(&Footprint::of(&col), v);
        assert_ne!(dir.version(&a), va);
        assert_eq!(dir.len(), 5);
        dir.forget_buffer(buf.identity());
        assert!(dir.is_empty());
        dir.check().unwrap();
    }

    /// Past its bound the directory forgets everything, and nothing it
    /// hands out afterwards repeats an earlier version.
    #[test]
    fn the_directory_is_bounded() {
        let buf = test_buffer(1 << 20);
        let byte = |i: u64| Footprint::of(&Tensor::new(buf, i, &[1], &[1], DType::U8).unwrap());
        let mut dir = Directory::new();
        let first = dir.version(&byte(0));
        for i in 1..MAX_REMEMBERED as u64 {
            dir.version(&byte(i));
        }
        assert_eq!(dir.len(), MAX_REMEMBERED);
        assert_eq!(dir.version(&byte(0)), first, "still remembered");
        dir.version(&byte(MAX_REMEMBERED as u64));
        assert_eq!(dir.len(), 1, "forgot everything, then remembered one");
        assert!(dir.version(&byte(0)) > first);
        dir.check().unwrap();
    }
}
