//! The gRPC service: a thin shell that turns calls into work on the
//! [`Node`] and maps errors to statuses in one place ([`status`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use strata_proto::convert::{
    self, FailureCause, FailureKind, TaskCompletion, TaskOutcome, TaskRequest,
};
use strata_proto::{PROTOCOL_VERSION, SESSION_HEADER, TaskId, pb};
use strata_worker_node::{Intake, Node, NodeError, Session, SessionId};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::config::Offers;

/// The service implementation.
#[derive(Debug, Clone)]
pub(crate) struct WorkerService {
    node: Arc<Node>,
    offers: Arc<Offers>,
    shutdown: watch::Receiver<bool>,
}

impl WorkerService {
    pub(crate) fn new(
        node: Arc<Node>,
        offers: Arc<Offers>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        WorkerService {
            node,
            offers,
            shutdown,
        }
    }

    fn session(&self, meta: &MetadataMap) -> Result<(SessionId, Arc<Session>), Status> {
        let raw = meta.get(SESSION_HEADER).ok_or_else(|| {
            Status::failed_precondition(format!(
                "no {SESSION_HEADER} metadata: call Handshake first"
            ))
        })?;
        let id = raw
            .to_str()
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(SessionId)
            .ok_or_else(|| {
                Status::invalid_argument(format!("{SESSION_HEADER} is not a decimal session id"))
            })?;
        let session = self
            .node
            .session(id)
            .ok_or_else(|| Status::not_found(format!("session {id} is unknown or has ended")))?;
        Ok((id, session))
    }

    /// The node's facts as a session on this listener may use them: a
    /// listener without an fd channel (TCP) imports nothing, so states no
    /// imported kind and its host buffers travel as bytes; the ring and the
    /// data connection are this listener's to offer.
    fn facts(&self) -> convert::WorkerFacts {
        let mut facts = self.node.facts();
        let caps = &mut facts.capabilities;
        if self.offers.fd_socket.is_none() {
            caps.backends = caps.backends.difference(convert::BackendKinds::of(
                strata_worker_node::IMPORTED_KINDS,
            ));
        } else if self.offers.ring {
            caps.features = caps.features | convert::Features::RING;
        }
        if self.offers.data_port.is_some() {
            caps.features = caps.features | convert::Features::DATA_PORT;
        }
        facts
    }
}

/// The one mapping from chip errors to gRPC statuses.
fn status(e: &strata_chip_runtime::Error) -> Status {
    use strata_chip_runtime::Error as E;
    let msg = e.to_string();
    match e {
        E::OutOfMemory { .. } | E::TooManyBlocks { .. } => Status::resource_exhausted(msg),
        E::UnknownBlock { .. } => Status::not_found(msg),
        E::RunEnded { .. } => Status::failed_precondition(msg),
        E::OutOfRange { .. }
        | E::Argument { .. }
        | E::Scalars { .. }
        | E::Spec { .. }
        | E::Wire(_) => Status::invalid_argument(msg),
        E::ShutDown => Status::unavailable(msg),
        _ => Status::internal(msg),
    }
}

/// The one mapping from node refusals to gRPC statuses.
fn refused(e: &NodeError) -> Status {
    let msg = e.to_string();
    match e {
        NodeError::NoBuffer {
            run_ended: None, ..
        } => Status::not_found(msg),
        NodeError::NoBuffer {
            run_ended: Some(_), ..
        } => Status::failed_precondition(msg),
        NodeError::AlreadyAllocated(_) => Status::already_exists(msg),
        NodeError::OutOfRange { .. } => Status::out_of_range(msg),
        NodeError::Invalid(_) => Status::invalid_argument(msg),
        NodeError::SessionEnded(_) => Status::not_found(msg),
        NodeError::Halted => Status::unavailable(msg),
        NodeError::Device(e) => status(e),
        // A refusal this service does not know yet: still the caller's.
        _ => Status::failed_precondition(msg),
    }
}

/// Ends its session when dropped: when the task stream's response side
/// goes away, the orchestrator is gone or done.
#[derive(Debug)]
struct SessionGuard {
    node: Arc<Node>,
    id: SessionId,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.node.end_session(self.id, "task stream closed");
    }
}

