//! Both lanes of a session in one memfd: what the driver creates and
//! passes over the fd channel, and what the worker maps after checking.
//!
//! Layout (every part page-aligned):
//!
//! | offset | what |
//! |---|---|
//! | 0 | control: magic `strring1`, version, the two capacities |
//! | 4096 | the submission [`Lane`]'s words |
//! | 8192 | the completion lane's words |
//! | 12288 | submission bytes (`submit` capacity) |
//! | 12288 + `submit` | completion bytes (`complete` capacity) |
//!
//! This is the one place of the crate with `unsafe`: the words are
//! atomics placed in the mapping, and the bytes are copied with raw
//! pointers, never referenced (the peer may write them at any time).

#![allow(unsafe_code)]

use std::os::fd::{AsFd, OwnedFd};

use memmap2::{MmapOptions, MmapRaw};

use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::{Lane, Memory, RingError, Store, Which};

const MAGIC: u64 = u64::from_le_bytes(*b"strring1");
/// The layout's version; a mapping of another is refused.
pub const VERSION: u32 = 1;
const PAGE: usize = 4096;
const SUBMIT_LANE: usize = PAGE;
const COMPLETE_LANE: usize = 2 * PAGE;
const DATA: usize = 3 * PAGE;
/// Smallest lane capacity.
pub const MIN_CAPACITY: usize = 4096;
/// Largest lane capacity.
pub const MAX_CAPACITY: usize = 64 << 20;

const _: () = assert!(std::mem::size_of::<Lane>() <= PAGE);
const _: () = assert!(std::mem::align_of::<Lane>() <= PAGE);

/// The words at offset 0.
#[repr(C)]
struct Control {
    magic: AtomicU64,
    version: AtomicU32,
    submit: AtomicU32,
    complete: AtomicU32,
}

/// The capacities of a session's two lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacities {
    /// Bytes of the submission lane.
    pub submit: usize,
    /// Bytes of the completion lane.
    pub complete: usize,
}

impl Capacities {
    /// Checks both: powers of two within [`MIN_CAPACITY`]..=[`MAX_CAPACITY`].
    ///
    /// # Errors
    /// [`RingError::Layout`] naming the bad one.
    pub fn check(self) -> Result<Self, RingError> {
        for (name, c) in [("submit", self.submit), ("complete", self.complete)] {
            if !c.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&c) {
                return Err(RingError::Layout(format!(
                    "{name} capacity {c}: a power of two from {MIN_CAPACITY} to {MAX_CAPACITY}"
                )));
            }
        }
        Ok(self)
    }

    /// Bytes of the whole memfd.
    pub fn file_len(self) -> usize {
        DATA + self.submit + self.complete
    }
}

/// A mapped ring memfd.
#[derive(Debug)]
pub struct SharedRing {
    map: MmapRaw,
    caps: Capacities,
    submit: Region,
    complete: Region,
}

/// One lane's bytes in the mapping.
#[derive(Debug)]
struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is into a shared mapping owned by the `SharedRing`
// that owns the region; it is only used for copies bounded by `len`.
unsafe impl Send for Region {}
// SAFETY: as above; concurrent copies race only with the peer's, which
// the ring protocol orders (and a hostile peer's racing writes only give
// us wrong bytes, which are checked after they are copied).
unsafe impl Sync for Region {}

impl Store for Region {
    fn capacity(&self) -> usize {
        self.len
    }

    fn put(&self, at: usize, src: &[u8]) {
        assert!(
            at <= self.len && src.len() <= self.len - at,
            "ring write out of bounds"
        );
        // SAFETY: in bounds (checked); `src` is our own memory, which the
        // mapping cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) }
    }

    fn get(&self, at: usize, dst: &mut [u8]) {
        assert!(
            at <= self.len && dst.len() <= self.len - at,
            "ring read out of bounds"
        );
        // SAFETY: in bounds (checked); `dst` is our own memory.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(at), dst.as_mut_ptr(), dst.len()) }
    }
}

impl SharedRing {
    fn new(map: MmapRaw, caps: Capacities) -> Self {
        let base = map.as_mut_ptr();
        // SAFETY: both offsets are inside the mapping of `caps.file_len()`
        // bytes.
        let (submit, complete) = unsafe {
            (
                Region {
                    ptr: base.add(DATA),
                    len: caps.submit,
                },
                Region {
                    ptr: base.add(DATA + caps.submit),
                    len: caps.complete,
                },
            )
        };
        SharedRing {
            map,
            caps,
            submit,
            complete,
        }
    }
}

