//! A worker node inside the caller's process: the same node, sessions,
//! imports and task execution as a `strata worker` process, reached by
//! calls instead of gRPC (no socket, no encoding). What a notebook or a
//! test reaches for first, and the fair comparison with runtimes that run
//! tasks as threads.
//!
//! Host buffers are still imported by fd (the memfd is mapped again, by
//! identity, exactly as a worker process maps it), so the checks on them —
//! tmpfs, sealed against shrinking, narrow-only grants — are the same.
//!
//! [`InProcessWorker::halt`] stops it as a worker process that shut down
//! would stop (every session ends: their queued tasks never start,
//! running ones finish) and refuses new sessions until
//! [`InProcessWorker::resume`]: what tests of a lost worker and its
//! return use.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use strata_chip_runtime::{Device, Region, Registry};
use strata_proto::convert::{
    RunEnd, SessionState, TaskCompletion, TaskRequest, WorkerFacts, WorkerStats,
};
use strata_wire::{BufferDescriptor, CanonicalIdentity};
use strata_worker_core::SessionId;
use tokio::sync::{mpsc, watch};

use crate::intake::Intake;
use crate::node::{Limits, Node, Session};
use crate::ops::NodeError;

/// A worker node in this process.
#[derive(Debug, Clone)]
pub struct InProcessWorker {
    node: Arc<Node>,
    halted: Arc<watch::Sender<bool>>,
}

impl InProcessWorker {
    /// Starts chip `chip_id` with the chip `device_spec` names (`sim`,
    /// `sim:mem=2GiB,lanes=2`, `cuda:0`; see [`strata_chip_runtime::open`])
    /// and `kernels`.
    ///
    /// # Errors
    /// [`NodeError::Device`]: a bad device spec, or a chip that cannot be
    /// opened (a CUDA chip without its driver names the library).
    pub fn start(chip_id: u32, device_spec: &str, kernels: Registry) -> Result<Self, NodeError> {
        Ok(InProcessWorker::on_device(
            chip_id,
            strata_chip_runtime::open(device_spec)?,
            kernels,
        ))
    }

    /// Starts chip `chip_id` on a device the caller built: a chip of its
    /// own implementing [`Device`]. It offers the kernels of `kernels`
    /// its device [`runs`](Device::runs) and names the others in its
    /// facts ([`WorkerFacts::no_body`]).
    pub fn on_device(chip_id: u32, device: Arc<dyn Device>, kernels: Registry) -> Self {
        let node = Node::new(chip_id, device, kernels, Limits::default());
        InProcessWorker {
            node: Arc::new(node),
            halted: Arc::new(watch::channel(false).0),
        }
    }

    /// What it is and offers: what a handshake with it would report.
    pub fn facts(&self) -> WorkerFacts {
        self.node.facts()
    }

    /// Opens a session. `previous` names a session this client lost: it
    /// ends now (its queued tasks never start), and the new session
    /// reports what is left of it ([`InProcessSession::previous`]).
    ///
    /// # Errors
    /// [`NodeError::Halted`] while the worker is halted.
    pub fn open(&self, previous: Option<SessionId>) -> Result<InProcessSession, NodeError> {
        if *self.halted.borrow() {
            return Err(NodeError::Halted);
        }
        let previous = previous.map(|prev| {
            self.node
                .end_session(prev, "superseded by a new session of the same client");
            self.node.session_state(prev)
        });
        let id = self.node.open_session(self.node.capabilities);
        let session = self.node.session(id).ok_or(NodeError::SessionEnded(id))?;
        // The in-process session streams from the start: the grace period
        // for a stream that never opens does not apply.
        session
            .streaming
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let (tx, rx) = mpsc::unbounded_channel();
        let intake = Intake::new(Arc::clone(&self.node), Arc::clone(&session), Arc::new(tx));
        Ok(InProcessSession {
            node: Arc::clone(&self.node),
            id,
            session,
            intake,
            completions: Some(rx),
            previous,
        })
    }

    /// What this worker knows of session `id`.
    pub fn session_state(&self, id: SessionId) -> SessionState {
        self.node.session_state(id)
    }

    /// The worker's figures.
    pub fn stats(&self) -> WorkerStats {
        self.node.stats()
    }

    /// Stops serving, as a worker process shutting down would: every
    /// session ends (queued tasks never start; running ones finish), and
    /// new sessions are refused until [`InProcessWorker::resume`].
    pub fn halt(&self) {
        self.halted.send_replace(true);
        self.node.end_all_sessions();
    }

    /// Serves again after [`InProcessWorker::halt`] (the same node: the
    /// same instance, its tombstones kept).
    pub fn resume(&self) {
        self.halted.send_replace(false);
    }

    /// Whether it is halted, as a watch that changes when it halts or
    /// resumes.
    pub fn halted(&self) -> watch::Receiver<bool> {
        self.halted.subscribe()
    }
}

/// One session on an in-process worker; ends when dropped (its imports
/// and device buffers are released, its queued tasks never start).
#[derive(Debug)]
pub struct InProcessSession {
    node: Arc<Node>,
    id: SessionId,
    session: Arc<Session>,
    intake: Intake,
    completions: Option<mpsc::UnboundedReceiver<TaskCompletion>>,
    previous: Option<SessionState>,
}

