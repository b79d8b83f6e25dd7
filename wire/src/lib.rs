//! strata's wire format: the bytes that cross every process boundary, and
//! the overlap test that dependency inference is built on
//! (docs/wire-format.md; docs/scheduling.md#the-overlap-engine).
//!
//! - [`CanonicalIdentity`] (32 B) names one incarnation of one buffer;
//!   [`IdentityMint`] hands out fresh ones.
//! - [`BufferDescriptor`] (88 B) says what a buffer is: identity, size, grant
//!   ([`Access`]), [`AddressSpace`] and backing ([`Backing`], whose
//!   [`BackendKind`] includes strata's own MEMFD).
//! - [`Tensor`] (144 B) is a typed ([`DType`]), strided view over a buffer:
//!   the argument of a task. [`TaskArgs`] is a task's argument blob,
//!   `[i32 T][i32 S][Tensor × T][u64 × S]`.
//! - [`ChipTensor`] (128 B, worker-local) is a tensor after materialization.
//! - [`overlap`] / [`Footprint`] decide whether two views share a byte.
//!
//! Every decode runs one validator per structure and is total: hostile bytes
//! give an [`Error`] naming the field and value, never a panic, and no count
//! read from the input sizes an allocation before it is checked.
//!
//! ```
//! use strata_wire::{Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, TaskArgs, Tensor};
//!
//! let id = CanonicalIdentity::new(*b"orch0001", 7, 1)?;
//! let buf = BufferDescriptor::new(id, 1024, AddressSpace::Host, Access::ReadWrite, Backing::Memfd { st_dev: 5, st_ino: 99 })?;
//! let x = Tensor::row_major(buf, 0, &[16, 16], DType::F32)?;
//! let args = TaskArgs::new(vec![x], vec![42])?;
//! let bytes = args.encode();
//! assert_eq!(bytes.len(), 8 + 144 + 8);
//! assert_eq!(TaskArgs::decode(&bytes)?, args);
//!
//! // A hostile count is refused before anything is allocated for it.
//! let mut bad = bytes.clone();
//! bad[..4].copy_from_slice(&(-1i32).to_le_bytes());
//! let err = TaskArgs::decode(&bad).unwrap_err();
//! assert_eq!(err.field(), Some("tensor_count"));
//! # Ok::<(), strata_wire::Error>(())
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod backing;
mod chip_tensor;
mod codec;
mod descriptor;
mod device;
mod dtype;
mod error;
mod identity;
mod mint;
mod overlap;
mod sync;
mod tag;
mod task_args;
mod tensor;

pub mod check;
pub mod geometry;

pub use backing::{BackendKind, Backing, MAX_BODY_LEN, ShmName};
pub use chip_tensor::ChipTensor;
pub use descriptor::{
    Access, AddressSpace, BufferDescriptor, DESCRIPTOR_MAGIC, DESCRIPTOR_SIZE, OwnerPath,
};
pub use device::{KernelHandle, Region, RegionStats, TaskId};
pub use dtype::DType;
pub use error::{Error, FieldValue};
pub use identity::{CanonicalIdentity, IDENTITY_SIZE};
pub use mint::IdentityMint;
pub use overlap::{Footprint, Overlap, overlap};
pub use tag::ArgTag;
pub use task_args::{HEADER_SIZE, MAX_SCALARS, MAX_TENSORS, TaskArgs, header_counts};
pub use tensor::{MAX_DIMS, TENSOR_SIZE, Tensor};

/// Decoded contents of a file or message that holds either a TaskArgs blob
/// or a single tensor record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A TaskArgs blob.
    TaskArgs(TaskArgs),
    /// One 144-byte tensor record.
    Tensor(Tensor),
}

/// Decodes `bytes` as a single tensor when it is exactly 144 bytes long and
/// not a valid blob, otherwise as a TaskArgs blob.
///
/// A 144-byte input can only be a blob if its header counts say so (one
/// 144-byte tensor never fits with a header), so the two readings never
/// compete for valid inputs: a blob needs `8 + 144·T + 8·S` bytes, and
/// 144 = 8 + 8·17 is a blob of 17 scalars only.
///
/// # Errors
/// The error of the reading the length selects: the tensor validator's for
/// 144-byte inputs whose header is not that of a 17-scalar blob, the blob
/// validator's otherwise.
pub fn decode_any(bytes: &[u8]) -> Result<Decoded, Error> {
    if bytes.len() == TENSOR_SIZE && header_counts(bytes) != Ok((0, 17)) {
        return Tensor::decode(bytes).map(Decoded::Tensor);
    }
    TaskArgs::decode(bytes).map(Decoded::TaskArgs)
}
