//! The vocabulary every layer of strata uses for what crosses between a
//! driver and its workers, so that no layer turns it into text and back.
//!
//! - **What a callable is**: [`Signature`], its name, version and how it
//!   uses its arguments, which round-trips with the canonical string the
//!   workers report and whose digest is its handle. Its parser is the only
//!   one: the chip runtime's kernels, the graph format, the Python package
//!   and its kernel decorator all use it.
//! - **What a worker is**: [`WorkerFacts`], its chip, device, callables,
//!   capabilities and process, one record whether a handshake or an
//!   in-process worker reports it.
//! - **What a worker can take and a task needs**: [`Capabilities`]: the
//!   kinds of buffer ([`BackendKinds`]), the dtypes ([`DTypeSet`]) and the
//!   named protocol [`Features`], one type for both sides, so that
//!   placement and the refusals at submit test one thing.
//! - **Who is talking**: [`SessionId`] (one driver's connection to a
//!   worker) and [`InstanceId`] (one worker process), which both sides
//!   name.
//! - **Whose workers these are**: [`DRIVER_MARKER`], the file a driver
//!   leaves in the folder of the workers it starts.
//! - **Why a task failed**: [`FailureCause`], a [`FailureKind`] a program
//!   can match on beside the words a person reads. A worker sends the kind
//!   in its completion; the orchestrator's core carries it in its
//!   outcomes; the driver's errors, `RunSummary`, the graph runner and
//!   Python's `TaskFailed.kind` show it. Only the message is text.
//!
//! The crate is pure (no IO; it depends only on `strata-wire` and a
//! digest), so that the IO-free cores may use it as well as the processes.

mod caps;
mod facts;
mod failure;
mod ids;
pub mod signature;

pub use caps::{BackendKinds, Capabilities, DTypeSet, Features};
pub use facts::WorkerFacts;
pub use failure::{FailureCause, FailureKind};
pub use ids::{InstanceId, SessionId};
pub use signature::{
    ArgSpec, CallableOffer, DTypes, Rank, ScalarKind, ScalarSpec, Signature, SignatureError,
};

/// The file a driver puts in the private folder of the workers it spawns
/// (their sockets and logs), naming itself as `pid=<pid> start=<start
/// time>`: the last worker out removes it with the folder (see `strata
/// worker --driver-dir`), and a later driver recognises by it a folder that
/// a dead one left behind.
pub const DRIVER_MARKER: &str = "strata-driver";
