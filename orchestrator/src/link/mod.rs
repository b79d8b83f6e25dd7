//! The worker link: one trait for everything the orchestrator asks of a
//! worker, whatever carries it.
//!
//! A [`Dialer`] opens a [`WorkerLink`] — one session on one worker — and
//! hands the link's [`LinkEvent`]s (completions, the end of the session,
//! a health deadline that passed) to the endpoint actor's channel. The
//! actor drives everything else through the link: task batches, buffer
//! imports by fd, control calls, session state. Two kinds exist:
//! - [`grpc`]: a worker process over gRPC, with its fd side channel when it
//!   listens on a Unix socket (the link passes host buffers by fd, and
//!   tasks and completions travel on a shared-memory ring, [`ring`], when
//!   the worker offers one) or the bytes of every view staged with the
//!   task over TCP;
//! - [`inproc`]: a worker node inside this process
//!   ([`strata_worker_node::InProcessWorker`]), reached by calls.
//!
//! The endpoint actor (`actors::endpoint`) knows no transport; tests run it
//! over in-process links without spawning a process.

pub(crate) mod grpc;
pub(crate) mod inproc;
pub(crate) mod ring;

use std::fmt;
use std::future::Future;
use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::sync::Arc;

use strata_chip_runtime::Region;
use strata_client::SessionId;
use strata_orchestrator_core::WorkerId;
use strata_proto::convert::{BackendKinds, Capabilities, Features, WorkerFacts};
use strata_proto::convert::{RunEnd, SessionState, TaskCompletion, TaskRequest, WorkerStats};
use strata_wire::{BackendKind, BufferDescriptor, CanonicalIdentity};
use tokio::sync::mpsc;

/// A boxed future, as the link's methods return them (object safety).
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How host buffers reach a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Memory {
    /// It maps them by fd: tasks read and write the driver's bytes.
    Shared,
    /// Each task carries the bytes of the views it reads, and its
    /// completion the bytes of the views it writes.
    Staged,
}

/// What a worker told when the link opened.
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    /// The session the link holds.
    pub(crate) session: SessionId,
    /// What the worker is (chip, device, callables, process), as its
    /// handshake said.
    pub(crate) worker: WorkerFacts,
    /// The largest message both sides accept (bytes staged with a batch
    /// of tasks stay under it).
    pub(crate) max_message: usize,
    pub(crate) memory: Memory,
    /// The worker's process, when the link can see it (`SO_PEERCRED` on a
    /// Unix socket); never this process.
    pub(crate) pid: Option<u32>,
    /// What carries the session's tasks.
    pub(crate) transport: Transport,
    /// Views of at least this many bytes travel on the worker's data
    /// connection (staged ahead of their task, fetched after it) rather
    /// than in messages; `None`: the link has none.
    pub(crate) data_from: Option<u64>,
}

impl Facts {
    /// What tasks placed on the worker may use through this link: what
    /// its handshake said, with the kinds of buffer this link can bring it.
    /// A link that shares memory passes host buffers by fd, so the worker
    /// takes them when it imports their kind, MEMFD or POSIX_SHM (its own
    /// statement); a staged link sends their bytes with each task, so it
    /// takes them when the worker takes HOST bytes
    /// ([`Features::HOST_BYTES`]), whatever it imports. Every host buffer
    /// this driver makes is a MEMFD, or a POSIX_SHM it opened by name.
    pub(crate) fn capabilities(&self) -> Capabilities {
        let said = self.worker.capabilities;
        let host = BackendKinds::NONE
            .with(BackendKind::Memfd)
            .with(BackendKind::PosixShm);
        let backends = match self.memory {
            Memory::Staged if said.features.contains(Features::HOST_BYTES) => {
                said.backends.union(host)
            }
            // No fd reaches it: it imports nothing by fd, whatever it says.
            Memory::Staged => said.backends.difference(host),
            Memory::Shared => said.backends,
        };
        Capabilities { backends, ..said }
    }
}

/// A host buffer's memfd as a link sees it: the file a data connection
/// sends from and lands in. A trait, not the buffer itself, so that `link`
/// (below `buffer` and `error`) imports neither.
pub(crate) trait HostFile: Send + Sync + std::fmt::Debug {
    /// The memfd.
    fn fd(&self) -> std::os::fd::BorrowedFd<'_>;
    /// `len` bytes from `offset`, copied out.
    ///
    /// # Errors
    /// The range is outside the buffer, or the read failed.
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, String>;
}

