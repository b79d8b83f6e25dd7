//! Raw memory: the simulated chip's own device memory, and the host memory
//! that host-backed arguments live in.
//!
//! This module and `kernel/view.rs` are the only places that touch memory
//! through raw pointers. Memory that another thread, kernel or process may
//! write at the same time is never turned into a Rust reference; it is only
//! read and written by raw copies at bounds-checked addresses.

use std::fmt;
use std::ptr::NonNull;

use bytes::Bytes;
use memmap2::{MmapMut, UncheckedAdvice};
use strata_wire::Tensor;

use crate::staging;

use crate::Error;

/// Device address of byte 0 of device memory. Device addresses are not host
/// pointers; offsetting them keeps 0 invalid (DEVICE_MALLOC bodies must be
/// nonzero) and makes a device address passed as a host pointer obvious.
pub const DEVICE_BASE: u64 = 0x0000_1000_0000_0000;

/// The simulated chip's memory: one anonymous mapping of its own, separate
/// from every host buffer.
pub(crate) struct DeviceMemory {
    // Owns the mapping; never dereferenced after construction (see `ptr`),
    // only advised (`zero`).
    _map: MmapMut,
    ptr: NonNull<u8>,
    len: u64,
}

// SAFETY: DeviceMemory hands out only bounds-checked raw pointers and raw
// copies; which thread touches which bytes when is decided by the arena (no
// two live blocks overlap) and by the callers' ordering of tasks, exactly as
// for memory shared with a DMA engine.
unsafe impl Send for DeviceMemory {}
// SAFETY: as above; no method takes `&mut self` or creates references.
unsafe impl Sync for DeviceMemory {}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceMemory({} bytes at {:#x})", self.len, DEVICE_BASE)
    }
}

