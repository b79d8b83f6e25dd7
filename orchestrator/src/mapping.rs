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
use strata_chip_runtime::kernel::Pod;

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

    /// Maps the first `len` bytes of `file` shared, read-write.
    pub(crate) fn with_len(file: &File, len: usize) -> io::Result<Self> {
        Ok(SharedMapping {
            map: memmap2::MmapOptions::new().len(len).map_raw(file)?,
        })
    }

    /// The address of its first byte (for foreign code that reads and
    /// writes the memory itself; see `Buffer::host_address`).
    pub(crate) fn address(&self) -> *mut u8 {
        self.map.as_mut_ptr()
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

    /// Appends the `len` bytes at `offset` to `out`, without zeroing its
    /// new capacity first.
    pub(crate) fn read_append(
        &self,
        offset: usize,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), OutOfRange> {
        self.check(offset, len)?;
        out.reserve(len);
        // SAFETY: the source range lies within the live mapping (checked
        // above) and is reached only through this raw pointer; the
        // destination is `out`'s spare capacity, at least `len` bytes
        // (reserved above), private memory that cannot overlap the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(offset),
                out.spare_capacity_mut().as_mut_ptr().cast::<u8>(),
                len,
            );
        }
        // SAFETY: the `len` bytes after the old length were just written,
        // within the capacity.
        unsafe { out.set_len(out.len() + len) };
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

/// Appends the `len` bytes of `file` at `offset` to `out`, read with
/// pread(2) instead of through a mapping: the kernel copies from the page
/// cache straight into `out`, with no page faults on the driver's mapping
/// and, where the file has holes (bytes never written), without
/// allocating pages for them. Worth it for long runs only: one call each.
///
/// # Errors
/// The read's error, or `UnexpectedEof` when the file ends first.
pub(crate) fn pread_append(
    file: &File,
    offset: usize,
    len: usize,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    out.reserve(len);
    let mut done = 0usize;
    while done < len {
        let at = offset
            .checked_add(done)
            .and_then(|a| nix::libc::off_t::try_from(a).ok())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let spare = out.spare_capacity_mut();
        let want = (len - done).min(spare.len());
        // SAFETY: `spare` is `out`'s uninitialized capacity, valid for
        // writes of `want` ≤ its length bytes; pread writes at most `want`.
        let n = unsafe { nix::libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), want, at) };
        match usize::try_from(n) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                // SAFETY: pread initialized the first `n` ≤ `want` bytes
                // of the spare capacity.
                unsafe { out.set_len(out.len() + n) };
                done += n;
            }
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
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
