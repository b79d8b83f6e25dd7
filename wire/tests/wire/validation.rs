//! Every rule of docs/wire-format.md §3 and §4, broken one at a time: each rejection names the
//! field. Also: blobs with hostile counts are refused without allocating
//! for the claimed count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use strata_wire::{
    Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, Error, TaskArgs,
    Tensor,
};

use crate::{memfd_buffer, sample_tensor};

/// Counts the bytes the current thread allocates, so a test can prove a
/// decoder did not size an allocation by a hostile count.
struct CountingAlloc;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: defers to System for every operation and only adds a
// thread-local counter update, which does not allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.with(|a| a.set(a.get() + layout.size()));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocated_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

fn put(bytes: &mut [u8], at: usize, value: u64, n: usize) {
    bytes[at..at + n].copy_from_slice(&value.to_le_bytes()[..n]);
}

/// Decodes `sample_tensor()` with one field overwritten and returns the
/// field the error names.
fn rejected_field(edit: impl FnOnce(&mut [u8])) -> String {
    let mut b = sample_tensor().encode();
    edit(&mut b);
    let err = Tensor::decode(&b).expect_err("edited tensor must be rejected");
    let msg = err.to_string();
    let field = err
        .field()
        .unwrap_or_else(|| panic!("error names no field: {msg}"))
        .to_owned();
    assert!(msg.contains(&field), "message {msg:?} names {field}");
    field
}

#[test]
fn descriptor_rules_name_their_field() {
    assert_eq!(rejected_field(|b| put(b, 0, 0x5343, 2)), "buffer.magic");
    assert_eq!(rejected_field(|b| put(b, 2, 2, 1)), "buffer.address_space");
    assert_eq!(rejected_field(|b| put(b, 3, 3, 1)), "buffer.access");
    assert_eq!(rejected_field(|b| put(b, 4, 7, 1)), "buffer.backend_kind");
    assert_eq!(
        rejected_field(|b| put(b, 24, 0, 4)),
        "buffer.identity.generation"
    );
    assert_eq!(rejected_field(|b| put(b, 52, 33, 2)), "buffer.body_len");
    assert_eq!(
        rejected_field(|b| put(b, 52, 8, 2)),
        "buffer.body[8]",
        "MEMFD body is 16 bytes; 8..16 now trail"
    );
    assert_eq!(rejected_field(|b| put(b, 80, 1, 1)), "buffer.body[24]");
}

#[test]
fn descriptor_body_rules() {
    // Rewrite the sample's descriptor as another backend kind.
    let with = |kind: u64, space: u64, access: u64, body: &[u8]| {
        rejected_field(|b| {
            put(b, 2, space, 1);
            put(b, 3, access, 1);
            put(b, 4, kind, 1);
            b[56..88].fill(0);
            b[56..56 + body.len()].copy_from_slice(body);
            put(b, 52, body.len() as u64, 2);
        })
    };
    assert_eq!(
        with(1, 0, 2, b"shm/name"),
        "buffer.body.name[3]",
        "POSIX_SHM name with '/'"
    );
    assert_eq!(
        with(1, 0, 2, b"shm name"),
        "buffer.body.name[3]",
        "POSIX_SHM name with a space"
    );
    assert_eq!(
        with(1, 0, 2, b""),
        "buffer.body_len",
        "empty POSIX_SHM name"
    );
    assert_eq!(
        with(5, 0, 1, &0x1000u64.to_le_bytes()),
        "buffer.access",
        "FORK_COW granting WRITE"
    );
    assert_eq!(
        with(5, 0, 2, &0x1000u64.to_le_bytes()),
        "buffer.access",
        "FORK_COW granting READWRITE"
    );
    assert_eq!(
        with(4, 0, 2, &0x1000u64.to_le_bytes()),
        "buffer.address_space",
        "DEVICE_MALLOC in HOST"
    );
    assert_eq!(
        with(2, 0, 2, &0x1000u64.to_le_bytes()),
        "buffer.address_space",
        "VMM_WINDOW in HOST"
    );
    assert_eq!(
        with(6, 1, 2, &[1; 16]),
        "buffer.address_space",
        "MEMFD in DEVICE"
    );
    assert_eq!(
        with(0, 0, 2, &0u64.to_le_bytes()),
        "buffer.body.address",
        "zero FORK_SHM address"
    );
    assert_eq!(
        with(4, 1, 2, &[1; 4]),
        "buffer.body_len",
        "short DEVICE_MALLOC body"
    );
    assert_eq!(
        with(3, 0, 2, &[1]),
        "buffer.body_len",
        "REMOTE_SIDECAR with a body"
    );
    assert_eq!(
        with(6, 0, 2, &[1; 15]),
        "buffer.body_len",
        "MEMFD body of 15"
    );
}

