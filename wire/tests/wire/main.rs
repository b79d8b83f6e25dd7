//! Integration tests of `strata-wire`, one binary: layout pins, validation
//! rules, padding as alignment slack, hostile input, the overlap engine against its oracle, and the
//! committed fuzz corpus.

mod corpus;
mod hostile;
mod layout;
mod overlap;
mod padding;
mod validation;

use strata_wire::{
    Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
};

/// A MEMFD host buffer of `nbytes` with identity `(owner, id, 1)`.
pub(crate) fn memfd_buffer(id: u64, nbytes: u64) -> BufferDescriptor {
    let identity = CanonicalIdentity::new(*b"testownr", id, 1).unwrap();
    BufferDescriptor::new(
        identity,
        nbytes,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: 0x10,
            st_ino: 0x20,
        },
    )
    .unwrap()
}

/// A valid tensor whose every field is distinctive, for layout and hostile
/// tests.
pub(crate) fn sample_tensor() -> Tensor {
    let identity =
        CanonicalIdentity::new([1, 2, 3, 4, 5, 6, 7, 8], 0x1122_3344_5566_7788, 9).unwrap();
    let buf = BufferDescriptor::new(
        identity,
        1 << 20,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: 0xaaaa,
            st_ino: 0xbbbb,
        },
    )
    .unwrap()
    .with_owner_worker_path_id(0x0c0c);
    Tensor::new(buf, 64, &[3, 4, 5], &[40, 10, 2], DType::F32).unwrap()
}
