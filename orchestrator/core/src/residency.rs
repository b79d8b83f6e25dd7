//! The versions of bytes that workers' device caches hold.
//!
//! A staged chip keeps the copies it made of host bytes between tasks,
//! keyed by the exact byte set (`strata_chip::cache`), but it cannot see
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
//! Versions are never handed out twice, so forgetting is always safe: it
//! costs a chip a copy-in, never a stale byte. That also bounds the
//! directory: it may forget whatever it likes.
//!
//! RES-1: a byte set keeps its version exactly as long as none of its
//! bytes is written (checked against an oracle of every byte's writes),
//! and each buffer's grid holds exactly its byte sets
//! ([`Directory::check`]).

use rustc_hash::FxHashMap;
use strata_wire::{CanonicalIdentity, Footprint, Overlap};

use crate::dag::index::Grid;
use crate::ids::SeqMap;

/// The byte sets of one buffer the directory remembers.
#[derive(Debug, Default)]
struct Versions {
    by_footprint: FxHashMap<Footprint, u64>,
    /// By slot id: footprint and version.
    slots: SeqMap<u64, (Footprint, u64)>,
    grid: Grid,
    next_slot: u64,
}

impl Versions {
    /// Sets `fp`'s version; whether it is new here.
    fn insert(&mut self, fp: Footprint, version: u64) -> bool {
        if let Some(&slot) = self.by_footprint.get(&fp) {
            if let Some(s) = self.slots.get_mut(&slot) {
                s.1 = version;
            }
            return false;
        }
        self.next_slot += 1;
        let slot = self.next_slot;
        if let Some(shape) = self.grid.wants_regrid(&fp) {
            self.grid
                .regrid(shape, self.slots.iter().map(|(id, (f, _))| (*id, f)));
        }
        self.grid.place(slot, &fp);
        self.grid.len += 1;
        self.slots.insert(slot, (fp, version));
        self.by_footprint.insert(fp, slot);
        true
    }

    /// Forgets a slot; whether it was there.
    fn remove(&mut self, slot: u64) -> bool {
        match self.slots.remove(&slot) {
            Some((fp, _)) => {
                self.grid.unplace(slot, &fp);
                self.by_footprint.remove(&fp);
                true
            }
            None => false,
        }
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
            .map(|(_, v)| *v)
        {
            return v;
        }
        let v = self.fresh();
        self.remember(fp, v);
        v
    }

    fn remember(&mut self, fp: &Footprint, version: u64) {
        if self.len >= MAX_REMEMBERED {
            self.buffers.clear();
            self.len = 0;
        }
        if self
            .buffers
            .entry(*fp.identity())
            .or_default()
            .insert(*fp, version)
        {
            self.len += 1;
        }
    }

    /// A task wrote `fp` successfully and the bytes now have `version`
    /// (the one it was sent with): every other byte set sharing a byte
    /// with it is forgotten.
    pub fn written(&mut self, fp: &Footprint, version: u64) {
        let b = self.buffers.entry(*fp.identity()).or_default();
        self.scratch.clear();
        b.grid.candidates(fp, &mut self.scratch);
        self.scratch.sort_unstable();
        self.scratch.dedup();
        for &slot in &self.scratch {
            let Some((other, _)) = b.slots.get(&slot) else {
                continue;
            };
            if other != fp && fp.overlap(other) != Overlap::Disjoint && b.remove(slot) {
                self.len -= 1;
            }
        }
        self.remember(fp, version);
    }

    /// Forgets byte set `fp`: its next use gets a fresh version.
    pub fn forget(&mut self, fp: &Footprint) {
        if let Some(b) = self.buffers.get_mut(fp.identity())
            && let Some(&slot) = b.by_footprint.get(fp)
            && b.remove(slot)
        {
            self.len -= 1;
        }
    }

    /// Forgets every byte set of a buffer.
    pub fn forget_buffer(&mut self, identity: &CanonicalIdentity) {
        if let Some(b) = self.buffers.remove(identity) {
            self.len -= b.slots.len();
        }
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
        for b in self.buffers.values() {
            if b.by_footprint.len() != b.slots.len() {
                return Err(format!(
                    "{} footprints for {} slots",
                    b.by_footprint.len(),
                    b.slots.len()
                ));
            }
            b.grid.check(b.slots.values().map(|(f, _)| f))?;
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
