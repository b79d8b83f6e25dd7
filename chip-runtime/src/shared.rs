//! Device memory that leaves its process as a file descriptor.
//!
//! A block of the shared region ([`Region::Shared`]) is an allocation of
//! its own, never part of the arena, so that handing it out hands out
//! nothing else: [`Device::export`] gives a new descriptor for it each
//! time (as a memfd import is dup'd, each holder owns its own), and
//! [`SharedMemory::map`] maps it in another process (or this one), where
//! reads see the chip's bytes and writes reach the chip's.
//!
//! What the descriptor is depends on the chip:
//! - a simulated chip's device memory is host memory: the block is a memfd
//!   sealed against shrinking and growing, mapped shared by the chip; a
//!   mapping elsewhere is plain host memory ([`Place::Host`]);
//! - a CUDA GPU's block is its own physical allocation (`cuMemCreate`)
//!   exportable as a POSIX file descriptor; mapping it imports it
//!   (`cuMemImportFromShareableHandle`) into a fresh range of this
//!   process's address space on the same GPU ([`Place::Cuda`]).
//!
//! A descriptor that comes from another process is hostile until checked:
//! [`SharedMemory::map`] maps a host one only if it is on tmpfs, sealed
//! against shrinking (no one can truncate it under the mapping) and at
//! least as long as claimed; a GPU one is checked by the driver, which
//! refuses what it did not export.
//!
//! [`Device::export`]: crate::Device::export
//! [`Region::Shared`]: crate::Region::Shared

use std::os::fd::{AsFd, OwnedFd};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::stat::fstat;
use nix::sys::statfs::{TMPFS_MAGIC, fstatfs};

use crate::Error;

/// Where shared device memory lives, and so what a mapping of it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Host memory (a simulated chip's device memory): mapped, plain host
    /// memory.
    Host,
    /// The memory of CUDA device `N` (as numbered in the exporting
    /// process): mapped, device memory of that GPU in this process.
    Cuda(u32),
}

impl Place {
    /// Its name between processes (the fd channel's): `host` or `cuda:N`.
    pub fn tag(&self) -> String {
        match self {
            Place::Host => "host".into(),
            Place::Cuda(n) => format!("cuda:{n}"),
        }
    }

    /// The place a [`Place::tag`] names; `None` for anything else.
    pub fn from_tag(tag: &str) -> Option<Place> {
        match tag {
            "host" => Some(Place::Host),
            _ => tag.strip_prefix("cuda:")?.parse().ok().map(Place::Cuda),
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Host => f.write_str("host memory"),
            Place::Cuda(n) => write!(f, "memory of GPU {n}"),
        }
    }
}

/// Shared device memory as it leaves a chip: its descriptor, its length
/// and where it lives.
#[derive(Debug)]
pub struct SharedMemory {
    /// The descriptor: a memfd ([`Place::Host`]) or the driver's POSIX
    /// handle ([`Place::Cuda`]). Owned: closing it releases nothing the
    /// chip or a mapping holds.
    pub fd: OwnedFd,
    /// Bytes of the allocation.
    pub len: u64,
    /// Where it lives.
    pub place: Place,
}

/// Shared device memory mapped in this process ([`SharedMemory::map`]);
/// unmapped when dropped.
#[derive(Debug)]
pub struct MappedMemory {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) place: Place,
    pub(crate) mapping: Box<dyn Mapping>,
}

/// What keeps a mapping mapped, and moves bytes in and out of it.
pub(crate) trait Mapping: Send + Sync + std::fmt::Debug {
    /// Copies bytes at `at` (inside the mapping) to `dst`.
    fn read(&self, at: u64, dst: &mut [u8]) -> Result<(), Error>;
    /// Copies `src` to bytes at `at` (inside the mapping).
    fn write(&self, at: u64, src: &[u8]) -> Result<(), Error>;
}

/// A host mapping: plain memory, mapped while this lives.
#[derive(Debug)]
struct HostMapping {
    _map: memmap2::MmapMut,
}

