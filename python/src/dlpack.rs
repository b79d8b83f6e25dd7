//! DLPack capsules of shared device arrays: `Array.__dlpack__`, so that
//! numpy (host memory of a simulated chip), CuPy or PyTorch (device memory
//! of a GPU) read and write a shared device buffer in place.
//!
//! The capsule is DLPack 1's versioned one (`"dltensor_versioned"`, with
//! the read-only flag of a view that does not grant writes) for a consumer
//! that asks for version 1 or later, else the unversioned one
//! (`"dltensor"`, which consumers may treat as read-only): a managed
//! tensor whose `manager_ctx` owns the mapping of the buffer's memory in
//! this process and the shape and strides the tensor points at. The
//! consumer renames the capsule `"used_…"` and calls the deleter when it
//! is done; a capsule dropped unconsumed is deleted by its destructor. This module is the crate's second `unsafe`
//! (the C structures and CPython's capsule calls), allowed here only.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use strata_chip_runtime::shared::{MappedMemory, Place};
use strata_wire::{DType, Tensor};

use crate::errors::invalid_view;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// The read-only flag of a versioned tensor.
const READ_ONLY: u64 = 1;

/// What a capsule's tensor points into, freed by its deleter: the managed
/// tensor of one of the two kinds, first.
#[repr(C)]
struct Owned<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _memory: MappedMemory,
}

const CPU: i32 = 1;
const CUDA: i32 = 2;
const NAME: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

/// `(device type, device id)` of memory at `place`, DLPack's numbering.
pub(crate) fn device(place: Place) -> (i32, i32) {
    match place {
        Place::Host => (CPU, 0),
        Place::Cuda(n) => (CUDA, n as i32),
    }
}

/// DLPack's `(code, bits)` of `d`, or why it has none.
fn dtype(d: DType) -> Result<(u8, u8), String> {
    const INT: u8 = 0;
    const UINT: u8 = 1;
    const FLOAT: u8 = 2;
    const BFLOAT: u8 = 4;
    const COMPLEX: u8 = 5;
    const BOOL: u8 = 6;
    Ok(match d {
        DType::F32 => (FLOAT, 32),
        DType::F64 => (FLOAT, 64),
        DType::F16 => (FLOAT, 16),
        DType::BF16 => (BFLOAT, 16),
        DType::I8 => (INT, 8),
        DType::I16 => (INT, 16),
        DType::I32 => (INT, 32),
        DType::I64 => (INT, 64),
        DType::U8 => (UINT, 8),
        DType::U16 => (UINT, 16),
        DType::U32 => (UINT, 32),
        DType::U64 => (UINT, 64),
        DType::Bool => (BOOL, 8),
        DType::C64 => (COMPLEX, 64),
        DType::C128 => (COMPLEX, 128),
        other => {
            return Err(format!(
                "{} has no DLPack type this package hands out",
                other.name()
            ));
        }
    })
}

unsafe extern "C" fn deleter(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `manager_ctx` is the `Owned` box `capsule` leaked, and DLPack
    // calls the deleter once.
    drop(unsafe { Box::from_raw((*m).manager_ctx.cast::<Owned<DLManagedTensor>>()) });
}

unsafe extern "C" fn deleter_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as for `deleter`.
    drop(unsafe { Box::from_raw((*m).manager_ctx.cast::<Owned<DLManagedTensorVersioned>>()) });
}

unsafe extern "C" fn destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: a capsule CPython hands its destructor; renamed
    // "used_dltensor" by a consumer, it is not ours to delete any more.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DLManagedTensor>();
            if let Some(d) = (*m).deleter {
                d(m);
            }
        }
    }
}

unsafe extern "C" fn destructor_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as for `destructor`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(d) = (*m).deleter {
                d(m);
            }
        }
    }
}

/// Hands `owned` to a new capsule named `name`, its managed tensor's
/// context pointing back at it.
fn into_capsule<'py, M>(
    py: Python<'py>,
    owned: Box<Owned<M>>,
    name: &'static CStr,
    set_ctx: fn(&mut M, *mut c_void),
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
) -> PyResult<Bound<'py, PyAny>> {
    let raw = Box::into_raw(owned);
    // SAFETY: `raw` is a live box; the managed tensor is its first field.
    let managed = unsafe {
        set_ctx(&mut (*raw).managed, raw.cast());
        std::ptr::addr_of_mut!((*raw).managed)
    };
    // SAFETY: a valid pointer, a static NUL-terminated name and a
    // destructor of the right signature; on failure the box is ours again.
    let cap = unsafe { ffi::PyCapsule_New(managed.cast(), name.as_ptr(), Some(destructor)) };
    if cap.is_null() {
        // SAFETY: not handed to any capsule: still only ours.
        drop(unsafe { Box::from_raw(raw) });
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference CPython just returned.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}

/// A capsule of `view` over `memory` (the mapping of its whole buffer):
/// versioned when `versioned`, with the read-only flag unless `writable`.
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    memory: MappedMemory,
    view: &Tensor,
    versioned: bool,
    writable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let (code, bits) = dtype(view.dtype()).map_err(invalid_view)?;
    if view.end_byte() > memory.len() {
        return Err(invalid_view(format!(
            "the view ends at byte {} of a mapping of {}",
            view.end_byte(),
            memory.len()
        )));
    }
    let (device_type, device_id) = device(memory.place());
    let shape: Vec<i64> = view.shape().iter().map(|&n| i64::from(n)).collect();
    let strides: Vec<i64> = view.strides().iter().map(|&s| i64::from(s)).collect();
    // The vectors' heap blocks do not move when the box takes them.
    let tensor = |shape: &mut Vec<i64>, strides: &mut Vec<i64>| DLTensor {
        data: memory.addr() as *mut c_void,
        device: DLDevice {
            device_type,
            device_id,
        },
        ndim: view.shape().len() as i32,
        dtype: DLDataType {
            code,
            bits,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: view.byte_offset(),
    };
    let (mut shape, mut strides) = (shape, strides);
    let dl_tensor = tensor(&mut shape, &mut strides);
    if versioned {
        let owned = Box::new(Owned {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(deleter_versioned),
                flags: if writable { 0 } else { READ_ONLY },
                dl_tensor,
            },
            shape,
            strides,
            _memory: memory,
        });
        into_capsule(
            py,
            owned,
            VERSIONED,
            |m, ctx| m.manager_ctx = ctx,
            destructor_versioned,
        )
    } else {
        let owned = Box::new(Owned {
            managed: DLManagedTensor {
                dl_tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(deleter),
            },
            shape,
            strides,
            _memory: memory,
        });
        into_capsule(py, owned, NAME, |m, ctx| m.manager_ctx = ctx, destructor)
    }
}
