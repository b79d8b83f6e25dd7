//! The orchestrator's actors and the messages between them.
//!
//! ```text
//!   driver threads (Cluster API)
//!        │ Cmd (bounded) + oneshot replies
//!        ▼
//!   DAG/scheduler actor ──EpCmd::Dispatch (bounded)──▶ endpoint actor × N ──gRPC/fd──▶ worker
//!        ▲                                               │   ▲
//!        └─────────────── Notice (unbounded)──────────────┘   │ EpCmd::Release / DeviceFree (bounded)
//!                                                            │
//!   buffer handles / task records ──Released (unbounded)──▶ buffer manager
//! ```
//!
//! Downward channels (driver → DAG actor → endpoints, buffer manager →
//! endpoints) are bounded, so a fast driver cannot queue without limit;
//! upward channels (endpoints → DAG actor, dropped buffers → buffer
//! manager) are unbounded, so no bounded cycle exists and no actor ever
//! waits on one that waits on it. The in-flight window of each worker
//! bounds what the upward channel can hold.

pub(crate) mod buffers;
pub(crate) mod dag;
pub(crate) mod endpoint;
pub(crate) mod fence;

use strata_chip_runtime::KernelHandle;
use strata_orchestrator_core::{
    Event, FailureCause, FailureKind, Placement, ScopeId, Submission, TaskId,
};
use strata_proto::convert::WorkerStats;
use strata_wire::{ArgTag, CanonicalIdentity, Tensor};
use tokio::sync::oneshot;

use crate::buffer::{Backing, Buffer};
use crate::error::{Error, RunError};
use crate::link::LinkError;
use crate::summary::RunSummary;

/// One tensor argument with what keeps its memory alive.
#[derive(Debug, Clone)]
pub(crate) struct ArgRef {
    pub(crate) tensor: Tensor,
    pub(crate) tag: ArgTag,
    pub(crate) backing: Backing,
}

/// One member of a task, resolved by the driver.
#[derive(Debug)]
pub(crate) struct MemberSpec {
    pub(crate) callable: KernelHandle,
    /// `name@version`, shared with the cluster's table.
    pub(crate) name: std::sync::Arc<str>,
    /// What the performance models know of it.
    pub(crate) work: strata_orchestrator_core::sched::Work,
    /// Shared with the dispatches of this member (no copy per dispatch).
    pub(crate) args: std::sync::Arc<[ArgRef]>,
    pub(crate) scalars: std::sync::Arc<[u64]>,
    pub(crate) placement: Placement,
    pub(crate) device_buffers: Vec<CanonicalIdentity>,
    /// How long it may run once sent to its worker ([`crate::Task::timeout`]).
    pub(crate) timeout: Option<std::time::Duration>,
    /// Features it needs of its worker ([`crate::Task::require`]).
    pub(crate) required_features: strata_proto::convert::Features,
    /// What it needs of its worker: its arguments' kinds of buffer and
    /// dtypes, and `required_features`.
    pub(crate) needs: strata_proto::convert::Capabilities,
}

/// A task, resolved by the driver: what its dispatches carry and what
/// keeps its buffers alive (the engine's view of it is the
/// [`Submission`] beside it).
#[derive(Debug)]
pub(crate) struct TaskSpec {
    pub(crate) members: Vec<MemberSpec>,
}