impl Mapping for HostMapping {
    fn read(&self, at: u64, dst: &mut [u8]) -> Result<(), Error> {
        // SAFETY: the caller checked `at..at + len` lies in the mapping,
        // which `self` keeps mapped.
        unsafe { std::ptr::copy_nonoverlapping(at as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn write(&self, at: u64, src: &[u8]) -> Result<(), Error> {
        // SAFETY: as in `read`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), at as *mut u8, src.len()) };
        Ok(())
    }
}

impl MappedMemory {
    /// The address of its first byte: a host pointer for [`Place::Host`],
    /// a device pointer of this process's context for [`Place::Cuda`].
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it maps no byte (never: shared blocks hold at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the memory lives.
    pub fn place(&self) -> Place {
        self.place
    }

    /// Copies `dst.len()` bytes from `offset` into `dst` (through the GPU's
    /// driver for device memory).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] past the end; the driver's error.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), Error> {
        let at = self.range(offset, dst.len())?;
        self.mapping.read(at, dst)
    }

    /// Copies `src` to `offset` (through the GPU's driver for device
    /// memory).
    ///
    /// # Errors
    /// As [`MappedMemory::read`].
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), Error> {
        let at = self.range(offset, src.len())?;
        self.mapping.write(at, src)
    }

    fn range(&self, offset: u64, len: usize) -> Result<u64, Error> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(self.addr + offset),
            _ => Err(Error::OutOfRange {
                addr: self.addr.saturating_add(offset),
                len: len as u64,
                what: "the mapped shared block",
            }),
        }
    }
}

fn refuse(reason: impl Into<String>) -> Error {
    Error::Shared {
        reason: reason.into(),
    }
}

/// Maps a host descriptor of `len` bytes, after the checks of the module
/// docs.
pub(crate) fn map_host(fd: &OwnedFd, len: u64) -> Result<MappedMemory, Error> {
    check_host_fd(fd, len)?;
    let file = std::fs::File::from(fd.try_clone().map_err(|e| refuse(format!("dup: {e}")))?);
    let n = usize::try_from(len).map_err(|_| refuse(format!("{len} bytes do not fit here")))?;
    // SAFETY: the file is on tmpfs, sealed against shrinking and at least
    // `len` bytes long (checked above), so every page of the mapping stays
    // backed; other processes may write it concurrently, which is what
    // shared device memory is for (its users order their accesses).
    let map = unsafe { memmap2::MmapOptions::new().len(n).map_mut(&file) }
        .map_err(|e| refuse(format!("mmap of {len} bytes: {e}")))?;
    Ok(MappedMemory {
        addr: map.as_ptr() as u64,
        len,
        place: Place::Host,
        mapping: Box::new(HostMapping { _map: map }),
    })
}

/// A host descriptor is on tmpfs, sealed against shrinking, and holds at
/// least `len` bytes; `len` is not zero.
pub(crate) fn check_host_fd(fd: &impl AsFd, len: u64) -> Result<(), Error> {
    if len == 0 {
        return Err(refuse("a shared block has at least one byte"));
    }
    let fs = fstatfs(fd).map_err(|e| refuse(format!("fstatfs: {e}")))?;
    if fs.filesystem_type() != TMPFS_MAGIC {
        return Err(refuse(format!(
            "the descriptor is on a filesystem with magic {:#x}, not tmpfs: not a simulated chip's shared block",
            fs.filesystem_type().0
        )));
    }
    let seals =
        fcntl(fd, FcntlArg::F_GET_SEALS).map_err(|e| refuse(format!("F_GET_SEALS: {e}")))?;
    if !SealFlag::from_bits_retain(seals).contains(SealFlag::F_SEAL_SHRINK) {
        return Err(refuse(
            "the descriptor is not sealed against shrinking: a mapping of it could lose its pages (SIGBUS)",
        ));
    }
    let size = fstat(fd)
        .map_err(|e| refuse(format!("fstat: {e}")))?
        .st_size;
    if u64::try_from(size).unwrap_or(0) < len {
        return Err(refuse(format!(
            "the descriptor holds {size} bytes, fewer than the {len} claimed"
        )));
    }
    Ok(())
}