/// Completions, batched: each poll yields everything that is ready.
#[derive(Debug)]
pub(crate) struct Completions {
    rx: mpsc::UnboundedReceiver<TaskCompletion>,
    /// Where written views too large for a message wait to be fetched.
    held: Arc<strata_worker_node::staging::Held>,
    /// Received and not yet sent (a batch stops at the message limit).
    pending: std::collections::VecDeque<TaskCompletion>,
    /// Largest batch, in bytes: the message limit less headroom.
    limit: usize,
    _guard: SessionGuard,
}

/// Most completions in one batch.
const MAX_BATCH: usize = 4096;

/// About how many bytes a completion takes in a message.
fn completion_size(c: &TaskCompletion) -> usize {
    let cause = match &c.outcome {
        TaskOutcome::Success => 0,
        TaskOutcome::Failure(f) => f.message.len(),
        TaskOutcome::Resend(s) => s.len(),
    };
    64 + cause + c.outputs.iter().map(|(_, d)| d.len() + 16).sum::<usize>()
}

impl Stream for Completions {
    type Item = Result<pb::CompletionBatch, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.pending.is_empty() {
            let mut ready = Vec::new();
            match self.rx.poll_recv_many(cx, &mut ready, MAX_BATCH) {
                Poll::Ready(0) => return Poll::Ready(None),
                Poll::Ready(_) => {
                    // Written views the client fetches on its data
                    // connection wait for it there instead.
                    let from = self.held.hold_from();
                    if from > 0 {
                        for c in &mut ready {
                            hold_from_size(&self.held, c, from);
                        }
                    }
                    self.pending.extend(ready);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        // As many as fit one message; a completion too big for any
        // message becomes its task's failure instead of breaking the
        // stream for every task.
        let limit = self.limit;
        let mut batch = Vec::new();
        let mut size = 0usize;
        while let Some(c) = self.pending.front() {
            let sz = completion_size(c);
            if !batch.is_empty() && size + sz > limit {
                break;
            }
            let Some(mut c) = self.pending.pop_front() else {
                break;
            };
            if sz > limit {
                c = hold_outputs(&self.held, c, limit);
            }
            size += completion_size(&c);
            batch.push(pb::Completion::from(c));
        }
        Poll::Ready(Some(Ok(pb::CompletionBatch { completions: batch })))
    }
}

/// Moves the written views of `c` of at least `from` bytes into `held`
/// (the client asked for them that way: it fetches them on its data
/// connection). A view the table has no room for stays in the completion,
/// where [`hold_outputs`] deals with it if it is too large for a message.
fn hold_from_size(held: &strata_worker_node::staging::Held, c: &mut TaskCompletion, from: u64) {
    if !c.outputs.iter().any(|(_, d)| d.len() as u64 >= from) {
        return;
    }
    let mut kept = Vec::with_capacity(c.outputs.len());
    for (arg, bytes) in std::mem::take(&mut c.outputs) {
        if (bytes.len() as u64) < from {
            kept.push((arg, bytes));
            continue;
        }
        let again = bytes.clone();
        match held.hold(bytes) {
            Ok(id) => c.held.push((arg, id)),
            Err(_) => kept.push((arg, again)),
        }
    }
    c.outputs = kept;
}

/// Moves the largest written views of `c` into `held` until the rest fits
/// `limit`: the completion names them and the driver fetches them. A view
/// the session cannot hold fails the task (its bytes would be lost), with
/// why.
fn hold_outputs(
    held: &strata_worker_node::staging::Held,
    mut c: TaskCompletion,
    limit: usize,
) -> TaskCompletion {
    c.outputs.sort_by_key(|(_, d)| std::cmp::Reverse(d.len()));
    let mut kept = std::mem::take(&mut c.outputs).into_iter();
    let mut moved = Vec::new();
    while completion_size(&c)
        + kept
            .as_slice()
            .iter()
            .map(|(_, d)| d.len() + 16)
            .sum::<usize>()
        > limit
    {
        let Some((arg, bytes)) = kept.next() else {
            break;
        };
        let len = bytes.len();
        match held.hold(bytes) {
            Ok(id) => {
                moved.push(id);
                c.held.push((arg, id));
            }
            Err(e) => {
                for id in moved {
                    held.take_held(id);
                }
                return TaskCompletion::failed(
                    c.id,
                    FailureCause::new(
                        FailureKind::Other,
                        format!(
                            "argument {arg}: its written view ({len} bytes) is too large for a message and cannot be held for fetching: {e}"
                        ),
                    ),
                );
            }
        }
    }
    c.outputs = kept.collect();
    c
}

type BeatStream = tokio_stream::wrappers::ReceiverStream<Result<pb::HealthBeat, Status>>;

#[tonic::async_trait]
impl pb::worker_server::Worker for WorkerService {
    async fn handshake(
        &self,
        request: Request<pb::HandshakeRequest>,
    ) -> Result<Response<pb::HandshakeReply>, Status> {
        let req = request.into_inner();
        if req.protocol_version != PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "protocol version {} refused: this worker speaks version {PROTOCOL_VERSION}",
                req.protocol_version
            )));
        }
        // The client names the session it lost: end it now (its queued
        // tasks then never start), and tell it what is left of it.
        let previous = (req.previous_session != 0).then(|| {
            let prev = SessionId(req.previous_session);
            self.node
                .end_session(prev, "superseded by a new session of the same client");
            self.node.session_state(prev)
        });
        let facts = self.facts();
        let session = self.node.open_session(facts.capabilities);
        // A client that handshakes and never opens its task stream must
        // not hold the session (and what it may allocate) for ever.
        let node = Arc::clone(&self.node);
        let grace = self.offers.session_grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let idle = node
                .session(session)
                .is_some_and(|s| !s.streaming.load(Ordering::SeqCst));
            if idle {
                node.end_session(session, "no task stream opened within the grace period");
            }
        });
        debug!(%session, client = req.client_name, ?previous, "handshake");
        Ok(Response::new(pb::HandshakeReply {
            protocol_version: PROTOCOL_VERSION,
            session_id: session.0,
            fd_socket: self
                .offers
                .fd_socket
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            max_message_bytes: self.node.limits.max_message_bytes as u64,
            previous: previous.map(pb::PreviousSession::from),
            data_port: self.offers.data_port.map_or(0, u32::from),
            data_secret: match (self.offers.data_port, self.node.session(session)) {
                (Some(_), Some(s)) => s.data_secret.to_vec(),
                _ => Vec::new(),
            },
            ..convert::handshake_facts(&facts)
        }))
    }

    async fn session_state(
        &self,
        request: Request<pb::SessionStateRequest>,
    ) -> Result<Response<pb::SessionStateReply>, Status> {
        self.session(request.metadata())?;
        let asked = SessionId(request.into_inner().session);
        Ok(Response::new(self.node.session_state(asked).into()))
    }

    type TasksStream = Completions;

    async fn tasks(
        &self,
        request: Request<Streaming<pb::TaskBatch>>,
    ) -> Result<Response<Completions>, Status> {
        let (id, session) = self.session(request.metadata())?;
        if session.streaming.swap(true, Ordering::SeqCst) {
            return Err(Status::already_exists(format!(
                "session {id} already has a task stream"
            )));
        }
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel::<TaskCompletion>();
        let mut ended = session.ended();
        let held = Arc::clone(&session.held);
        let intake = Intake::new(Arc::clone(&self.node), Arc::clone(&session), Arc::new(tx));
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = inbound.message() => m,
                    _ = shutdown.changed() => break,
                    // Ended here (its ring refused, its fd channel gone):
                    // the completion stream ends once no task of the
                    // session can still complete on it.
                    _ = ended.wait_for(|e| *e) => break,
                };
                let batch = match next {
                    Ok(Some(b)) => b,
                    Ok(None) => break,
                    Err(e) => {
                        warn!(session = %id, error = %e, "task stream broke");
                        break;
                    }
                };
                // Backpressure: the stream is not read while the session's
                // tasks in flight are at their limit.
                for task in batch.tasks {
                    let task_id = TaskId(task.task_id);
                    let req = TaskRequest::try_from(task).and_then(|mut r| {
                        // Bytes staged ahead of the task (a view larger
                        // than one message) join it here.
                        r.resolve_staged(|id| held.take_staged(id))?;
                        Ok(r)
                    });
                    intake.take(task_id, req.map_err(|e| e.to_string())).await;
                }
            }
        });
        Ok(Response::new(Completions {
            rx,
            held: Arc::clone(&session.held),
            pending: std::collections::VecDeque::new(),
            limit: self.node.limits.max_message_bytes.saturating_sub(64 * 1024),
            _guard: SessionGuard {
                node: Arc::clone(&self.node),
                id,
            },
        }))
    }

    async fn device_alloc(
        &self,
        request: Request<pb::DeviceAllocRequest>,
    ) -> Result<Response<pb::DeviceAllocReply>, Status> {
        let (_, session) = self.session(request.metadata())?;
        let req = request.into_inner();
        let identity = convert::identity("identity", &req.identity)?;
        let region = convert::region("region", req.region)?;
        let addr = self
            .node
            .device_alloc(&session, identity, req.nbytes, region)
            .map_err(|e| refused(&e))?;
        Ok(Response::new(pb::DeviceAllocReply { addr }))
    }

    async fn device_free(
        &self,
        request: Request<pb::DeviceFreeRequest>,
    ) -> Result<Response<pb::DeviceFreeReply>, Status> {
        let (_, session) = self.session(request.metadata())?;
        let identity = convert::identity("identity", &request.get_ref().identity)?;
        self.node
            .device_free(&session, &identity)
            .map_err(|e| refused(&e))?;
        Ok(Response::new(pb::DeviceFreeReply {}))
    }

    async fn end_run(
        &self,
        request: Request<pb::EndRunRequest>,
    ) -> Result<Response<pb::EndRunReply>, Status> {
        let (id, session) = self.session(request.metadata())?;
        Ok(Response::new(self.node.end_run(id, &session).into()))
    }

    async fn copy_to_device(
        &self,
        request: Request<pb::CopyToDeviceRequest>,
    ) -> Result<Response<pb::CopyToDeviceReply>, Status> {
        let (_, session) = self.session(request.metadata())?;
        let req = request.into_inner();
        let identity = convert::identity("identity", &req.identity)?;
        self.node
            .copy_to_device(&session, &identity, req.offset, &req.data)
            .map_err(|e| refused(&e))?;
        Ok(Response::new(pb::CopyToDeviceReply {}))
    }

    async fn copy_from_device(
        &self,
        request: Request<pb::CopyFromDeviceRequest>,
    ) -> Result<Response<pb::CopyFromDeviceReply>, Status> {
        let (_, session) = self.session(request.metadata())?;
        let req = request.into_inner();
        let identity = convert::identity("identity", &req.identity)?;
        let limit = (self.node.limits.max_message_bytes as u64).saturating_sub(64);
        let data = self
            .node
            .copy_from_device(&session, &identity, req.offset, req.len, limit)
            .map_err(|e| refused(&e))?;
        Ok(Response::new(pb::CopyFromDeviceReply { data: data.into() }))
    }

    async fn release_import(
        &self,
        request: Request<pb::ReleaseImportRequest>,
    ) -> Result<Response<pb::ReleaseImportReply>, Status> {
        let (id, _) = self.session(request.metadata())?;
        let identities = request
            .into_inner()
            .identities
            .iter()
            .enumerate()
            .map(|(i, raw)| convert::identity(&format!("identities[{i}]"), raw))
            .collect::<Result<Vec<_>, _>>()?;
        let released = self.node.release_imports(id, &identities);
        Ok(Response::new(pb::ReleaseImportReply { released }))
    }

    async fn flush(
        &self,
        request: Request<pb::FlushRequest>,
    ) -> Result<Response<pb::FlushReply>, Status> {
        let (id, _) = self.session(request.metadata())?;
        let req = request.into_inner();
        let views = if req.views.is_empty() {
            Vec::new()
        } else {
            strata_wire::TaskArgs::decode(&req.views)
                .map_err(|e| Status::invalid_argument(format!("views: {e}")))?
                .tensors()
                .to_vec()
        };
        let named = req.identities.len() + views.len();
        if named > strata_proto::MAX_FLUSH_IDENTITIES {
            return Err(Status::invalid_argument(format!(
                "identities and views: {named} named; at most {} per flush",
                strata_proto::MAX_FLUSH_IDENTITIES
            )));
        }
        let identities = req
            .identities
            .iter()
            .enumerate()
            .map(|(i, raw)| convert::identity(&format!("identities[{i}]"), raw))
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = self.node.flush(id, &identities, &views);
        Ok(Response::new(pb::FlushReply { bytes }))
    }

    async fn stats(
        &self,
        request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsReply>, Status> {
        self.session(request.metadata())?;
        let stats = self.node.stats();
        Ok(Response::new(stats.into()))
    }

    type HealthStream = BeatStream;

    async fn health(
        &self,
        request: Request<pb::HealthRequest>,
    ) -> Result<Response<BeatStream>, Status> {
        let interval =
            Duration::from_millis(u64::from(request.get_ref().interval_ms.clamp(10, 60_000)));
        let (tx, rx) = mpsc::channel(1);
        let node = Arc::clone(&self.node);
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            let mut seq = 0u64;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = shutdown.changed() => return,
                }
                seq += 1;
                let b = node.beat(seq);
                let beat = pb::HealthBeat {
                    seq: b.seq,
                    tasks_in_flight: b.tasks_in_flight,
                    uptime_ms: b.uptime_ms,
                };
                if tx.send(Ok(beat)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn stage(
        &self,
        request: Request<Streaming<pb::StageChunk>>,
    ) -> Result<Response<pb::StageReply>, Status> {
        let (_, session) = self.session(request.metadata())?;
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("Stage: the call carried no chunk"))?;
        let (id, total) = (first.stage, first.total);
        if total == 0 || total > strata_proto::MAX_INLINE_EXTENT {
            return Err(Status::invalid_argument(format!(
                "Stage {id}: total {total}: staged bytes are 1 to {} bytes (the largest inline view)",
                strata_proto::MAX_INLINE_EXTENT
            )));
        }
        let staging = session.held.begin_stage(id, total).map_err(|e| match e {
            strata_worker_node::staging::HeldError::Full { .. } => {
                Status::resource_exhausted(e.to_string())
            }
            strata_worker_node::staging::HeldError::Closed => Status::not_found(e.to_string()),
            strata_worker_node::staging::HeldError::BadId(_) => {
                Status::invalid_argument(e.to_string())
            }
        })?;
        let total = usize::try_from(total).map_err(|_| Status::invalid_argument("total"))?;
        let mut buf = bytes::BytesMut::with_capacity(total);
        let mut chunk = Some(first);
        let mut k = 0usize;
        while let Some(c) = chunk {
            if (c.stage != 0 && c.stage != id) || (c.total != 0 && c.total as usize != total) {
                return Err(Status::invalid_argument(format!(
                    "Stage {id}: chunk {k} names stage {} of {} bytes: one call stages one id",
                    c.stage, c.total
                )));
            }
            if c.data.len() > total - buf.len() {
                return Err(Status::invalid_argument(format!(
                    "Stage {id}: chunk {k} runs past the announced {total} bytes"
                )));
            }
            buf.extend_from_slice(&c.data);
            k += 1;
            chunk = inbound.message().await?;
        }
        if buf.len() != total {
            return Err(Status::invalid_argument(format!(
                "Stage {id}: {} of the announced {total} bytes arrived",
                buf.len()
            )));
        }
        staging.finish(buf.freeze());
        Ok(Response::new(pb::StageReply {}))
    }

    type FetchStream = tokio_stream::Iter<std::vec::IntoIter<Result<pb::FetchChunk, Status>>>;

    async fn fetch(
        &self,
        request: Request<pb::FetchRequest>,
    ) -> Result<Response<Self::FetchStream>, Status> {
        let (_, session) = self.session(request.metadata())?;
        let id = request.into_inner().stage;
        let bytes = session.held.take_held(id).ok_or_else(|| {
            Status::not_found(format!(
                "no held bytes {id} in this session (never held, or fetched already)"
            ))
        })?;
        // Slices of the held bytes, not copies, each well under a message.
        let step = strata_proto::STAGE_CHUNK_BYTES
            .min(self.node.limits.max_message_bytes.saturating_sub(64 * 1024))
            .max(1);
        let chunks: Vec<Result<pb::FetchChunk, Status>> = (0..bytes.len())
            .step_by(step)
            .map(|at| {
                let end = (at + step).min(bytes.len());
                Ok(pb::FetchChunk {
                    data: bytes.slice(at..end),
                })
            })
            .collect();
        Ok(Response::new(tokio_stream::iter(chunks)))
    }

    async fn ping(
        &self,
        request: Request<pb::PingRequest>,
    ) -> Result<Response<pb::PingReply>, Status> {
        Ok(Response::new(pb::PingReply {
            payload: request.into_inner().payload,
        }))
    }
}
