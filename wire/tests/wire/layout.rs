//! Every size and field offset of the wire format, pinned.

use std::mem::{align_of, size_of};

use strata_wire::{
    Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, ChipTensor,
    DESCRIPTOR_SIZE, DType, IDENTITY_SIZE, TENSOR_SIZE, TaskArgs, Tensor,
};

use crate::sample_tensor;

fn le(bytes: &[u8], at: usize, n: usize) -> u64 {
    bytes[at..at + n]
        .iter()
        .rev()
        .fold(0, |acc, &b| (acc << 8) | u64::from(b))
}

#[test]
fn sizes() {
    assert_eq!(IDENTITY_SIZE, 32);
    assert_eq!(DESCRIPTOR_SIZE, 88);
    assert_eq!(TENSOR_SIZE, 144);
    let t = sample_tensor();
    assert_eq!(t.identity().encode().len(), 32);
    assert_eq!(t.buffer().encode().len(), 88);
    assert_eq!(t.encode().len(), 144);
    assert_eq!(size_of::<ChipTensor>(), 128);
    assert_eq!(align_of::<ChipTensor>(), 64);
}

#[test]
fn identity_offsets() {
    let id = CanonicalIdentity::new([1, 2, 3, 4, 5, 6, 7, 8], 0x1122_3344_5566_7788, 9).unwrap();
    let b = id.encode();
    assert_eq!(&b[0..8], &[1, 2, 3, 4, 5, 6, 7, 8], "owner_instance_id @0");
    assert_eq!(le(&b, 8, 8), 0x1122_3344_5566_7788, "buffer_id @8");
    assert_eq!(le(&b, 16, 4), 9, "generation @16");
    assert!(b[20..32].iter().all(|&x| x == 0), "pad @20..32");
    assert_eq!(CanonicalIdentity::decode(&b), Ok(id));
}

#[test]
fn identity_padding_is_ignored_by_equality() {
    let id = CanonicalIdentity::new([9; 8], 5, 2).unwrap();
    let mut b = id.encode();
    b[20..32].fill(0xee);
    let other = CanonicalIdentity::decode(&b).unwrap();
    assert_eq!(other, id);
    assert!(std::collections::HashSet::from([id]).contains(&other));
}

#[test]
fn descriptor_offsets() {
    let t = sample_tensor();
    let b = t.buffer().encode();
    assert_eq!(le(&b, 0, 2), 0x5342, "magic @0");
    assert_eq!(le(&b, 2, 1), 0, "address_space @2");
    assert_eq!(le(&b, 3, 1), 2, "access @3");
    assert_eq!(le(&b, 4, 1), 6, "backend_kind @4");
    assert_eq!(le(&b, 5, 3), 0, "pad @5");
    assert_eq!(&b[8..40], &t.identity().encode(), "identity @8");
    assert_eq!(le(&b, 40, 8), 1 << 20, "nbytes @40");
    assert_eq!(le(&b, 48, 4), 0x0c0c, "owner_worker_path_id @48");
    assert_eq!(le(&b, 52, 2), 16, "body_len @52");
    assert_eq!(le(&b, 54, 2), 0, "pad @54");
    assert_eq!(le(&b, 56, 8), 0xaaaa, "body st_dev @56");
    assert_eq!(le(&b, 64, 8), 0xbbbb, "body st_ino @64");
    assert!(b[72..88].iter().all(|&x| x == 0), "body past body_len");
    assert_eq!(BufferDescriptor::decode(&b).as_ref(), Ok(t.buffer()));
}

#[test]
fn tensor_offsets() {
    let t = sample_tensor();
    let b = t.encode();
    assert_eq!(&b[0..88], &t.buffer().encode(), "buffer @0");
    assert_eq!(le(&b, 88, 8), 64, "byte_offset @88");
    assert_eq!(le(&b, 96, 4), 3, "ndims @96");
    for (i, v) in [3, 4, 5, 0, 0].into_iter().enumerate() {
        assert_eq!(le(&b, 100 + 4 * i, 4), v, "shapes[{i}] @{}", 100 + 4 * i);
    }
    for (i, v) in [40, 10, 2, 0, 0].into_iter().enumerate() {
        assert_eq!(le(&b, 120 + 4 * i, 4), v, "strides[{i}] @{}", 120 + 4 * i);
    }
    assert_eq!(le(&b, 140, 1), 0, "dtype @140 (F32)");
    assert_eq!(le(&b, 141, 3), 0, "pad @141");
    assert_eq!(Tensor::decode(&b), Ok(t));
}