/// Driver → DAG actor.
#[derive(Debug)]
pub(crate) enum Cmd {
    /// A task the driver built, checked and numbered, as the engine takes
    /// it; refusals here (which depend on the workers up, and the driver's
    /// checks make rare) become the task's failure.
    Submit {
        spec: TaskSpec,
        submission: Submission,
    },
    Wait {
        task: TaskId,
        reply: oneshot::Sender<Result<(), RunError>>,
    },
    WaitAll {
        reply: oneshot::Sender<Result<RunSummary, RunError>>,
    },
    Cancel {
        task: TaskId,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    OpenScope {
        reply: oneshot::Sender<ScopeId>,
    },
    /// `reply` `None`: the driver knows the scope open and needs no
    /// answer (a scope ended meanwhile refuses the buffer, which is then
    /// dropped: its handle is refused by the same end).
    ScopeBuffer {
        scope: ScopeId,
        buffer: Buffer,
        reply: Option<oneshot::Sender<Result<(), Error>>>,
    },
    /// `reply` `None`: the driver knows the scope open and needs no answer.
    EndScope {
        scope: ScopeId,
        reply: Option<oneshot::Sender<Result<(), Error>>>,
    },
    Totals {
        reply: oneshot::Sender<RunSummary>,
    },
    TakeTrace {
        reply: oneshot::Sender<Option<crate::trace::Trace>>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// What a worker reported about one member, beyond its result.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Report {
    /// Packed bytes sent with the task (remote workers).
    pub(crate) sent: u64,
    /// Packed bytes that came back and were written into host buffers.
    pub(crate) returned: u64,
    /// Bytes the worker staged between host and device memory.
    pub(crate) staged: u64,
    /// The worker's lane.
    pub(crate) lane: u32,
    /// Nanoseconds the member waited for a lane on the worker.
    pub(crate) queued_ns: u64,
    /// Nanoseconds staging and running on the worker.
    pub(crate) busy_ns: u64,
    /// Of those, staging in before the kernel and out after it.
    pub(crate) copy_in_ns: u64,
    pub(crate) copy_out_ns: u64,
    /// Bytes it copied host → device and device → host.
    pub(crate) to_device: u64,
    pub(crate) from_device: u64,
    /// What it did in its chip's cache.
    pub(crate) cache: strata_proto::convert::CacheCounters,
    /// View bytes left out because the chip held them (remote workers).
    pub(crate) held: u64,
    /// Times it was sent again for bytes the chip no longer held.
    pub(crate) resent: u32,
    /// When the endpoint had the completion (and had landed its bytes).
    pub(crate) received: Option<std::time::Instant>,
}

/// Why a member did not succeed, as its endpoint saw it: the cause of its
/// TASK_FAILURE.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MemberFailure {
    /// The worker ran it (or refused it) and reported a failure, or the
    /// driver failed it without sending it.
    #[error("{0}")]
    Reported(FailureCause),
    /// The worker refused to import the buffer of an argument.
    #[error("argument {arg}: the worker refused buffer {buffer}: {why}")]
    BufferRefused {
        arg: usize,
        buffer: CanonicalIdentity,
        why: String,
    },
    /// The bytes of an argument could not be staged.
    #[error("argument {arg}: staging: buffer: {source}")]
    Staging {
        arg: usize,
        source: crate::error::BufferError,
    },
    /// The wire refused the task's arguments.
    #[error("{0}")]
    Args(#[from] strata_wire::Error),
    /// The bytes of a view too large for the task's message could not be
    /// staged ahead of it (the task was not sent).
    #[error("argument {arg}: staging its {bytes} bytes ahead of the task: {why}")]
    StagedAhead { arg: u32, bytes: usize, why: String },
    /// The bytes of a written view the worker held for us could not be
    /// fetched: the task ran, its output did not land.
    #[error("argument {arg}: fetching the bytes it wrote: {why}")]
    Fetch { arg: u32, why: String },
    /// Its staged bytes do not fit one message to the worker.
    #[error(
        "the task's arguments take {bytes} bytes on the wire, more than the {room} a message to {worker} may hold: split the views, or use a worker on this host (buffers by fd)"
    )]
    TooLarge {
        bytes: usize,
        room: usize,
        worker: String,
    },
    /// Bytes the worker sent back could not be written into the buffer.
    #[error("argument {arg}: writing back: buffer: {source}")]
    WriteBack {
        arg: u32,
        source: crate::error::BufferError,
    },
    /// The worker sent nothing back for a view the task writes.
    #[error("argument {arg}: the worker sent no bytes for a view the task writes")]
    NothingBack { arg: u32 },
}

impl MemberFailure {
    /// What kind of failure it is: the worker's own, a refused import,
    /// a task the driver could not send ([`FailureKind::Refused`]), or
    /// outputs that did not land ([`FailureKind::Other`]).
    pub(crate) fn kind(&self) -> FailureKind {
        match self {
            MemberFailure::Reported(c) => c.kind,
            MemberFailure::BufferRefused { .. } => FailureKind::ImportRefused,
            MemberFailure::Staging { .. }
            | MemberFailure::Args(_)
            | MemberFailure::StagedAhead { .. }
            | MemberFailure::TooLarge { .. } => FailureKind::Refused,
            MemberFailure::Fetch { .. }
            | MemberFailure::WriteBack { .. }
            | MemberFailure::NothingBack { .. } => FailureKind::Other,
        }
    }

    /// As the engine's typed cause.
    pub(crate) fn into_cause(self) -> FailureCause {
        match self {
            MemberFailure::Reported(c) => c,
            other => FailureCause::new(other.kind(), other.to_string()),
        }
    }
}

