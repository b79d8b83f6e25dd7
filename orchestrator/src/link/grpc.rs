//! The gRPC link: a worker process reached over gRPC, with its fd side
//! channel when it listens on a Unix socket, and then its shared-memory
//! ring for tasks and completions when both sides take one ([`super::ring`]).

use std::future::Future;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_chip_runtime::Region;
use strata_client::{
    Body, ClientError, ClientTls, DataConnection, Endpoint, FdChannel, SessionId, TaskSender,
    WorkerClient,
};
use strata_proto::convert::{RunEnd, SessionState, TaskRequest, WorkerStats};
use strata_wire::{BufferDescriptor, CanonicalIdentity};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::Code;

use super::ring::RingPlane;
use super::{
    BoxFuture, Dialer, Facts, FileRange, LinkError, LinkEvent, Memory, Refusal, StageBody,
    Transport, WorkerLink,
};

/// Longest a connection attempt may take, handshake and streams included.
pub(crate) const DIAL_LIMIT: Duration = Duration::from_secs(5);

/// Dials a worker at an address.
#[derive(Debug, Clone)]
pub(crate) struct GrpcDialer {
    pub(crate) endpoint: Endpoint,
    pub(crate) token: Option<String>,
    pub(crate) tls: Option<ClientTls>,
    /// Health beats every this many milliseconds ...
    pub(crate) health_ms: u32,
    /// ... and the worker is unhealthy when none came for this long.
    pub(crate) health_deadline: Duration,
    /// Move tasks and completions onto a shared-memory ring when the
    /// worker offers one (Unix sockets only).
    pub(crate) ring: bool,
    /// Stage and fetch large view bytes on the worker's data connection
    /// when it offers one (TCP without TLS).
    pub(crate) data_connection: bool,
    /// Watches the rings' completion lanes from the cluster's runtime
    /// while tasks come and go (`None`: their reader threads alone do).
    pub(crate) poller: Option<Arc<super::ring::RingPoller>>,
}

/// Views of at least this many bytes go on the data connection; smaller
/// ones travel in their task's message and completion, where they cost
/// no extra round trip. Measured with `strata-bench --scenario remote`
/// at 128 KiB to 1 MiB (docs/performance-notes.md#the-data-connection).
pub(crate) const DATA_FROM: u64 = 256 << 10;

impl Dialer for GrpcDialer {
    fn dial(
        &self,
        previous: Option<SessionId>,
        events: mpsc::UnboundedSender<LinkEvent>,
    ) -> BoxFuture<'_, Result<Arc<dyn WorkerLink>, LinkError>> {
        Box::pin(async move {
            match tokio::time::timeout(DIAL_LIMIT, self.connect(previous, events)).await {
                Ok(r) => r.map(|l| Arc::new(l) as Arc<dyn WorkerLink>),
                Err(_) => Err(LinkError::TimedOut(format!(
                    "no answer within {DIAL_LIMIT:?} (connection, handshake and streams)"
                ))),
            }
        })
    }

    fn address(&self) -> String {
        self.endpoint.to_string()
    }
}