#[test]
fn tensor_rules_name_their_field() {
    assert_eq!(rejected_field(|b| put(b, 96, 0, 4)), "ndims");
    assert_eq!(rejected_field(|b| put(b, 96, 6, 4)), "ndims");
    assert_eq!(rejected_field(|b| put(b, 96, 0xffff_ffff, 4)), "ndims");
    assert_eq!(
        rejected_field(|b| put(b, 124, 0, 4)),
        "strides[1]",
        "zero stride"
    );
    assert_eq!(
        rejected_field(|b| put(b, 100, 0, 4)),
        "shapes[0]",
        "zero shape"
    );
    assert_eq!(
        rejected_field(|b| put(b, 112, 1, 4)),
        "shapes[3]",
        "shape slot past ndims"
    );
    assert_eq!(
        rejected_field(|b| put(b, 136, 1, 4)),
        "strides[4]",
        "stride slot past ndims"
    );
    assert_eq!(
        rejected_field(|b| put(b, 88, 66, 8)),
        "byte_offset",
        "F32 at byte 66"
    );
    assert_eq!(rejected_field(|b| put(b, 140, 15, 1)), "dtype");
    assert_eq!(
        rejected_field(|b| put(b, 40, 64, 8)),
        "view",
        "nbytes 64 is smaller than the view"
    );
    assert_eq!(
        rejected_field(|b| put(b, 88, (1 << 20) - 4, 8)),
        "view",
        "view runs past the end"
    );
    assert_eq!(
        rejected_field(|b| put(b, 88, u64::MAX - 3, 8)),
        "view",
        "offset + extent overflows"
    );
}

#[test]
fn out_of_bounds_message_says_by_how_much() {
    let buf = memfd_buffer(1, 256);
    let err = Tensor::new(buf, 200, &[8, 8], &[16, 1], DType::U8).unwrap_err();
    assert_eq!(
        err,
        Error::ViewOutOfBounds {
            field: "view".into(),
            byte_offset: 200,
            extent: 120,
            nbytes: 256
        }
    );
    assert_eq!(
        err.to_string(),
        "view out of bounds: byte_offset 200 + extent 120 ends past nbytes 256"
    );
}

#[test]
fn constructors_apply_the_same_rules() {
    let buf = memfd_buffer(1, 256);
    let field = |r: Result<Tensor, Error>| r.unwrap_err().field().map(str::to_owned);
    assert_eq!(
        field(Tensor::new(buf, 0, &[], &[], DType::U8)).as_deref(),
        Some("ndims")
    );
    assert_eq!(
        field(Tensor::new(buf, 0, &[1; 6], &[1; 6], DType::U8)).as_deref(),
        Some("ndims")
    );
    assert_eq!(
        field(Tensor::new(buf, 0, &[4], &[0], DType::U8)).as_deref(),
        Some("strides[0]")
    );
    assert_eq!(
        field(Tensor::new(buf, 0, &[4, 4], &[1], DType::U8)).as_deref(),
        Some("strides")
    );
    assert_eq!(
        field(Tensor::new(buf, 2, &[4], &[1], DType::F32)).as_deref(),
        Some("byte_offset")
    );
    assert_eq!(
        field(Tensor::row_major(buf, 0, &[65536, 65536, 2], DType::U8)).as_deref(),
        Some("strides[0]")
    );
    assert_eq!(
        CanonicalIdentity::new([0; 8], 1, 0).unwrap_err().field(),
        Some("generation")
    );
    let id = CanonicalIdentity::new([0; 8], 1, 1).unwrap();
    let cow = Backing::ForkCow {
        addr: std::num::NonZeroU64::new(64).unwrap(),
    };
    let err =
        BufferDescriptor::new(id, 64, AddressSpace::Host, Access::ReadWrite, cow).unwrap_err();
    assert_eq!(err.field(), Some("access"));
    let d = BufferDescriptor::new(id, 64, AddressSpace::Host, Access::Read, cow).unwrap();
    assert_eq!(
        d.narrowed(Access::Write),
        Err(Error::AccessWidened {
            granted: Access::Read,
            requested: Access::Write
        })
    );
    // FP4: two per byte, byte offsets need no alignment; extents round up.
    let t = Tensor::new(buf, 3, &[5], &[1], DType::Fp4E2M1).unwrap();
    assert_eq!(t.extent_bytes(), 3);
    let t = Tensor::new(buf, 0, &[2, 3], &[16, 2], DType::F16).unwrap();
    assert_eq!(t.extent_bytes(), (16 + 2 * 2 + 1) * 2);
}

