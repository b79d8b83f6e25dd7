//! `strata-proto`: the gRPC service between an orchestrator and a worker
//! (`strata/worker/v1/worker.proto`, compiled by protox in `build.rs`, no
//! system `protoc`), and the one place where its messages become domain
//! types.
//!
//! Prost types never travel past this crate's [`convert`] functions: every
//! `TryFrom<pb::X>` checks every field (lengths, codes, counts, the TaskArgs
//! blob through `strata-wire`'s validator) and names the field it refuses.
//!
//! ```
//! use strata_proto::{convert::TaskRequest, pb, TaskId};
//! use strata_wire::{check::test_buffer, ArgTag, DType, TaskArgs, Tensor};
//!
//! let t = Tensor::row_major(test_buffer(64), 0, &[16], DType::F32).unwrap();
//! let req = TaskRequest {
//!     id: TaskId(7),
//!     callable: strata_wire::KernelHandle([1; 16]),
//!     args: TaskArgs::new(vec![t], vec![]).unwrap(),
//!     tags: vec![ArgTag::Output],
//!     inline: vec![None],
//!     staged: vec![],
//!     cache: vec![],
//!     required_features: strata_proto::convert::Features::NONE,
//!     priority: 0,
//! };
//! let wire: pb::Task = (&req).into();
//! assert_eq!(TaskRequest::try_from(wire).unwrap(), req);
//!
//! let bad = pb::Task { tags: vec![9], ..(&req).into() };
//! assert_eq!(TaskRequest::try_from(bad).unwrap_err().field, "tags[0]");
//! ```

#![forbid(unsafe_code)]

pub mod bulk;
pub mod check;
mod codec;
pub mod convert;
pub mod fdframe;
pub mod recycle;

/// The generated messages and service stubs.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("strata.worker.v1");
}

pub use convert::ConvertError;
pub use strata_wire::TaskId;

/// The protocol version this build speaks; a handshake with any other is
/// refused. Version 2: the handshake states what the worker's tasks may
/// use (backend kinds, dtypes, features) and the features a driver must
/// know, and a task the features it needs; the handshake's `ring` flag is
/// the RING feature.
pub const PROTOCOL_VERSION: u32 = 2;

/// Metadata key carrying the session id on every call after the handshake.
pub const SESSION_HEADER: &str = "strata-session";

/// Default largest gRPC message, both directions (64 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Largest fd side-channel frame (identities and descriptors of one import
/// message).
pub const MAX_FD_FRAME_BYTES: usize = 64 * 1024;

/// Most fds one side-channel message may carry.
pub const MAX_FDS_PER_MESSAGE: usize = 64;

/// Most buffer identities and views one `Flush` may name, together.
pub const MAX_FLUSH_IDENTITIES: usize = 4096;

/// HTTP/2 flow-control window of one stream, bytes, on both ends: staged
/// view bytes are megabytes, and the 64 KiB default window stalls them on
/// every round trip. As large as the largest message, so that one task's
/// bytes never wait for a window update mid-message.
pub const STREAM_WINDOW: u32 = 64 << 20;

/// HTTP/2 flow-control window of a connection, bytes, on both ends.
pub const CONNECTION_WINDOW: u32 = 128 << 20;

/// Largest extent of a view whose bytes travel with a task (and largest
/// span of the inline views of one buffer in one task): the worker makes a
/// private copy of it.
pub const MAX_INLINE_EXTENT: u64 = 256 << 20;

/// Bytes per chunk of a view staged ahead of its task (`Stage`) or
/// fetched after it (`Fetch`).
pub const STAGE_CHUNK_BYTES: usize = 4 << 20;