/// The bytes of one view staged ahead of its task ([`WorkerLink::stage`]).
#[derive(Debug)]
pub(crate) enum StageBody {
    /// Packed already (a strided view, or one too large for its message).
    Packed(bytes::Bytes),
    /// A contiguous view: `len` bytes of the buffer's memfd from `offset`,
    /// which a data connection sends from the file without packing them.
    File {
        /// The buffer.
        host: std::sync::Arc<dyn HostFile>,
        /// Where the view's bytes start.
        offset: u64,
        /// How many.
        len: u64,
    },
}

/// A contiguous written view's place in its buffer's memfd: where a data
/// connection lands fetched bytes directly ([`WorkerLink::fetch`]).
#[derive(Debug)]
pub(crate) struct FileRange {
    /// The buffer.
    pub(crate) host: std::sync::Arc<dyn HostFile>,
    /// Where the view's bytes start.
    pub(crate) offset: u64,
    /// How many.
    pub(crate) len: u64,
}

impl StageBody {
    /// Its length in bytes.
    pub(crate) fn len(&self) -> u64 {
        match self {
            StageBody::Packed(b) => b.len() as u64,
            StageBody::File { len, .. } => *len,
        }
    }
}

/// What carries a worker's tasks and completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// Calls into a worker node inside the driver's process.
    InProcess,
    /// A shared-memory ring beside a gRPC control plane over a Unix socket.
    Ring,
    /// The gRPC task stream over a Unix socket (the worker offers no ring,
    /// or the cluster was built without).
    GrpcUnix,
    /// The gRPC task stream over TCP, view bytes staged.
    GrpcTcp,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::InProcess => "in-process",
            Transport::Ring => "ring",
            Transport::GrpcUnix => "grpc-unix",
            Transport::GrpcTcp => "grpc-tcp",
        })
    }
}

/// What a link reports by itself, on the actor's event channel.
#[derive(Debug)]
pub(crate) enum LinkEvent {
    /// Members finished.
    Completions(Vec<TaskCompletion>),
    /// The worker ended the session, or the connection broke (why).
    Closed(Option<LinkError>),
    /// No sign of life within the health deadline, or the worker halted.
    Unhealthy(String),
}

/// Why a call on a link failed: what a program can match on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// The worker could not be reached, or the connection broke.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The worker was lost while the call waited (or before it was made).
    #[error("lost ({0})")]
    Lost(String),
    /// The worker refused the call.
    #[error("{0}")]
    Refused(Refusal),
    /// No answer in time.
    #[error("timed out: {0}")]
    TimedOut(String),
    /// The worker refused our credentials.
    #[error("authentication: {0}")]
    Auth(String),
    /// Anything else the worker reported (a bug on one side).
    #[error("internal: {0}")]
    Internal(String),
}

/// Why a worker refused a call, with its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// An argument it cannot accept (range, size, a malformed field).
    #[error("{0}")]
    Invalid(String),
    /// What the call names does not exist (a device buffer not allocated,
    /// an unknown session).
    #[error("{0}")]
    NotFound(String),
    /// It already exists (a device buffer allocated twice).
    #[error("{0}")]
    AlreadyExists(String),
    /// Not now (a run buffer whose run ended, a session that ended).
    #[error("{0}")]
    Precondition(String),
    /// Out of device memory or another resource.
    #[error("{0}")]
    Exhausted(String),
}