impl InProcessSession {
    /// Its id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// What the worker knew of the previous session named at the open.
    pub fn previous(&self) -> Option<SessionState> {
        self.previous
    }

    /// The completions of its tasks, once (later calls get `None`).
    pub fn take_completions(&mut self) -> Option<mpsc::UnboundedReceiver<TaskCompletion>> {
        self.completions.take()
    }

    fn live(&self) -> Result<(), NodeError> {
        if self.node.has_session(self.id) {
            Ok(())
        } else {
            Err(NodeError::SessionEnded(self.id))
        }
    }

    /// Runs `tasks`, in order; each completes on the completion channel.
    /// Waits while the session's tasks in flight are at their limit.
    ///
    /// # Errors
    /// [`NodeError::SessionEnded`] when the session has ended (nothing of
    /// the batch is taken).
    ///
    /// # Cancel safety
    /// Not cancel safe: cancelled part-way, a prefix of the batch has been
    /// taken (and will complete) and the rest has not.
    pub async fn submit(&self, tasks: Vec<TaskRequest>) -> Result<(), NodeError> {
        self.live()?;
        for t in tasks {
            let id = t.id;
            self.intake.take(id, Ok(t)).await;
        }
        Ok(())
    }

    /// Imports host buffers by fd, each as its descriptor (which tasks may
    /// narrow but not widen): one result per buffer.
    ///
    /// # Errors
    /// [`NodeError::SessionEnded`] when the session has ended.
    pub fn import(
        &self,
        buffers: Vec<(BufferDescriptor, OwnedFd)>,
    ) -> Result<Vec<Result<(), String>>, NodeError> {
        self.live()?;
        Ok(buffers
            .into_iter()
            .map(|(d, fd)| self.node.import_one(self.id, *d.identity(), Some(d), fd))
            .collect())
    }

    /// Writes this session's dirty cached copies of `identities` and of
    /// the byte sets of `views` (everything when both are empty) back to
    /// host memory; returns the bytes written.
    ///
    /// # Errors
    /// [`NodeError::SessionEnded`].
    pub fn flush(
        &self,
        identities: &[CanonicalIdentity],
        views: &[strata_wire::Tensor],
    ) -> Result<u64, NodeError> {
        self.live()?;
        Ok(self.node.flush(self.id, identities, views))
    }

    /// Releases this session's imports; returns how many it held.
    pub fn release_imports(&self, identities: &[CanonicalIdentity]) -> u32 {
        self.node.release_imports(self.id, identities)
    }

    /// Allocates a device buffer; returns its device address.
    ///
    /// # Errors
    /// The node's refusal.
    pub fn device_alloc(
        &self,
        identity: CanonicalIdentity,
        nbytes: u64,
        region: Region,
    ) -> Result<u64, NodeError> {
        self.live()?;
        self.node
            .device_alloc(&self.session, identity, nbytes, region)
    }

    /// A new fd of the session's shared device buffer `identity`
    /// ([`Node::device_export`]).
    ///
    /// # Errors
    /// The node's refusal.
    pub fn device_export(
        &self,
        identity: &CanonicalIdentity,
    ) -> Result<strata_chip_runtime::shared::SharedMemory, NodeError> {
        self.live()?;
        self.node.device_export(&self.session, identity)
    }

    /// Maps another worker's shared device buffer `identity` (its export)
    /// for this session's tasks ([`Node::device_import`]).
    ///
    /// # Errors
    /// The node's refusal.
    pub fn device_import(
        &self,
        identity: CanonicalIdentity,
        memory: strata_chip_runtime::shared::SharedMemory,
    ) -> Result<u64, NodeError> {
        self.live()?;
        self.node.device_import(&self.session, identity, memory)
    }

    /// Frees a device buffer.
    ///
    /// # Errors
    /// The node's refusal.
    pub fn device_free(&self, identity: &CanonicalIdentity) -> Result<(), NodeError> {
        self.live()?;
        self.node.device_free(&self.session, identity)
    }

    /// Ends the session's run: its run buffers retire.
    ///
    /// # Errors
    /// [`NodeError::SessionEnded`].
    pub fn end_run(&self) -> Result<RunEnd, NodeError> {
        self.live()?;
        Ok(self.node.end_run(self.id, &self.session))
    }

    /// Writes `data` at `offset` of a device buffer.
    ///
    /// # Errors
    /// The node's refusal.
    pub fn copy_to_device(
        &self,
        identity: &CanonicalIdentity,
        offset: u64,
        data: &[u8],
    ) -> Result<(), NodeError> {
        self.live()?;
        self.node
            .copy_to_device(&self.session, identity, offset, data)
    }

    /// Reads `len` bytes at `offset` of a device buffer.
    ///
    /// # Errors
    /// The node's refusal.
    pub fn copy_from_device(
        &self,
        identity: &CanonicalIdentity,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, NodeError> {
        self.live()?;
        self.node
            .copy_from_device(&self.session, identity, offset, len, u64::MAX)
    }
}

impl Drop for InProcessSession {
    fn drop(&mut self) {
        self.node.end_session(self.id, "in-process session closed");
    }
}