impl SharedRing {
    /// Creates the memfd of a session with lanes of `caps`, sealed against
    /// shrinking and growing, and maps it; returns the mapping and the fd
    /// to pass to the worker.
    ///
    /// # Errors
    /// Bad capacities, or the memfd could not be made.
    pub fn create(caps: Capacities) -> Result<(SharedRing, OwnedFd), RingError> {
        let caps = caps.check()?;
        let io = |e: &dyn std::fmt::Display| RingError::Io(e.to_string());
        let mfd = memfd::MemfdOptions::default()
            .allow_sealing(true)
            .close_on_exec(true)
            .create("strata-ring")
            .map_err(|e| io(&e))?;
        mfd.as_file()
            .set_len(caps.file_len() as u64)
            .map_err(|e| io(&e))?;
        mfd.add_seals(&[
            memfd::FileSeal::SealShrink,
            memfd::FileSeal::SealGrow,
            memfd::FileSeal::SealSeal,
        ])
        .map_err(|e| io(&e))?;
        let file = mfd.into_file();
        // Populated: the lanes' pages are made and mapped now, not faulted
        // in one by one on the first lap of records (a fault costs
        // microseconds, and a lap is thousands of tasks).
        let map = MmapOptions::new()
            .len(caps.file_len())
            .populate()
            .map_raw(&file)
            .map_err(|e| io(&e))?;
        let ring = SharedRing::new(map, caps);
        let c = ring.control();
        c.submit.store(caps.submit as u32, Ordering::Relaxed);
        c.complete.store(caps.complete as u32, Ordering::Relaxed);
        c.version.store(VERSION, Ordering::Relaxed);
        c.magic.store(MAGIC, Ordering::Release);
        Ok((ring, OwnedFd::from(file)))
    }

    /// Maps a ring memfd that a peer sent, announced with `caps`: the file
    /// must be exactly the layout's size (the caller has checked that it
    /// is sealed against shrinking), and its control words must say the
    /// same magic, version and capacities.
    ///
    /// # Errors
    /// [`RingError::Layout`] naming what differs.
    pub fn open(fd: impl AsFd, caps: Capacities) -> Result<SharedRing, RingError> {
        let caps = caps.check()?;
        let file = std::fs::File::from(
            fd.as_fd()
                .try_clone_to_owned()
                .map_err(|e| RingError::Io(e.to_string()))?,
        );
        let len = file
            .metadata()
            .map_err(|e| RingError::Io(e.to_string()))?
            .len();
        if len != caps.file_len() as u64 {
            return Err(RingError::Layout(format!(
                "the memfd holds {len} bytes; lanes of {} and {} take {}",
                caps.submit,
                caps.complete,
                caps.file_len()
            )));
        }
        let map = MmapOptions::new()
            .len(caps.file_len())
            .populate()
            .map_raw(&file)
            .map_err(|e| RingError::Io(e.to_string()))?;
        let ring = SharedRing::new(map, caps);
        let c = ring.control();
        let (magic, version) = (
            c.magic.load(Ordering::Acquire),
            c.version.load(Ordering::Relaxed),
        );
        let (s, k) = (
            c.submit.load(Ordering::Relaxed) as usize,
            c.complete.load(Ordering::Relaxed) as usize,
        );
        if magic != MAGIC || version != VERSION {
            return Err(RingError::Layout(format!(
                "magic {magic:#x} version {version}; want {MAGIC:#x} version {VERSION}"
            )));
        }
        if (s, k) != (caps.submit, caps.complete) {
            return Err(RingError::Layout(format!(
                "the memfd says lanes of {s} and {k} bytes, the message {} and {}",
                caps.submit, caps.complete
            )));
        }
        Ok(ring)
    }

    /// The lanes' capacities.
    pub fn capacities(&self) -> Capacities {
        self.caps
    }

    fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn control(&self) -> &Control {
        // SAFETY: offset 0 of a page-aligned mapping at least 3 pages long;
        // `Control` is plain atomics (valid for any bit pattern), and the
        // mapping lives as long as `self`.
        unsafe { &*self.base().cast::<Control>() }
    }
}

impl Memory for SharedRing {
    fn lane(&self, which: Which) -> &Lane {
        let at = match which {
            Which::Submit => SUBMIT_LANE,
            Which::Complete => COMPLETE_LANE,
        };
        // SAFETY: a page-aligned offset inside the mapping with a page
        // for the lane (`size_of::<Lane>() <= PAGE`, checked at compile
        // time); `Lane` is atomics and padding, valid for any bit pattern
        // (a zeroed memfd is an empty, open lane); the mapping lives as
        // long as `self`. The peer writes the same words, which is what
        // atomics are for.
        unsafe { &*self.base().add(at).cast::<Lane>() }
    }

    fn store(&self, which: Which) -> &dyn Store {
        match which {
            Which::Submit => &self.submit,
            Which::Complete => &self.complete,
        }
    }
}
