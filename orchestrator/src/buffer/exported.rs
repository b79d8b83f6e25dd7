//! A shared device buffer's memory as this process holds it: the export
//! ([`crate::Cluster::export_device`]) and its mappings, which check the
//! buffer's quarantine marks as a host buffer's views do.
//!
//! Both outlive the buffer (the memory stays while any holds it), and so
//! do the marks they share with it: a task lost without a fence while it
//! writes the buffer may still write the mapped bytes, so reading or
//! writing them here is refused until the loss is fenced.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use strata_chip_runtime::shared::{MappedMemory, Place, SharedMemory};
use strata_wire::CanonicalIdentity;

use super::Marks;
use crate::error::{BufferError, Error};

/// A shared device buffer handed to this process as a file descriptor
/// ([`crate::Cluster::export_device`]). [`DeviceExport::map`] maps it here;
/// [`DeviceExport::into_fd`] gives up the descriptor (for another process
/// to map with `strata_chip_runtime::shared::SharedMemory::map`).
#[derive(Debug)]
pub struct DeviceExport {
    memory: SharedMemory,
    buffer: CanonicalIdentity,
    marks: Arc<Marks>,
}

impl DeviceExport {
    pub(crate) fn new(memory: SharedMemory, buffer: CanonicalIdentity, marks: Arc<Marks>) -> Self {
        DeviceExport {
            memory,
            buffer,
            marks,
        }
    }

    /// Bytes of the allocation (at least the buffer's).
    pub fn len(&self) -> u64 {
        self.memory.len
    }

    /// Whether it holds no byte (never: a buffer holds at least one).
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    /// Where the memory lives: host memory (a simulated chip) or a GPU's.
    pub fn place(&self) -> Place {
        self.memory.place
    }

    /// The descriptor, borrowed.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.memory.fd.as_fd()
    }

    /// Maps the memory in this process.
    ///
    /// # Errors
    /// [`Error::Buffer`] ([`BufferError::Shared`]) when the descriptor is
    /// refused or the GPU's driver fails.
    pub fn map(&self) -> Result<DeviceMapping, Error> {
        let map = self.memory.map().map_err(|e| BufferError::Shared {
            buffer: self.buffer,
            source: Box::new(e),
        })?;
        Ok(DeviceMapping {
            map,
            buffer: self.buffer,
            marks: Arc::clone(&self.marks),
        })
    }

    /// The descriptor, its length and place, to hand to another process:
    /// what that process does with the memory is outside this cluster's
    /// quarantine (as a host buffer's memfd passed on would be).
    pub fn into_memory(self) -> SharedMemory {
        self.memory
    }

    /// The descriptor alone (see [`DeviceExport::into_memory`]).
    pub fn into_fd(self) -> OwnedFd {
        self.memory.fd
    }
}

/// A shared device buffer's memory mapped in this process
/// ([`DeviceExport::map`]); unmapped when dropped.
///
/// `read` and `write` refuse bytes quarantined by a task lost without a
/// fence ([`Error::Quarantined`]), as a host view's do; code that uses the
/// address directly asks [`DeviceMapping::check`] first.
#[derive(Debug)]
pub struct DeviceMapping {
    map: MappedMemory,
    buffer: CanonicalIdentity,
    marks: Arc<Marks>,
}

impl DeviceMapping {
    /// The address of its first byte: a host pointer for [`Place::Host`],
    /// a device pointer of this process's context for [`Place::Cuda`].
    /// Reads and writes through it bypass the quarantine check.
    pub fn addr(&self) -> u64 {
        self.map.addr()
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.map.len()
    }

    /// Whether it maps no byte (never).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Where the memory lives.
    pub fn place(&self) -> Place {
        self.map.place()
    }

    /// Refuses `len` bytes at `offset` while any of them is quarantined;
    /// one atomic load when nothing is.
    ///
    /// # Errors
    /// [`Error::Quarantined`] naming the bytes, the lost task and its
    /// worker.
    pub fn check(&self, offset: u64, len: u64) -> Result<(), Error> {
        Ok(self.marks.check_range(&self.buffer, offset, len)?)
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    ///
    /// # Errors
    /// Quarantined bytes ([`Error::Quarantined`]), bytes past the end or
    /// the GPU driver's failure ([`BufferError::Shared`]).
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), Error> {
        self.check(offset, dst.len() as u64)?;
        self.map.read(offset, dst).map_err(|e| self.failed(e))
    }

    /// Copies `src` to `offset`.
    ///
    /// # Errors
    /// As [`DeviceMapping::read`].
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), Error> {
        self.check(offset, src.len() as u64)?;
        self.map.write(offset, src).map_err(|e| self.failed(e))
    }

    /// The chip runtime's mapping, for code that hands the memory on
    /// (DLPack); it no longer checks the quarantine.
    pub fn into_memory(self) -> MappedMemory {
        self.map
    }

    fn failed(&self, source: strata_chip_runtime::Error) -> Error {
        BufferError::Shared {
            buffer: self.buffer,
            source: Box::new(source),
        }
        .into()
    }
}
