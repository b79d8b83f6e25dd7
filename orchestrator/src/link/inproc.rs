//! The in-process link: a worker node inside the driver's process
//! ([`InProcessWorker`]), reached by calls. Host buffers are still passed
//! by fd (a dup of the memfd, mapped by the node as a worker process maps
//! it), so tasks touch the driver's bytes directly.

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};

use strata_chip_runtime::Region;
use strata_proto::convert::{RunEnd, SessionState, TaskRequest, WorkerStats};
use strata_wire::{BufferDescriptor, CanonicalIdentity};
use strata_worker_node::{InProcessSession, InProcessWorker, NodeError, SessionId};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{
    BoxFuture, Dialer, Facts, LinkError, LinkEvent, Memory, Refusal, Transport, WorkerLink,
};

/// Opens sessions on an in-process worker.
#[derive(Debug, Clone)]
pub(crate) struct InProcessDialer {
    pub(crate) worker: InProcessWorker,
    /// Its index among the cluster's in-process workers (for messages).
    pub(crate) index: usize,
}

impl Dialer for InProcessDialer {
    fn dial(
        &self,
        previous: Option<SessionId>,
        events: mpsc::UnboundedSender<LinkEvent>,
    ) -> BoxFuture<'_, Result<Arc<dyn WorkerLink>, LinkError>> {
        Box::pin(async move {
            let mut session = self.worker.open(previous).map_err(node_error)?;
            let mut completions = session
                .take_completions()
                .ok_or_else(|| LinkError::Internal("a new session without completions".into()))?;
            let reader = {
                let tx = events.clone();
                tokio::spawn(async move {
                    while let Some(c) = completions.recv().await {
                        let mut batch = vec![c];
                        while let Ok(c) = completions.try_recv() {
                            batch.push(c);
                        }
                        if tx.send(LinkEvent::Completions(batch)).is_err() {
                            return;
                        }
                    }
                })
            };
            // Nothing can cut a call inside the process; the one way this
            // worker stops is a halt, reported as the health of a process
            // worker would be.
            let mut halted = self.worker.halted();
            let watch = tokio::spawn(async move {
                if halted.wait_for(|h| *h).await.is_ok() {
                    let _ =
                        events.send(LinkEvent::Unhealthy("the in-process worker halted".into()));
                }
            });
            let facts = Facts {
                session: session.id(),
                worker: self.worker.facts(),
                max_message: usize::MAX,
                memory: Memory::Shared,
                pid: None,
                transport: Transport::InProcess,
                data_from: None,
            };
            Ok(Arc::new(InProcessLink {
                worker: self.worker.clone(),
                session: Mutex::new(Some(Arc::new(session))),
                facts,
                tasks: Mutex::new(vec![reader, watch]),
            }) as Arc<dyn WorkerLink>)
        })
    }

    fn address(&self) -> String {
        format!("in-process:{}", self.index)
    }
}

/// One session on an in-process worker.
#[derive(Debug)]
pub(crate) struct InProcessLink {
    worker: InProcessWorker,
    /// `None` once closed (dropping the session ends it).
    session: Mutex<Option<Arc<InProcessSession>>>,
    facts: Facts,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl InProcessLink {
    fn session(&self) -> Result<Arc<InProcessSession>, LinkError> {
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| LinkError::Lost("the session is closed".into()))
    }

    /// Runs `call` on the session, now.
    fn call<T: Send + 'static>(
        &self,
        call: impl FnOnce(&InProcessSession) -> Result<T, NodeError>,
    ) -> BoxFuture<'_, Result<T, LinkError>> {
        let r = self.session().and_then(|s| call(&s).map_err(node_error));
        Box::pin(std::future::ready(r))
    }
}