impl DeviceMemory {
    pub(crate) fn new(len: u64) -> Result<Self, Error> {
        let map_err = |reason: String| Error::Map { bytes: len, reason };
        let size =
            usize::try_from(len).map_err(|_| map_err("larger than the address space".into()))?;
        let mut map = MmapMut::map_anon(size.max(1)).map_err(|e| map_err(e.to_string()))?;
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| map_err("null mapping".into()))?;
        Ok(DeviceMemory {
            _map: map,
            ptr,
            len,
        })
    }

    /// The host pointer behind device range `[addr, addr + len)`.
    pub(crate) fn ptr(&self, addr: u64, len: u64) -> Result<*mut u8, Error> {
        let out = || Error::OutOfRange {
            addr,
            len,
            what: "device memory",
        };
        let offset = addr.checked_sub(DEVICE_BASE).ok_or_else(out)?;
        let end = offset.checked_add(len).ok_or_else(out)?;
        if end > self.len {
            return Err(out());
        }
        let offset = usize::try_from(offset).map_err(|_| out())?;
        // SAFETY: offset + len ≤ self.len, the size of the mapping, so the
        // result stays inside the same allocation.
        Ok(unsafe { self.ptr.as_ptr().add(offset) })
    }

    /// Zeroes device range `[addr, addr + len)`.
    ///
    /// With `release` set, the whole pages inside the range are handed back
    /// to the kernel (`MADV_DONTNEED` on this private anonymous mapping:
    /// they read as zeros again, and cost no memory until touched) and only
    /// the ragged ends are written; that is for large allocations, which
    /// may never be touched in full. Hot paths (a kernel's scratch, a
    /// staged view) pass `false`: their pages are about to be written, and
    /// handing them back would make every task fault them in again.
    pub(crate) fn zero(&self, addr: u64, len: u64, release: bool) -> Result<(), Error> {
        let dst = self.ptr(addr, len)?;
        let len = usize::try_from(len).map_err(|_| Error::OutOfRange {
            addr,
            len,
            what: "device memory",
        })?;
        let (mut head, mut tail) = (len, 0usize);
        if release {
            let page = page_size();
            // Whole pages inside [dst, dst + len): [first, last).
            let start = dst as usize;
            let first = start.next_multiple_of(page);
            let last = (start + len) / page * page;
            if last > first {
                let offset = first - self.ptr.as_ptr() as usize;
                // SAFETY: [offset, offset + (last - first)) is page-aligned
                // and lies inside [addr, addr + len), which `ptr` checked
                // against the mapping; those pages belong to the caller's
                // block alone (no two live blocks share a byte, and a page
                // wholly inside one block holds no other block's byte), and
                // nothing holds a reference into device memory.
                let dropped = unsafe {
                    self._map.unchecked_advise_range(
                        UncheckedAdvice::DontNeed,
                        offset,
                        last - first,
                    )
                };
                if dropped.is_ok() {
                    head = first - start;
                    tail = start + len - last;
                }
            }
        }
        // SAFETY: `dst` is valid for `len` bytes (checked by `ptr`); the
        // head and tail lie inside it.
        unsafe {
            std::ptr::write_bytes(dst, 0, head);
            if tail > 0 {
                std::ptr::write_bytes(dst.add(len - tail), 0, tail);
            }
        }
        Ok(())
    }

    /// Copies `src` to device address `addr`.
    pub(crate) fn write(&self, addr: u64, src: &[u8]) -> Result<(), Error> {
        let dst = self.ptr(addr, src.len() as u64)?;
        // SAFETY: `dst` is valid for src.len() bytes (checked by `ptr`) and a
        // caller's slice cannot overlap the device mapping, which no one
        // outside this module can borrow.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies device bytes at `addr` into `dst`.
    pub(crate) fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), Error> {
        let src = self.ptr(addr, dst.len() as u64)?;
        // SAFETY: as in `write`, with the roles swapped.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

/// The system's page size (4 KiB when it cannot be read).
fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// Host memory that host-backed kernel arguments live in: a mapped memfd on
/// a worker, or a [`HostBuffer`].
///
/// # Safety
/// Implementors guarantee that `as_ptr()..as_ptr() + len()` stays mapped and
/// readable (and writable when `writable()` says so) for as long as the value
/// lives, and that while strata may access it, no code turns those bytes into
/// Rust references (other processes may write them; only raw copies are
/// sound).
pub unsafe trait HostMemory: Send + Sync + fmt::Debug {
    /// First byte.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the bytes may be written.
    fn writable(&self) -> bool;
    /// Whether the memory is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The memory this is a face of (a read-only face of a writable
    /// mapping, say), if it is one: what a chip prepares for DMA and keeps
    /// while anyone holds it is the memory itself, not each face made of
    /// it.
    fn underlying(&self) -> Option<std::sync::Arc<dyn HostMemory>> {
        None
    }
}

/// Page-aligned, zero-initialized host memory owned by the process: what
/// tests, benchmarks and single-process users back host tensors with.
pub struct HostBuffer {
    _map: MmapMut,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: as for DeviceMemory: only raw, bounds-checked copies.
unsafe impl Send for HostBuffer {}
// SAFETY: as above.
unsafe impl Sync for HostBuffer {}

/// A [`HostBuffer`] no one can write any more ([`HostBuffer::into_bytes`]).
struct Frozen(HostBuffer);

impl AsRef<[u8]> for Frozen {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the mapping is this process's private anonymous memory,
        // mapped and readable for `len` bytes while the buffer lives (it
        // lives in `self`); the buffer was moved in by value, so no
        // `HostBuffer` method or other handle can write it while the
        // slice is borrowed, and no other process can map it.
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr(), self.0.len) }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBuffer({} bytes)", self.len)
    }
}

