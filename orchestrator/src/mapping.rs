//! The driver's mapping of a host buffer, and the byte conversions of
//! plain-old-data slices: the orchestrator's only `unsafe` code.
//!
//! A host buffer is a memfd mapped `MAP_SHARED` here and in every local
//! worker that imports it. Workers write into it while the driver runs, so
//! the driver never makes a Rust reference to the mapped memory: every
//! access is a bounds-checked raw copy of exactly the bytes asked for. The
//! DAG orders every task's bytes against the others' (and the driver reads
//! results after the tasks that write them are done), so two parties never
//! write the same byte at once.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;

use memmap2::MmapRaw;
use strata_chip::kernel::Pod;

/// Bytes `offset..end` asked of a mapping that ends before `end`: the only
/// way a copy in or out of it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfRange {
    pub(crate) offset: usize,
    pub(crate) end: usize,
}

/// A shared, writable mapping of a whole file.
pub(crate) struct SharedMapping {
    map: MmapRaw,
}

impl std::fmt::Debug for SharedMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedMapping({} bytes)", self.map.len())
    }
}

impl SharedMapping {
    /// Maps `file` shared, read-write, at its current length.
    pub(crate) fn new(file: &File) -> io::Result<Self> {
        Ok(SharedMapping {
            map: MmapRaw::map_raw(file)?,
        })
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfRange> {
        match offset.checked_add(len) {
            Some(end) if end <= self.map.len() => Ok(()),
            _ => Err(OutOfRange {
                offset,
                end: offset.saturating_add(len),
            }),
        }
    }

    /// Copies `dst.len()` bytes at `offset` out of the mapping.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfRange> {
        self.check(offset, dst.len())?;
        // SAFETY: offset..offset+len lies within the live mapping (checked
        // above; the mapping lives as long as self). The source is only
        // accessed through this raw pointer, never a reference, and `dst`
        // is a private slice, so the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(())
    }

    /// Copies `src` into the mapping at `offset`.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<(), OutOfRange> {
        self.check(offset, src.len())?;
        // SAFETY: as `read`: in bounds of the live, writable mapping; the
        // destination is reached only through this raw pointer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.map.as_mut_ptr().add(offset),
                src.len(),
            );
        }
        Ok(())
    }
}

/// The bytes of a slice of plain-old-data values (little-endian machine).
pub(crate) fn as_bytes<T: Pod>(values: &[T]) -> &[u8] {
    // SAFETY: `Pod` types have no padding, so every byte of the slice is
    // initialized; the returned slice borrows `values` for its lifetime
    // and covers exactly its size_of_val bytes.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// Values of `T` read from `bytes`, whose length must be a multiple of
/// `T`'s size.
pub(crate) fn from_bytes<T: Pod>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let n = bytes.len() / size;
    let mut out: Vec<T> = Vec::with_capacity(n);
    // SAFETY: the vector has room for n values; n·size ≤ bytes.len(); every
    // bit pattern is a valid `T` (Pod), so after the copy the first n
    // values are initialized and set_len is sound.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), n * size);
        out.set_len(n);
    }
    out
}
