//! Shared blocks on a GPU ([`crate::shared`]): each its own physical
//! allocation (`cuMemCreate`, exportable as a POSIX file descriptor),
//! mapped at an address range of its own with read-write access for its
//! device; exported with `cuMemExportToShareableHandle`, mapped elsewhere
//! with `cuMemImportFromShareableHandle`.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};

use super::engine::Gpu;
use crate::Error;
use crate::error::CudaError;
use crate::shared::Mapping;

/// A physical allocation mapped in this process.
#[derive(Debug)]
pub(crate) struct Vmm {
    handle: sys::CUmemGenericAllocationHandle,
    pub(crate) addr: sys::CUdeviceptr,
    pub(crate) size: usize,
}

fn prop(ordinal: u32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes:
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: location(ordinal),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn location(ordinal: u32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal as i32,
    }
}

/// `len` rounded up to the device's allocation granularity.
fn rounded(gpu: &Gpu, len: u64) -> Result<usize, Error> {
    let p = prop(gpu.ordinal);
    let mut g = 0usize;
    // SAFETY: valid pointers; the context is current (callers bind it).
    let r = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    gpu.check("cuMemGetAllocationGranularity", r)?;
    let len = usize::try_from(len).map_err(|_| Error::Shared {
        reason: format!("{len} bytes do not fit this process"),
    })?;
    Ok(len.next_multiple_of(g.max(1)))
}

/// Maps `handle`'s `size` bytes at a fresh range, read-write for the
/// device; on failure, undoes what it did (not the handle).
fn map(gpu: &Gpu, handle: sys::CUmemGenericAllocationHandle, size: usize) -> Result<Vmm, Error> {
    let mut addr: sys::CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the context is current.
    let r = unsafe { sys::cuMemAddressReserve(&mut addr, size, 0, 0, 0) };
    gpu.check("cuMemAddressReserve", r)?;
    // SAFETY: the range just reserved, of `size` bytes, and a live handle
    // of at least that many.
    let r = unsafe { sys::cuMemMap(addr, size, 0, handle, 0) };
    if let Err(e) = gpu.check("cuMemMap", r) {
        // SAFETY: reserved above, freed once.
        unsafe { sys::cuMemAddressFree(addr, size) };
        return Err(e);
    }
    let access = sys::CUmemAccessDesc {
        location: location(gpu.ordinal),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range mapped above; one descriptor.
    let r = unsafe { sys::cuMemSetAccess(addr, size, &access, 1) };
    if let Err(e) = gpu.check("cuMemSetAccess", r) {
        // SAFETY: mapped and reserved above, each undone once.
        unsafe {
            sys::cuMemUnmap(addr, size);
            sys::cuMemAddressFree(addr, size);
        }
        return Err(e);
    }
    Ok(Vmm { handle, addr, size })
}

/// A new shared block of at least `len` bytes on `gpu` (not zeroed).
pub(crate) fn create(gpu: &Gpu, len: u64) -> Result<Vmm, Error> {
    gpu.bind()?;
    let size = rounded(gpu, len)?;
    let p = prop(gpu.ordinal);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid pointers; the context is current.
    let r = unsafe { sys::cuMemCreate(&mut handle, size, &p, 0) };
    if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(CudaError::OutOfMemory {
            ordinal: gpu.ordinal,
            call: "cuMemCreate",
            asked: size as u64,
            free: super::engine::mem_info().map_or(0, |(f, _)| f),
        }
        .into());
    }
    gpu.check("cuMemCreate", r)?;
    map(gpu, handle, size).inspect_err(|_| {
        // SAFETY: created above, released once.
        unsafe { sys::cuMemRelease(handle) };
    })
}

/// Unmaps and releases `v` (what other processes mapped stays theirs).
pub(crate) fn release(gpu: &Gpu, v: &Vmm) {
    if gpu.bind_even_lost().is_err() {
        return;
    }
    // SAFETY: mapped, reserved and created by `create`/`import`, each
    // undone once; the caller waited for work that used it.
    unsafe {
        sys::cuMemUnmap(v.addr, v.size);
        sys::cuMemAddressFree(v.addr, v.size);
        sys::cuMemRelease(v.handle);
    }
}

/// A new POSIX file descriptor for `v`'s memory.
pub(crate) fn export(gpu: &Gpu, v: &Vmm) -> Result<OwnedFd, Error> {
    gpu.bind()?;
    let mut fd: i32 = -1;
    // SAFETY: for a POSIX handle the driver writes an int through the
    // pointer; the handle is live.
    let r = unsafe {
        sys::cuMemExportToShareableHandle(
            std::ptr::from_mut(&mut fd).cast::<c_void>(),
            v.handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    gpu.check("cuMemExportToShareableHandle", r)?;
    if fd < 0 {
        return Err(Error::Shared {
            reason: format!("the driver exported descriptor {fd}"),
        });
    }
    // SAFETY: a descriptor the driver just opened for us, owned by no one
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Another process's shared block, imported and mapped here.
#[derive(Debug)]
pub(crate) struct Imported {
    gpu: Arc<Gpu>,
    vmm: Vmm,
}

impl Mapping for Imported {
    fn read(&self, at: u64, dst: &mut [u8]) -> Result<(), Error> {
        self.gpu.bind()?;
        // SAFETY: the caller checked `at..at + len` lies in the mapping.
        let r = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), at, dst.len()) };
        self.gpu.check("cuMemcpyDtoH", r)
    }

    fn write(&self, at: u64, src: &[u8]) -> Result<(), Error> {
        self.gpu.bind()?;
        // The caller checked `at..at + len` lies in the mapping.
        self.gpu.write_sync(at, src)
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        release(&self.gpu, &self.vmm);
    }
}

/// Maps the shared block behind `fd` (`len` bytes, on GPU `ordinal`) in
/// this process: its device address here and what keeps it mapped.
pub(crate) fn import(fd: &OwnedFd, len: u64, ordinal: u32) -> Result<(u64, Imported), Error> {
    let count = super::probe::device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoDevice { ordinal, count }.into());
    }
    let gpu = Arc::new(Gpu::open(ordinal)?);
    let vmm = import_into(&gpu, fd, len)?;
    Ok((vmm.addr, Imported { gpu, vmm }))
}

/// Imports the shared block behind `fd` (`len` bytes) into `gpu`'s
/// context and maps it there; [`release`] undoes it.
pub(crate) fn import_into(gpu: &Gpu, fd: &OwnedFd, len: u64) -> Result<Vmm, Error> {
    gpu.bind()?;
    let size = rounded(gpu, len)?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: for a POSIX handle the descriptor's number goes in the
    // pointer; the driver refuses a descriptor it did not export (and
    // takes its own reference: ours stays ours).
    let r = unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            fd.as_raw_fd() as usize as *mut c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    };
    gpu.check("cuMemImportFromShareableHandle", r)?;
    map(gpu, handle, size).inspect_err(|_| {
        // SAFETY: imported above, released once.
        unsafe { sys::cuMemRelease(handle) };
    })
}