impl HostBuffer {
    /// `len` zero bytes.
    ///
    /// # Errors
    /// [`Error::Map`] when the memory cannot be mapped.
    pub fn new(len: usize) -> Result<Self, Error> {
        let mut map = MmapMut::map_anon(len.max(1)).map_err(|e| Error::Map {
            bytes: len as u64,
            reason: e.to_string(),
        })?;
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| Error::Map {
            bytes: len as u64,
            reason: "null mapping".into(),
        })?;
        Ok(HostBuffer {
            _map: map,
            ptr,
            len,
        })
    }

    /// Every byte of the buffer as [`Bytes`], without a copy: the mapping
    /// moves into the `Bytes` and is unmapped when its last clone drops.
    /// Taking the buffer by value is what makes this sound: no one is left
    /// to write it.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(Frozen(self))
    }

    /// A buffer holding a copy of `bytes`.
    ///
    /// # Errors
    /// As [`HostBuffer::new`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let b = HostBuffer::new(bytes.len())?;
        b.write(0, bytes)?;
        Ok(b)
    }

    /// Copies `bytes` in at `offset`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when the range does not fit.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<(), Error> {
        let dst = self.range(offset, bytes.len())?;
        // SAFETY: `range` checked the bounds; `bytes` is caller memory, which
        // cannot overlap this private mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }

    /// Copies `len` bytes out from `offset`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when the range does not fit.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>, Error> {
        let src = self.range(offset, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) };
        Ok(out)
    }

    /// A copy of every byte.
    pub fn to_vec(&self) -> Vec<u8> {
        self.read(0, self.len).unwrap_or_default()
    }

    /// Copies a view's packed bytes (as [`crate::staging::pack`] lays
    /// them out) into the view's elements, run after run, straight from
    /// the packed string: no intermediate copy of the extent.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when the view's extent does not fit the
    /// buffer or `packed` is not exactly the view's packed length; nothing
    /// is copied then.
    pub fn unpack(&self, view: &Tensor, packed: &[u8]) -> Result<(), Error> {
        let base = self.view_range(view)?;
        if packed.len() as u64 != staging::packed_len(view) {
            return Err(Error::OutOfRange {
                addr: 0,
                len: packed.len() as u64,
                what: "the view's packed bytes",
            });
        }
        let mut at = 0usize;
        staging::for_each_run(view, |off, len| {
            let src = at.checked_add(len).and_then(|end| packed.get(at..end));
            // Runs lie inside the extent (tested against the byte-set
            // oracle) and their lengths sum to `packed.len()`; checked
            // again here because it is cheap next to the copy.
            if let (Some(src), true) = (src, off.saturating_add(len) <= base.1) {
                // SAFETY: `view_range` checked that the extent starting at
                // `base.0` lies in the mapping, and `off + len` ≤ extent;
                // `packed` is caller memory, never this private mapping.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), base.0.add(off), len) };
            }
            at = at.saturating_add(len);
        });
        Ok(())
    }

    /// The view's bytes, packed run after run into a string allocated
    /// at its final size (once, unless the view's elements share bytes),
    /// without zeroing it first.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when the view's extent does not fit the
    /// buffer (or, which the geometry rules out, its runs do not add up to
    /// its packed length).
    pub fn pack(&self, view: &Tensor) -> Result<Vec<u8>, Error> {
        let base = self.view_range(view)?;
        let want = usize::try_from(staging::packed_len(view)).unwrap_or(usize::MAX);
        let mut out: Vec<u8> = Vec::with_capacity(want.min(base.1));
        staging::for_each_run(view, |off, len| {
            // More than the extent only for a view whose elements share
            // bytes: its packed form repeats them.
            out.reserve(len);
            let spare = out.spare_capacity_mut();
            if len <= spare.len() && off.saturating_add(len) <= base.1 {
                // SAFETY: `off + len` ≤ extent, which `view_range` checked
                // lies in the mapping; the destination is the Vec's spare
                // capacity, at least `len` bytes, which cannot overlap the
                // mapping. Only raw copies read the mapping.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        base.0.add(off),
                        spare.as_mut_ptr().cast::<u8>(),
                        len,
                    );
                };
                // SAFETY: the `len` bytes after the old length were just
                // written, within the capacity.
                unsafe { out.set_len(out.len() + len) };
            }
        });
        if out.len() != want {
            return Err(Error::OutOfRange {
                addr: view.byte_offset(),
                len: want as u64,
                what: "the view's packed bytes",
            });
        }
        Ok(out)
    }

    /// The first byte of `view`'s extent in this buffer and the extent's
    /// length, once both are checked to lie inside it.
    fn view_range(&self, view: &Tensor) -> Result<(*mut u8, usize), Error> {
        let too_far = || Error::OutOfRange {
            addr: view.byte_offset(),
            len: view.extent_bytes(),
            what: "the host buffer",
        };
        let first = usize::try_from(view.byte_offset()).map_err(|_| too_far())?;
        let extent = usize::try_from(view.extent_bytes()).map_err(|_| too_far())?;
        Ok((self.range(first, extent)?, extent))
    }

    fn range(&self, offset: usize, len: usize) -> Result<*mut u8, Error> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: offset ≤ len of the mapping.
                Ok(unsafe { self.ptr.as_ptr().add(offset) })
            }
            _ => Err(Error::OutOfRange {
                addr: offset as u64,
                len: len as u64,
                what: "the host buffer",
            }),
        }
    }
}