impl WorkerLink for InProcessLink {
    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn send(&self, tasks: Vec<TaskRequest>) -> BoxFuture<'_, Result<(), LinkError>> {
        let session = self.session();
        Box::pin(async move { session?.submit(tasks).await.map_err(node_error) })
    }

    fn import<'a>(
        &'a self,
        buffers: &'a [(BufferDescriptor, BorrowedFd<'a>)],
    ) -> BoxFuture<'a, Result<Vec<Result<(), String>>, LinkError>> {
        let r = (|| {
            let owned = buffers
                .iter()
                .map(|(d, fd)| {
                    fd.try_clone_to_owned().map(|fd| (*d, fd)).map_err(|e| {
                        LinkError::Internal(format!("dup of buffer {}: {e}", d.identity()))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            self.session()?.import(owned).map_err(node_error)
        })();
        Box::pin(std::future::ready(r))
    }

    fn release_imports(&self, ids: Vec<CanonicalIdentity>) -> BoxFuture<'_, Result<(), LinkError>> {
        self.call(move |s| {
            s.release_imports(&ids);
            Ok(())
        })
    }

    fn device_alloc(
        &self,
        identity: CanonicalIdentity,
        nbytes: u64,
        region: Region,
    ) -> BoxFuture<'_, Result<u64, LinkError>> {
        self.call(move |s| s.device_alloc(identity, nbytes, region))
    }

    fn device_free(&self, identity: CanonicalIdentity) -> BoxFuture<'_, Result<(), LinkError>> {
        self.call(move |s| s.device_free(&identity))
    }

    fn export(
        &self,
        identity: CanonicalIdentity,
    ) -> BoxFuture<'_, Result<strata_chip_runtime::shared::SharedMemory, LinkError>> {
        self.call(move |s| s.device_export(&identity))
    }

    fn import_shared(
        &self,
        identity: CanonicalIdentity,
        memory: strata_chip_runtime::shared::SharedMemory,
    ) -> BoxFuture<'_, Result<(), LinkError>> {
        self.call(move |s| s.device_import(identity, memory).map(drop))
    }

    fn end_run(&self) -> BoxFuture<'_, Result<RunEnd, LinkError>> {
        self.call(InProcessSession::end_run)
    }

    fn flush(&self, views: Vec<strata_wire::Tensor>) -> BoxFuture<'_, Result<u64, LinkError>> {
        self.call(move |s| s.flush(&[], &views))
    }

    fn copy_to_device(
        &self,
        identity: CanonicalIdentity,
        offset: u64,
        data: Vec<u8>,
    ) -> BoxFuture<'_, Result<(), LinkError>> {
        self.call(move |s| s.copy_to_device(&identity, offset, &data))
    }

    fn copy_from_device(
        &self,
        identity: CanonicalIdentity,
        offset: u64,
        len: u64,
    ) -> BoxFuture<'_, Result<Vec<u8>, LinkError>> {
        self.call(move |s| s.copy_from_device(&identity, offset, len))
    }

    fn stage(&self, id: u64, _body: super::StageBody) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(std::future::ready(Err(LinkError::Internal(format!(
            "stage {id}: an in-process worker shares the driver's memory; nothing is staged"
        )))))
    }

    fn fetch(
        &self,
        id: u64,
        _expect: u64,
        _land: Option<super::FileRange>,
    ) -> BoxFuture<'_, Result<Option<bytes::Bytes>, LinkError>> {
        Box::pin(std::future::ready(Err(LinkError::Internal(format!(
            "fetch {id}: an in-process worker shares the driver's memory; nothing is held"
        )))))
    }

    fn stats(&self) -> BoxFuture<'_, Result<WorkerStats, LinkError>> {
        Box::pin(std::future::ready(Ok(self.worker.stats())))
    }

    fn session_state(&self, session: SessionId) -> BoxFuture<'_, Result<SessionState, LinkError>> {
        Box::pin(std::future::ready(Ok(self.worker.session_state(session))))
    }

    fn close(&self) {
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = None;
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

impl Drop for InProcessLink {
    fn drop(&mut self) {
        self.close();
    }
}

/// The one mapping from node refusals to link errors.
fn node_error(e: NodeError) -> LinkError {
    let msg = e.to_string();
    match e {
        NodeError::NoBuffer {
            run_ended: None, ..
        } => LinkError::Refused(Refusal::NotFound(msg)),
        NodeError::NoBuffer {
            run_ended: Some(_), ..
        } => LinkError::Refused(Refusal::Precondition(msg)),
        NodeError::AlreadyAllocated(_) => LinkError::Refused(Refusal::AlreadyExists(msg)),
        NodeError::OutOfRange { .. } | NodeError::Invalid(_) => {
            LinkError::Refused(Refusal::Invalid(msg))
        }
        NodeError::SessionEnded(_) => LinkError::Lost(msg),
        NodeError::Halted => LinkError::Unreachable(msg),
        NodeError::Device(d) => match d {
            strata_chip_runtime::Error::OutOfMemory { .. }
            | strata_chip_runtime::Error::TooManyBlocks { .. } => {
                LinkError::Refused(Refusal::Exhausted(msg))
            }
            strata_chip_runtime::Error::RunEnded { .. } => {
                LinkError::Refused(Refusal::Precondition(msg))
            }
            strata_chip_runtime::Error::ShutDown => LinkError::Unreachable(msg),
            _ => LinkError::Refused(Refusal::Invalid(msg)),
        },
        _ => LinkError::Internal(msg),
    }
}