#[test]
fn task_args_layout() {
    let t = sample_tensor();
    let args = TaskArgs::new(vec![t, t], vec![0x0102_0304_0506_0708, 9, 10]).unwrap();
    let b = args.encode();
    assert_eq!(b.len(), 8 + 2 * 144 + 3 * 8);
    assert_eq!(le(&b, 0, 4), 2, "T @0");
    assert_eq!(le(&b, 4, 4), 3, "S @4");
    assert_eq!(&b[8..152], &t.encode(), "tensor 0 @8");
    assert_eq!(&b[152..296], &t.encode(), "tensor 1 @152");
    assert_eq!(le(&b, 296, 8), 0x0102_0304_0506_0708, "scalar 0 @296");
    assert_eq!(le(&b, 304, 8), 9);
    assert_eq!(le(&b, 312, 8), 10);
    assert_eq!(TaskArgs::decode(&b), Ok(args));
    let empty = TaskArgs::new(vec![], vec![]).unwrap();
    assert_eq!(empty.encode(), vec![0; 8]);
    assert_eq!(TaskArgs::decode(&[0; 8]), Ok(empty));
}

#[test]
fn chip_tensor_materializes_views_in_bounds_only() {
    let t = sample_tensor();
    let c = ChipTensor::from_view(&t, 0x7000_0000, 1 << 20, AddressSpace::Host).unwrap();
    assert_eq!(c.addr(), 0x7000_0000);
    assert_eq!(c.size(), 1 << 20);
    assert_eq!(c.start_offset(), 16, "byte offset 64 is F32 element 16");
    assert_eq!(c.shape(), &[3, 4, 5]);
    assert_eq!(c.strides(), &[40, 10, 2]);
    assert_eq!(c.dtype(), DType::F32);
    assert!(!c.is_contiguous());
    // A backing shorter than the view is refused, naming it.
    let short =
        ChipTensor::from_view(&t, 0x7000_0000, t.end_byte() - 1, AddressSpace::Host).unwrap_err();
    assert_eq!(short.field(), Some("backing"));
    let wraps = ChipTensor::from_view(&t, u64::MAX - 8, 1 << 20, AddressSpace::Host).unwrap_err();
    assert_eq!(wraps.field(), Some("addr"));
    let contiguous = Tensor::row_major(*t.buffer(), 0, &[4, 8], DType::F16).unwrap();
    let c = ChipTensor::from_view(&contiguous, 0, 1 << 20, AddressSpace::Device).unwrap();
    assert!(c.is_contiguous());
    assert_eq!(c.address_space(), AddressSpace::Device);
    // A staged copy holds exactly the view's extent, element 0 first.
    let s = ChipTensor::staged(&t, 0x4000, AddressSpace::Device).unwrap();
    assert_eq!(
        (s.addr(), s.size(), s.start_offset()),
        (0x4000, t.extent_bytes(), 0)
    );
    assert_eq!(s.strides(), t.strides());
    assert_eq!(
        ChipTensor::staged(&t, u64::MAX - 4, AddressSpace::Device)
            .unwrap_err()
            .field(),
        Some("addr")
    );
}

#[test]
fn every_backing_round_trips() {
    use std::num::NonZeroU64;
    let id = CanonicalIdentity::new([3; 8], 77, 1).unwrap();
    let addr = NonZeroU64::new(0xdead_beef).unwrap();
    let cases = [
        (
            Backing::ForkShm { addr },
            AddressSpace::Host,
            Access::ReadWrite,
        ),
        (
            Backing::PosixShm {
                name: strata_wire::ShmName::new("strata.buf-1").unwrap(),
            },
            AddressSpace::Host,
            Access::Write,
        ),
        (
            Backing::VmmWindow { addr },
            AddressSpace::Device,
            Access::ReadWrite,
        ),
        (Backing::RemoteSidecar, AddressSpace::Host, Access::Read),
        (Backing::RemoteSidecar, AddressSpace::Device, Access::Read),
        (
            Backing::DeviceMalloc { addr },
            AddressSpace::Device,
            Access::ReadWrite,
        ),
        (Backing::ForkCow { addr }, AddressSpace::Host, Access::Read),
        (
            Backing::Memfd {
                st_dev: 1,
                st_ino: 2,
            },
            AddressSpace::Host,
            Access::ReadWrite,
        ),
    ];
    for (backing, space, access) in cases {
        let d = BufferDescriptor::new(id, 4096, space, access, backing).unwrap();
        assert_eq!(BufferDescriptor::decode(&d.encode()), Ok(d), "{backing:?}");
        assert_eq!(d.encode()[4], backing.kind().code());
    }
}