// SAFETY: the mapping lives as long as the HostBuffer, is readable and
// writable, and HostBuffer never hands out references to it.
unsafe impl HostMemory for HostBuffer {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn writable(&self) -> bool {
        true
    }
}

/// Read-only host memory over bytes that came in a message: an input
/// view's packed bytes are its extent when the view is contiguous, so the
/// kernel can read them where they were received instead of from a copy.
#[derive(Clone)]
pub struct HostBytes(Bytes);

impl HostBytes {
    /// Host memory over `bytes`, read-only.
    pub fn new(bytes: Bytes) -> Self {
        HostBytes(bytes)
    }
}

impl fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBytes({} bytes)", self.0.len())
    }
}

// SAFETY: `Bytes` is immutable and keeps its memory alive as long as this
// value; `writable()` is false, so strata never writes through `as_ptr`
// (the device refuses a written argument on read-only memory).
unsafe impl HostMemory for HostBytes {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr().cast_mut()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn writable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::check::{Rng, ViewClass, view_pair};

    /// `HostBuffer::pack` and `unpack` agree with the slice versions in
    /// `staging` on every class of view, and refuse what does not fit.
    #[test]
    fn pack_and_unpack_match_the_slice_versions() {
        let mut rng = Rng(11);
        for class in ViewClass::ALL {
            for _ in 0..300 {
                let (v, _) = view_pair(class, &mut rng);
                let end = usize::try_from(v.end_byte()).unwrap();
                let first = usize::try_from(v.byte_offset()).unwrap();
                let all: Vec<u8> = (0..end).map(|i| (i * 13 % 251) as u8).collect();
                let host = HostBuffer::from_bytes(&all).unwrap();
                let packed = host.pack(&v).unwrap();
                assert_eq!(Some(&packed), staging::pack(&v, &all[first..]).as_ref());

                let back = HostBuffer::new(end).unwrap();
                back.unpack(&v, &packed).unwrap();
                let mut want = vec![0u8; end];
                assert!(staging::unpack(&v, &packed, &mut want[first..]));
                assert_eq!(back.to_vec(), want, "{class:?} {v:?}");

                if let Some(short) = packed.len().checked_sub(1) {
                    assert!(back.unpack(&v, &packed[..short]).is_err());
                }
                if let Some(small) = end.checked_sub(1).filter(|_| v.extent_bytes() > 0) {
                    let small = HostBuffer::new(small).unwrap();
                    assert!(small.pack(&v).is_err());
                    assert!(small.unpack(&v, &packed).is_err());
                }
            }
        }
    }

    #[test]
    fn a_buffer_leaves_as_its_bytes_without_a_copy() {
        let b = HostBuffer::new(3 * 4096 + 5).unwrap();
        b.write(4096, &[1, 2, 3]).unwrap();
        let at = b.as_ptr().cast_const();
        let bytes = b.into_bytes();
        assert_eq!(bytes.len(), 3 * 4096 + 5);
        assert_eq!(bytes.as_ptr(), at, "the mapping itself, not a copy");
        assert_eq!(&bytes[4096..4099], &[1, 2, 3]);
        assert!(bytes[..4096].iter().all(|&x| x == 0));
        let tail = bytes.slice(4096..);
        drop(bytes);
        assert_eq!(&tail[..3], &[1, 2, 3], "a slice keeps the mapping");
    }

    #[test]
    fn host_bytes_are_read_only_and_in_place() {
        let b = Bytes::from(vec![1u8, 2, 3]);
        let h = HostBytes::new(b.clone());
        assert_eq!((h.len(), h.writable()), (3, false));
        assert_eq!(h.as_ptr().cast_const(), b.as_ptr());
    }
}