/// One session on one worker.
pub(crate) trait WorkerLink: Send + Sync + fmt::Debug + 'static {
    /// What the worker told when the link opened.
    fn facts(&self) -> &Facts;

    /// Sends members to run; each completes as a [`LinkEvent::Completions`].
    fn send(&self, tasks: Vec<TaskRequest>) -> BoxFuture<'_, Result<(), LinkError>>;

    /// Passes host buffers by fd (links with [`Memory::Shared`]), each as
    /// its descriptor: one result per buffer (a refusal says why).
    fn import<'a>(
        &'a self,
        buffers: &'a [(BufferDescriptor, BorrowedFd<'a>)],
    ) -> BoxFuture<'a, Result<Vec<Result<(), String>>, LinkError>>;

    /// Lets go of imported buffers.
    fn release_imports(&self, ids: Vec<CanonicalIdentity>) -> BoxFuture<'_, Result<(), LinkError>>;

    /// Allocates a device buffer; returns its device address.
    fn device_alloc(
        &self,
        identity: CanonicalIdentity,
        nbytes: u64,
        region: Region,
    ) -> BoxFuture<'_, Result<u64, LinkError>>;

    /// Frees a device buffer.
    fn device_free(&self, identity: CanonicalIdentity) -> BoxFuture<'_, Result<(), LinkError>>;

    /// A new fd of the session's shared device buffer `identity`, which
    /// this process maps ([`strata_chip_runtime::shared`]): only from a
    /// worker in this process or on this host's Unix socket.
    fn export(
        &self,
        identity: CanonicalIdentity,
    ) -> BoxFuture<'_, Result<strata_chip_runtime::shared::SharedMemory, LinkError>>;

    /// Maps another worker's shared device buffer `identity` (`memory`,
    /// its export) into this worker's chip for this session's tasks, as a
    /// device buffer of this worker until freed ([`WorkerLink::device_free`]):
    /// only for a worker in this process or on this host's Unix socket.
    fn import_shared(
        &self,
        identity: CanonicalIdentity,
        memory: strata_chip_runtime::shared::SharedMemory,
    ) -> BoxFuture<'_, Result<(), LinkError>>;

    /// Ends the session's run (its run buffers retire).
    fn end_run(&self) -> BoxFuture<'_, Result<RunEnd, LinkError>>;

    /// Has the worker write its dirty cached copies of the byte sets of
    /// `views` (at most [`strata_wire::MAX_TENSORS`]; every copy when
    /// empty) back to host memory; the bytes written.
    fn flush(&self, views: Vec<strata_wire::Tensor>) -> BoxFuture<'_, Result<u64, LinkError>>;

    /// Writes bytes into a device buffer.
    fn copy_to_device(
        &self,
        identity: CanonicalIdentity,
        offset: u64,
        data: Vec<u8>,
    ) -> BoxFuture<'_, Result<(), LinkError>>;

    /// Reads bytes of a device buffer.
    fn copy_from_device(
        &self,
        identity: CanonicalIdentity,
        offset: u64,
        len: u64,
    ) -> BoxFuture<'_, Result<Vec<u8>, LinkError>>;

    /// Sends the packed bytes of one view ahead of the task that names
    /// them (`id`, [`TaskRequest::staged`]): a view too large for the
    /// task's message ([`Memory::Staged`] links).
    fn stage(&self, id: u64, body: StageBody) -> BoxFuture<'_, Result<(), LinkError>>;

    /// Fetches the packed bytes of a written view the worker held for us
    /// (`id`, [`TaskCompletion::held`]), at most `expect` bytes, once.
    /// With `land`, a link with a data connection writes them into that
    /// range of the buffer's memfd as they arrive and returns `None`
    /// (exactly `land.len` bytes, or an error); others return the bytes.
    fn fetch(
        &self,
        id: u64,
        expect: u64,
        land: Option<FileRange>,
    ) -> BoxFuture<'_, Result<Option<bytes::Bytes>, LinkError>>;

    /// The worker's figures.
    fn stats(&self) -> BoxFuture<'_, Result<WorkerStats, LinkError>>;

    /// What the worker knows of `session` (a session this client lost).
    fn session_state(&self, session: SessionId) -> BoxFuture<'_, Result<SessionState, LinkError>>;

    /// Ends the session: the worker releases its imports and device
    /// buffers; its queued tasks never start. Idempotent.
    fn close(&self);
}

/// Opens links to one worker.
pub(crate) trait Dialer: Send + Sync + fmt::Debug + 'static {
    /// Opens a session, naming `previous`, a session this client lost on
    /// the worker (which the worker then ends at once), and reports the
    /// link's events on `events`.
    fn dial(
        &self,
        previous: Option<SessionId>,
        events: mpsc::UnboundedSender<LinkEvent>,
    ) -> BoxFuture<'_, Result<Arc<dyn WorkerLink>, LinkError>>;

    /// Where the worker is, for messages (`unix:/…`, `tcp:…`, `in-process:0`).
    fn address(&self) -> String;
}