/// Endpoints (and the cluster's start) → DAG actor: the engine's own
/// events, as they happened.
#[derive(Debug)]
// Completions are nearly every message: boxing their report would cost an
// allocation each to shrink the rare others.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Notice {
    /// A worker came up or back ([`Event::WorkerUp`]), was lost
    /// ([`Event::WorkerLost`]), or a loss of it was fenced
    /// ([`Event::Fenced`]).
    Event(Event),
    /// A member's completion ([`Event::Finished`]), with what the worker
    /// reported beside its result.
    Completed { event: Event, report: Report },
    /// Bytes of buffers passed to a worker by fd.
    Imported { bytes: u64 },
    /// The worker answered flush `token` ([`EpCmd::Flush`]): the bytes it
    /// wrote back, or `None` when it could not (lost).
    Flushed { token: u64, bytes: Option<u64> },
}

/// One member to run on a worker.
#[derive(Debug, Clone)]
pub(crate) struct DispatchItem {
    pub(crate) task: TaskId,
    pub(crate) member: usize,
    pub(crate) callable: KernelHandle,
    pub(crate) args: std::sync::Arc<[ArgRef]>,
    pub(crate) scalars: std::sync::Arc<[u64]>,
    /// How long it may run once sent ([`crate::Task::timeout`]).
    pub(crate) timeout: Option<std::time::Duration>,
    /// Features it needs of its worker, which the worker checks again.
    pub(crate) required_features: strata_proto::convert::Features,
    /// The task's upward rank when dispatched (ns; 0: not ranked): the
    /// worker's chip favours higher ones where it can.
    pub(crate) priority: u64,
    /// Its arguments' use of the worker's device cache.
    pub(crate) cache: Vec<strata_proto::convert::CacheArg>,
    /// Fail it without sending it, with this cause (bytes it uses were
    /// lost with a worker before they were written back).
    pub(crate) fail: Option<FailureCause>,
}

/// DAG actor, buffer manager and driver → one endpoint.
#[derive(Debug)]
pub(crate) enum EpCmd {
    /// Members to run, placed while the worker was in the incarnation
    /// that followed its `rejoins`-th return: an endpoint in another
    /// drops them (the engine failed them when the worker was lost).
    Dispatch {
        items: Vec<DispatchItem>,
        rejoins: u64,
    },
    /// Has the worker release its imports of these buffers. With
    /// `clean`, answers the ones this very session imported and the worker
    /// released (so no copy of them on its chip can be written back
    /// later); a lost worker answers none (the sender is dropped).
    Release {
        ids: Vec<CanonicalIdentity>,
        clean: Option<oneshot::Sender<Vec<CanonicalIdentity>>>,
    },
    /// Has the worker write its dirty cached copies of these byte sets
    /// back to host memory, then answers [`Notice::Flushed`] with `token`
    /// (always, lost or not).
    Flush {
        views: Vec<strata_wire::Tensor>,
        token: u64,
    },
    DeviceAlloc {
        identity: CanonicalIdentity,
        nbytes: u64,
        region: strata_chip_runtime::Region,
        reply: oneshot::Sender<Result<u64, LinkError>>,
    },
    /// A new fd of the session's shared device buffer `identity`.
    Export {
        identity: CanonicalIdentity,
        reply: oneshot::Sender<Result<strata_chip_runtime::shared::SharedMemory, LinkError>>,
    },
    /// Maps another worker's shared device buffer (its export) here.
    ImportShared {
        identity: CanonicalIdentity,
        memory: strata_chip_runtime::shared::SharedMemory,
        reply: oneshot::Sender<Result<(), LinkError>>,
    },
    /// Ends the session's run on the worker (its run buffers retire).
    EndRun {
        reply: oneshot::Sender<Result<strata_proto::convert::RunEnd, LinkError>>,
    },
    /// Frees a device block, or a shared block's mapping, the worker took
    /// in `incarnation`; nothing when it was lost since (what it held
    /// went with that session).
    DeviceFree {
        identity: CanonicalIdentity,
        incarnation: u64,
    },
    CopyToDevice {
        identity: CanonicalIdentity,
        offset: u64,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<(), LinkError>>,
    },
    CopyFromDevice {
        identity: CanonicalIdentity,
        offset: u64,
        len: u64,
        reply: oneshot::Sender<Result<Vec<u8>, LinkError>>,
    },
    Stats {
        reply: oneshot::Sender<Result<WorkerStats, LinkError>>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}