fn blob_header(t: i32, s: i32, body: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + body);
    b.extend_from_slice(&t.to_le_bytes());
    b.extend_from_slice(&s.to_le_bytes());
    b.resize(8 + body, 0);
    b
}

#[test]
fn hostile_blob_counts_are_refused_before_allocating() {
    let cases: [(i32, i32, usize, &str); 8] = [
        (-1, 0, 0, "tensor_count"),
        (i32::MIN, 0, 0, "tensor_count"),
        (0, -1, 0, "scalar_count"),
        (257, 0, 0, "tensor_count"),
        (i32::MAX, 0, 0, "tensor_count"),
        (0, 129, 0, "scalar_count"),
        (0, i32::MAX, 0, "scalar_count"),
        (-5, -5, 0, "tensor_count"),
    ];
    for (t, s, body, field) in cases {
        let bytes = blob_header(t, s, body);
        let (result, allocated) = allocated_during(|| TaskArgs::decode(&bytes));
        let err = result.unwrap_err();
        assert_eq!(err.field(), Some(field), "T={t} S={s}: {err}");
        assert!(
            allocated < 256,
            "T={t} S={s}: decode allocated {allocated} bytes"
        );
        assert_eq!(TaskArgs::validate(&bytes).unwrap_err(), err);
    }
    // Counts within limits but more than the bytes present: refused as
    // truncated, and nothing is reserved for the 256 claimed tensors.
    let bytes = blob_header(256, 128, 144);
    let (result, allocated) = allocated_during(|| TaskArgs::decode(&bytes));
    assert_eq!(
        result,
        Err(Error::Truncated {
            what: "task args",
            needed: 8 + 256 * 144 + 128 * 8,
            available: 152
        })
    );
    assert_eq!(allocated, 0);
    // Too many bytes is an error too, not a silent truncation.
    let bytes = blob_header(0, 1, 9);
    assert!(matches!(
        TaskArgs::decode(&bytes),
        Err(Error::TrailingBytes {
            expected: 16,
            available: 17,
            ..
        })
    ));
    // A short header.
    assert!(matches!(
        TaskArgs::decode(&[1, 0, 0]),
        Err(Error::Truncated {
            needed: 4,
            available: 3,
            ..
        })
    ));
}

#[test]
fn blob_tensor_errors_say_which_tensor() {
    let t = sample_tensor();
    let mut bytes = TaskArgs::new(vec![t, t, t], vec![1]).unwrap().encode();
    bytes[8 + 2 * 144 + 96] = 9; // tensors[2].ndims
    let err = TaskArgs::decode(&bytes).unwrap_err();
    assert_eq!(err.field(), Some("tensors[2].ndims"));
    assert_eq!(
        err.to_string(),
        "invalid tensors[2].ndims = 9: must be 1 to 5"
    );
    assert_eq!(TaskArgs::validate(&bytes), Err(err));
    assert_eq!(
        TaskArgs::new(vec![t; 257], vec![]).unwrap_err().field(),
        Some("tensor_count")
    );
    assert_eq!(
        TaskArgs::new(vec![], vec![0; 129]).unwrap_err().field(),
        Some("scalar_count")
    );
    let full = TaskArgs::new(vec![t; 256], vec![7; 128]).unwrap();
    assert_eq!(TaskArgs::decode(&full.encode()), Ok(full));
}

/// An alias only narrows access (docs/wire-format.md §3): every narrowing is accepted,
/// every widening (and the sideways READ ↔ WRITE) refused, naming both.
#[test]
fn a_derived_descriptor_only_narrows_access() {
    use Access::{Read, ReadWrite, Write};
    let rw = memfd_buffer(7, 4096);
    for (from, to, ok) in [
        (ReadWrite, ReadWrite, true),
        (ReadWrite, Read, true),
        (ReadWrite, Write, true),
        (Read, Read, true),
        (Write, Write, true),
        (Read, ReadWrite, false),
        (Write, ReadWrite, false),
        (Read, Write, false),
        (Write, Read, false),
    ] {
        assert_eq!(to.is_within(from), ok, "{to} within {from}");
        let base = rw.narrowed(from).unwrap();
        match base.narrowed(to) {
            Ok(d) => {
                assert!(ok, "{from} -> {to} must be refused");
                assert_eq!(d.access(), to);
                assert_eq!(d.identity(), rw.identity());
                assert_eq!(d.nbytes(), rw.nbytes());
                assert_eq!(d.backing(), rw.backing());
            }
            Err(e) => {
                assert!(!ok, "{from} -> {to} must be accepted: {e}");
                assert_eq!(
                    e,
                    Error::AccessWidened {
                        granted: from,
                        requested: to
                    }
                );
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("access {to} is wider than the granted {from}")),
                    "{msg}"
                );
            }
        }
    }
}