/// A worker of the cluster, as its handshake described it.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    /// Its id in this cluster.
    pub id: WorkerId,
    /// Where it is reached.
    pub endpoint: String,
    /// Its chip id.
    pub chip: u32,
    /// Its canonical device spec.
    pub device: String,
    /// Device memory, bytes.
    pub memory: u64,
    /// Kernel lanes.
    pub lanes: u32,
    /// Whether buffers reach it by fd (Unix socket) rather than staged bytes.
    pub fd_passing: bool,
    /// Whether large view bytes reach it on its data connection (a TCP
    /// worker that offers one, to a cluster that uses it) rather than in
    /// gRPC messages.
    pub data_connection: bool,
    /// What carries its tasks and completions.
    pub transport: Transport,
    /// Its process id, when this cluster spawned it (the first one: a
    /// respawned worker's is [`Cluster::worker_pid`](crate::Cluster::worker_pid)).
    pub pid: Option<u32>,
    /// `name@version` of every callable it offers.
    pub callables: Vec<String>,
    /// `name@version` of every kernel registered on it that its chip has
    /// no body for (a CUDA chip runs only kernels with a CUDA body): not
    /// offered, and named when a task asks for one.
    pub no_body: Vec<String>,
    /// What tasks placed on it may use, through this cluster's link (its
    /// handshake's statement; host buffers reach a worker over TCP as
    /// bytes, so it takes MEMFD buffers when it takes HOST bytes):
    /// placement and the refusals at submit go by these.
    pub capabilities: Capabilities,
    /// The id of its path (`endpoint`) in the descriptors of buffers it
    /// owns (`owner_worker_path_id`, shown as `<path#N>`): a diagnostic,
    /// the same for every worker of this cluster at one path.
    pub path_id: u32,
}

impl WorkerInfo {
    /// Worker `id`, reached at `endpoint` (path id `path_id`), as `link`
    /// describes it; `pid` when the cluster spawned it.
    pub(crate) fn of(
        id: WorkerId,
        endpoint: &str,
        path_id: u32,
        link: &dyn WorkerLink,
        pid: Option<u32>,
    ) -> Self {
        let f = link.facts();
        WorkerInfo {
            id,
            endpoint: endpoint.to_owned(),
            chip: f.worker.chip_id,
            device: f.worker.device_spec.clone(),
            memory: f.worker.device_memory,
            lanes: f.worker.lanes,
            fd_passing: f.memory == Memory::Shared,
            data_connection: f.data_from.is_some(),
            transport: f.transport,
            pid,
            callables: f
                .worker
                .callables
                .iter()
                .map(|c| c.signature.qualified_name())
                .collect(),
            no_body: f.worker.no_body.clone(),
            capabilities: f.capabilities(),
            path_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use strata_proto::convert::{DTypeSet, InstanceId};

    use super::*;

    fn facts(memory: Memory, said: Capabilities) -> Facts {
        Facts {
            session: SessionId(1),
            worker: WorkerFacts {
                chip_id: 0,
                device_kind: "sim".into(),
                device_spec: "sim".into(),
                device_memory: 1 << 20,
                lanes: 1,
                callables: Vec::new(),
                no_body: Vec::new(),
                capabilities: said,
                required_features: Features::NONE,
                instance: InstanceId(1),
            },
            max_message: 1 << 20,
            memory,
            pid: None,
            transport: Transport::GrpcTcp,
            data_from: None,
        }
    }

    /// Host buffers reach a worker by fd when it imports their kind (MEMFD,
    /// POSIX_SHM), or as bytes over a staged link when it takes HOST bytes;
    /// a staged link brings no fd whatever the worker says. Dtypes and
    /// features pass as said.
    #[test]
    fn a_link_takes_host_buffers_the_way_it_can_bring_them() {
        let device = BackendKinds::NONE.with(BackendKind::DeviceMalloc);
        let both = device.with(BackendKind::Memfd).with(BackendKind::PosixShm);
        let memfd_only = device.with(BackendKind::Memfd);
        let said = |backends, features| Capabilities {
            backends,
            dtypes: DTypeSet::ALL,
            features,
        };
        let cases = [
            (Memory::Shared, both, Features::HOST_BYTES, both),
            (Memory::Shared, device, Features::HOST_BYTES, device),
            (Memory::Staged, device, Features::HOST_BYTES, both),
            (Memory::Staged, device, Features::NONE, device),
            (Memory::Staged, both, Features::NONE, device),
            (Memory::Shared, memfd_only, Features::HOST_BYTES, memfd_only),
            (Memory::Staged, memfd_only, Features::HOST_BYTES, both),
        ];
        for (memory, backends, features, want) in cases {
            let got = facts(memory, said(backends, features)).capabilities();
            assert_eq!(got.backends, want, "{memory:?} {backends} {features}");
            assert_eq!((got.dtypes, got.features), (DTypeSet::ALL, features));
        }
    }
}