impl GrpcDialer {
    async fn connect(
        &self,
        previous: Option<SessionId>,
        events: mpsc::UnboundedSender<LinkEvent>,
    ) -> Result<GrpcLink, LinkError> {
        let mut client =
            WorkerClient::connect_with(&self.endpoint, self.token.as_deref(), self.tls.as_ref())
                .await
                .map_err(|e| link_error("connect", e))?;
        let hs = client
            .handshake_after(previous)
            .await
            .map_err(|e| link_error("handshake", e))?;
        let mut fd = match self.endpoint {
            Endpoint::Unix(_) => Some(
                client
                    .fd_channel()
                    .await
                    .map_err(|e| link_error("fd channel", e))?,
            ),
            Endpoint::Tcp(_) => None,
        };
        // The data connection, when the worker offers one and we take it.
        // One that cannot be opened leaves the bytes on gRPC calls: slower,
        // not wrong.
        let data = match (&self.endpoint, &hs.data) {
            (Endpoint::Tcp(addr), Some(offer)) if self.data_connection => {
                let at = std::net::SocketAddr::new(addr.ip(), offer.port);
                match DataConnection::connect(at, hs.session, offer, DATA_FROM).await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::warn!(worker = %self.endpoint, data = %at, error = %e,
                            "data connection refused or unreachable: staging on gRPC calls");
                        None
                    }
                }
            }
            _ => None,
        };
        let ring = match &mut fd {
            Some(fd) if self.ring && hs.ring() => {
                RingPlane::attach(fd, events.clone(), self.poller.clone())
                    .await?
                    .map(Arc::new)
            }
            _ => None,
        };
        let (sender, mut completions) = client
            .open_tasks()
            .await
            .map_err(|e| link_error("task stream", e))?
            .split();
        let mut health = client
            .health(self.health_ms)
            .await
            .map_err(|e| link_error("health stream", e))?;
        // Set once the session is known to be over or the worker silent:
        // the long calls (`stage`, `fetch`) give up on it instead of
        // waiting on a worker that will never answer.
        let (down_tx, down) = watch::channel(None::<String>);
        let down_tx = Arc::new(down_tx);
        let reader = {
            let tx = events.clone();
            let ring = ring.clone();
            let down_tx = Arc::clone(&down_tx);
            tokio::spawn(async move {
                let end = loop {
                    match completions.next().await {
                        Ok(Some(batch)) => {
                            if tx.send(LinkEvent::Completions(batch)).is_err() {
                                return;
                            }
                        }
                        Ok(None) => break None,
                        Err(e) => break Some(link_error("task stream", e)),
                    }
                };
                // The completions the worker published on the ring before
                // the session ended go up before its end does.
                if let Some(ring) = ring {
                    ring.close_and_drain().await;
                }
                down_tx.send_replace(Some(match &end {
                    Some(e) => format!("task stream broke: {e}"),
                    None => "the worker closed the task stream".to_owned(),
                }));
                let _ = tx.send(LinkEvent::Closed(end));
            })
        };
        let deadline = self.health_deadline;
        let watch = tokio::spawn(async move {
            let cause = loop {
                match tokio::time::timeout(deadline, health.next()).await {
                    Ok(Ok(Some(_))) => {}
                    Ok(Ok(None)) => break "the worker ended its health stream".to_owned(),
                    Ok(Err(e)) => break format!("health stream broke: {e}"),
                    Err(_) => {
                        break format!(
                            "no health beat for {} ms (hung or unreachable)",
                            deadline.as_millis()
                        );
                    }
                }
            };
            down_tx.send_replace(Some(cause.clone()));
            let _ = events.send(LinkEvent::Unhealthy(cause));
        });
        let mut max_message = usize::try_from(hs.max_message_bytes)
            .unwrap_or(usize::MAX)
            .min(strata_proto::DEFAULT_MAX_MESSAGE_BYTES);
        if let Some(r) = &ring {
            max_message = max_message.min(r.max_record());
        }
        let facts = Facts {
            session: hs.session,
            worker: hs.worker.clone(),
            max_message,
            memory: if fd.is_some() {
                Memory::Shared
            } else {
                Memory::Staged
            },
            pid: fd.as_ref().and_then(FdChannel::peer_pid),
            transport: match (&ring, &self.endpoint) {
                (Some(_), _) => Transport::Ring,
                (None, Endpoint::Unix(_)) => Transport::GrpcUnix,
                (None, Endpoint::Tcp(_)) => Transport::GrpcTcp,
            },
            data_from: data.as_ref().map(|_| DATA_FROM),
        };
        Ok(GrpcLink {
            client,
            facts,
            sender: Mutex::new(Some(Arc::new(sender))),
            fd: fd.map(tokio::sync::Mutex::new),
            ring,
            data: data.map(|c| tokio::sync::Mutex::new(Some(c))),
            recycler: strata_proto::recycle::Recycler::default(),
            tasks: Mutex::new(vec![reader, watch]),
            down,
        })
    }
}

/// One session on a worker process over gRPC.
#[derive(Debug)]
pub(crate) struct GrpcLink {
    client: WorkerClient,
    facts: Facts,
    /// `None` once closed: the task stream ends, and with it the session.
    sender: Mutex<Option<Arc<TaskSender>>>,
    fd: Option<tokio::sync::Mutex<FdChannel>>,
    /// The session's ring, when tasks and completions travel on it (the
    /// task stream then only keeps the session alive).
    ring: Option<Arc<RingPlane>>,
    /// The session's data connection, when it has one; `None` inside once
    /// a call on it failed or was dropped midway (it is out of step, and
    /// the worker is being lost).
    data: Option<tokio::sync::Mutex<Option<DataConnection>>>,
    /// Strings fetched bytes land in, kept for the next fetch (their
    /// pages stay resident).
    recycler: strata_proto::recycle::Recycler,
    /// The completion reader and the health watch.
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Why the session is over or the worker silent, once it is.
    down: watch::Receiver<Option<String>>,
}

impl GrpcLink {
    fn client(&self) -> WorkerClient {
        self.client.clone()
    }

    /// `call`, or [`LinkError::Lost`] as soon as the worker is known to be
    /// gone or silent past the health deadline.
    async fn unless_down<T>(
        &self,
        call: impl Future<Output = Result<T, LinkError>>,
    ) -> Result<T, LinkError> {
        let mut down = self.down.clone();
        tokio::select! {
            // The call first: one that is ready at once (a task batch with
            // room on the ring) never looks at the watch.
            biased;
            r = call => r,
            gone = down.wait_for(Option::is_some) => Err(LinkError::Lost(
                gone.ok().and_then(|g| g.clone()).unwrap_or_else(|| "the link closed".into()),
            )),
        }
    }
}

impl WorkerLink for GrpcLink {
    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn send(&self, tasks: Vec<TaskRequest>) -> BoxFuture<'_, Result<(), LinkError>> {
        let sender = self
            .sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Unless the worker is gone or silent: a hung worker's full ring or
        // stream window would hold the endpoint for ever.
        Box::pin(self.unless_down(async move {
            let Some(sender) = sender else {
                return Err(LinkError::Lost("the session is closed".into()));
            };
            if let Some(ring) = &self.ring {
                return ring.send(&tasks).await;
            }
            sender
                .send(&tasks)
                .await
                .map_err(|e| link_error("sending tasks", e))
        }))
    }

    fn import<'a>(
        &'a self,
        buffers: &'a [(BufferDescriptor, BorrowedFd<'a>)],
    ) -> BoxFuture<'a, Result<Vec<Result<(), String>>, LinkError>> {
        // Unless the worker is gone or silent: a hung worker never answers
        // the import (cancelling it breaks the fd channel, which the lost
        // session no longer needs).
        Box::pin(self.unless_down(async move {
            let Some(fd) = &self.fd else {
                return Err(LinkError::Internal(
                    "this worker is reached over TCP: buffers travel as bytes, not by fd".into(),
                ));
            };
            let grants: Vec<BufferDescriptor> = buffers.iter().map(|(d, _)| *d).collect();
            let fds: Vec<BorrowedFd<'_>> = buffers.iter().map(|(_, f)| *f).collect();
            let results = fd
                .lock()
                .await
                .import_as(&grants, &fds)
                .await
                .map_err(|e| LinkError::Unreachable(format!("fd channel: {e}")))?;
            if results.len() != grants.len() {
                return Err(LinkError::Internal(format!(
                    "fd channel: {} results for {} buffers",
                    results.len(),
                    grants.len()
                )));
            }
            Ok(results)
        }))
    }

    fn export(
        &self,
        identity: CanonicalIdentity,
    ) -> BoxFuture<'_, Result<strata_chip_runtime::shared::SharedMemory, LinkError>> {
        Box::pin(self.unless_down(async move {
            let Some(fd) = &self.fd else {
                return Err(LinkError::Internal(
                    "this worker is reached over TCP: device memory leaves a worker only by fd, over its Unix socket".into(),
                ));
            };
            let exported = fd
                .lock()
                .await
                .export(&identity)
                .await
                .map_err(|e| LinkError::Unreachable(format!("fd channel: {e}")))?
                .map_err(|why| LinkError::Refused(Refusal::Invalid(why)))?;
            let place = strata_chip_runtime::shared::Place::from_tag(&exported.place).ok_or_else(|| {
                LinkError::Internal(format!(
                    "fd channel: the worker exported memory of unknown place {:?}",
                    exported.place
                ))
            })?;
            Ok(strata_chip_runtime::shared::SharedMemory {
                fd: exported.fd,
                len: exported.len,
                place,
            })
        }))
    }

    fn import_shared(
        &self,
        identity: CanonicalIdentity,
        memory: strata_chip_runtime::shared::SharedMemory,
    ) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(self.unless_down(async move {
            let Some(fd) = &self.fd else {
                return Err(LinkError::Internal(
                    "this worker is reached over TCP: another worker's device memory reaches a worker only by fd, over its Unix socket".into(),
                ));
            };
            fd.lock()
                .await
                .import_shared(&identity, memory.len, &memory.place.tag(), std::os::fd::AsFd::as_fd(&memory.fd))
                .await
                .map_err(|e| LinkError::Unreachable(format!("fd channel: {e}")))?
                .map_err(|why| LinkError::Refused(Refusal::Invalid(why)))
        }))
    }

    fn release_imports(&self, ids: Vec<CanonicalIdentity>) -> BoxFuture<'_, Result<(), LinkError>> {
        let mut c = self.client();
        Box::pin(async move {
            c.release_imports(&ids)
                .await
                .map(drop)
                .map_err(|e| link_error("release imports", e))
        })
    }

    fn device_alloc(
        &self,
        identity: CanonicalIdentity,
        nbytes: u64,
        region: Region,
    ) -> BoxFuture<'_, Result<u64, LinkError>> {
        let mut c = self.client();
        Box::pin(async move {
            c.device_alloc(&identity, nbytes, region)
                .await
                .map_err(|e| link_error("device alloc", e))
        })
    }

    fn device_free(&self, identity: CanonicalIdentity) -> BoxFuture<'_, Result<(), LinkError>> {
        let mut c = self.client();
        Box::pin(async move {
            c.device_free(&identity)
                .await
                .map_err(|e| link_error("device free", e))
        })
    }

    fn end_run(&self) -> BoxFuture<'_, Result<RunEnd, LinkError>> {
        let mut c = self.client();
        Box::pin(async move { c.end_run().await.map_err(|e| link_error("end run", e)) })
    }

    fn flush(&self, views: Vec<strata_wire::Tensor>) -> BoxFuture<'_, Result<u64, LinkError>> {
        let mut c = self.client();
        Box::pin(async move {
            c.flush(&[], &views)
                .await
                .map_err(|e| link_error("flush", e))
        })
    }

    fn copy_to_device(
        &self,
        identity: CanonicalIdentity,
        offset: u64,
        data: Vec<u8>,
    ) -> BoxFuture<'_, Result<(), LinkError>> {
        let mut c = self.client();
        Box::pin(async move {
            c.copy_to_device(&identity, offset, data)
                .await
                .map_err(|e| link_error("copy to device", e))
        })
    }

    fn copy_from_device(
        &self,
        identity: CanonicalIdentity,
        offset: u64,
        len: u64,
    ) -> BoxFuture<'_, Result<Vec<u8>, LinkError>> {
        let mut c = self.client();
        Box::pin(async move {
            c.copy_from_device(&identity, offset, len)
                .await
                .map_err(|e| link_error("copy from device", e))
        })
    }

    fn stage(&self, id: u64, body: StageBody) -> BoxFuture<'_, Result<(), LinkError>> {
        let mut c = self.client();
        let chunk = self.facts.max_message.saturating_sub(64 * 1024);
        // Unless the worker is gone or silent: a stopped worker stops
        // reading, and a stage would wait on its full socket for ever.
        Box::pin(self.unless_down(async move {
            if let Some(data) = &self.data {
                // What the worker's header check would refuse by ending
                // the connection: refused here, as the `Stage` call would.
                let len = body.len();
                if len > strata_proto::MAX_INLINE_EXTENT {
                    return Err(LinkError::Refused(Refusal::Invalid(format!(
                        "Stage {id}: total {len}: staged bytes are 1 to {} bytes (the largest inline view)",
                        strata_proto::MAX_INLINE_EXTENT
                    ))));
                }
                let mut slot = data.lock().await;
                let mut conn = take_data(&mut slot)?;
                let body_ref = match &body {
                    StageBody::Packed(b) => Body::Bytes(b),
                    StageBody::File { host, offset, len } => Body::File {
                        fd: host.fd(),
                        offset: *offset,
                        len: *len,
                    },
                };
                let r = conn.stage(id, body_ref).await;
                if still_in_step(&r) {
                    *slot = Some(conn);
                }
                return r.map_err(|e| link_error("stage (data connection)", e));
            }
            let data = match body {
                StageBody::Packed(b) => b,
                // Only a link with a data connection is given these; packed
                // here all the same rather than refused.
                StageBody::File { host, offset, len } => {
                    let len = usize::try_from(len)
                        .map_err(|_| LinkError::Internal(format!("stage {id}: {len} bytes")))?;
                    host.read(offset, len)
                        .map(bytes::Bytes::from)
                        .map_err(|e| LinkError::Internal(format!("stage {id}: {e}")))?
                }
            };
            c.stage(id, data, chunk)
                .await
                .map_err(|e| link_error("stage", e))
        }))
    }

    fn fetch(
        &self,
        id: u64,
        expect: u64,
        land: Option<FileRange>,
    ) -> BoxFuture<'_, Result<Option<bytes::Bytes>, LinkError>> {
        let mut c = self.client();
        Box::pin(self.unless_down(async move {
            if let (Some(data), Some(to)) = (&self.data, &land) {
                let mut slot = data.lock().await;
                let mut conn = take_data(&mut slot)?;
                let r = conn
                    .fetch_to_file(id, to.host.fd(), to.offset, to.len)
                    .await;
                if still_in_step(&r) {
                    *slot = Some(conn);
                }
                r.map_err(|e| link_error("fetch (data connection)", e))?;
                return Ok(None);
            }
            if let Some(data) = &self.data {
                let cap = usize::try_from(expect).unwrap_or(usize::MAX);
                let mut into = self
                    .recycler
                    .take(cap.min(strata_proto::MAX_INLINE_EXTENT as usize));
                let mut slot = data.lock().await;
                let mut conn = take_data(&mut slot)?;
                let r = conn.fetch(id, expect, &mut into).await;
                if still_in_step(&r) {
                    *slot = Some(conn);
                }
                r.map_err(|e| link_error("fetch (data connection)", e))?;
                return Ok(Some(self.recycler.wrap(into)));
            }
            c.fetch(id, expect)
                .await
                .map(Some)
                .map_err(|e| link_error("fetch", e))
        }))
    }

    fn stats(&self) -> BoxFuture<'_, Result<WorkerStats, LinkError>> {
        let mut c = self.client();
        Box::pin(async move { c.stats().await.map_err(|e| link_error("stats", e)) })
    }

    fn session_state(&self, session: SessionId) -> BoxFuture<'_, Result<SessionState, LinkError>> {
        let mut c = self.client();
        Box::pin(async move {
            c.session_state(session)
                .await
                .map_err(|e| link_error("session state", e))
        })
    }

    fn close(&self) {
        *self.sender.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Some(ring) = &self.ring {
            ring.close();
        }
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl Drop for GrpcLink {
    fn drop(&mut self) {
        self.close();
    }
}

/// Whether the data connection is still in step after a call ended with
/// `r`: after success or a refusal it is; after any other failure it is
/// not, and is dropped (later calls get [`LinkError::Lost`], and the
/// endpoint loses the worker as it does for a failed gRPC call).
fn still_in_step(r: &Result<(), ClientError>) -> bool {
    matches!(r, Ok(()) | Err(ClientError::Status(_)))
}

/// The data connection, taken out of its slot for one call: put back by
/// the caller when [`still_in_step`]. A call whose future is dropped
/// midway never puts it back, which closes it.
fn take_data(slot: &mut Option<DataConnection>) -> Result<DataConnection, LinkError> {
    slot.take()
        .ok_or_else(|| LinkError::Lost("the data connection broke on an earlier call".into()))
}

/// The one mapping from client errors (gRPC statuses among them) to link
/// errors; `what` names the call.
pub(crate) fn link_error(what: &str, e: ClientError) -> LinkError {
    match e {
        ClientError::Status(s) => {
            let msg = s.message().to_owned();
            match s.code() {
                Code::InvalidArgument | Code::OutOfRange => {
                    LinkError::Refused(Refusal::Invalid(msg))
                }
                Code::NotFound => LinkError::Refused(Refusal::NotFound(msg)),
                Code::AlreadyExists => LinkError::Refused(Refusal::AlreadyExists(msg)),
                Code::FailedPrecondition => LinkError::Refused(Refusal::Precondition(msg)),
                Code::ResourceExhausted => LinkError::Refused(Refusal::Exhausted(msg)),
                Code::DeadlineExceeded => LinkError::TimedOut(format!("{what}: {msg}")),
                Code::Unauthenticated | Code::PermissionDenied => {
                    LinkError::Auth(format!("{what}: {msg}"))
                }
                Code::Unavailable | Code::Cancelled | Code::Aborted => {
                    LinkError::Unreachable(format!("{what}: {msg}"))
                }
                _ => LinkError::Internal(format!("{what}: {msg}")),
            }
        }
        ClientError::Connect { .. } | ClientError::Io(_) | ClientError::Data(_) => {
            LinkError::Unreachable(format!("{what}: {e}"))
        }
        other => LinkError::Internal(format!("{what}: {other}")),
    }
}
