//! [`Cluster`]: the driver API. It starts (or connects to) workers, runs
//! the orchestrator's actors on its own tokio runtime, and offers
//! blocking calls to create buffers, submit tasks and wait for them.
//!
//! Call it from ordinary threads, not from inside an async runtime (its
//! calls block on the actors' replies).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_chip_runtime::KernelHandle;
use strata_chip_runtime::kernel::Signature;
use strata_orchestrator_core::{ScopeId, WorkerId};
use strata_proto::convert::WorkerStats;
use strata_wire::{Access, IdentityMint};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

use crate::actors::endpoint::Life;
use crate::actors::{Cmd, EpCmd};
use crate::buffer::{Buffer, HostShared, Pool, Released, ScopeLife};
use crate::error::{BufferError, ClusterError, Error, SubmitError};
use crate::link::LinkError;
use crate::link::WorkerInfo;
use crate::local::LocalWorkers;
use crate::summary::RunSummary;
use crate::task::TaskHandle;
use crate::trace::Trace;

mod device;
mod scope;
mod submit;

pub use scope::ScopeGuard;

/// A scope: buffers registered in it are released once it has ended and
/// no unfinished task uses them. [`Cluster::scope`] opens one that ends
/// when its guard is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope(pub(crate) ScopeId);

impl Scope {
    /// Its number, as errors name it (`scope 3 has ended`).
    pub fn number(&self) -> u64 {
        self.0.0
    }
}

/// A set of workers and the orchestrator driving them.
pub struct Cluster {
    pub(crate) runtime: Option<Runtime>,
    pub(crate) cmds: mpsc::Sender<Cmd>,
    pub(crate) endpoints: Vec<mpsc::Sender<EpCmd>>,
    pub(crate) workers: Vec<WorkerInfo>,
    /// Callable name → its versions, highest last.
    pub(crate) callables: rustc_hash::FxHashMap<String, Vec<Offered>>,
    pub(crate) mint: IdentityMint,
    pub(crate) released: mpsc::UnboundedSender<Released>,
    /// Host memory recycled for runtime-managed buffers.
    pub(crate) pool: Arc<Pool>,
    /// The open scopes (`scope.rs`).
    pub(crate) scopes: Mutex<rustc_hash::FxHashMap<ScopeId, Arc<ScopeLife>>>,
    /// The highest scope id opened.
    pub(crate) last_scope: std::sync::atomic::AtomicU64,
    pub(crate) local: Option<Arc<Mutex<LocalWorkers>>>,
    /// Per worker, the callables it offers.
    pub(crate) offers: Vec<rustc_hash::FxHashSet<KernelHandle>>,
    /// Per worker, what tasks placed there may use
    /// ([`WorkerInfo::capabilities`]).
    pub(crate) capabilities: Vec<strata_proto::convert::Capabilities>,
    /// Per worker, its path and the id descriptors of its buffers carry.
    pub(crate) owners: Vec<crate::paths::WorkerPath>,
    /// Per worker, whether it is up and how many times it was lost.
    pub(crate) lives: Vec<std::sync::Arc<Life>>,
    /// The retry policy ([`crate::ClusterBuilder::retry`]).
    pub(crate) retries: u32,
    /// Bounds the tasks submitted and not finished.
    pub(crate) gate: std::sync::Arc<strata_orchestrator_core::Gate>,
    /// The next task id; held while a submit is handed to the DAG actor,
    /// so that ids reach it in increasing order.
    pub(crate) next_id: std::sync::Mutex<u64>,
    /// The current run: run buffers of earlier runs are refused.
    pub(crate) run: std::sync::atomic::AtomicU64,
    /// Per worker, whether this run allocated run buffers there (only
    /// those workers are told when the run ends).
    pub(crate) run_used: Vec<std::sync::atomic::AtomicBool>,
    /// Per worker, the node itself when it runs in this process.
    pub(crate) in_process: Vec<Option<strata_worker_node::InProcessWorker>>,
    /// The request of a `wait_all_while` that was given up, for the next
    /// wait of the run to take over: a second request would split the
    /// run's answer between them (the first, unheard, would take it).
    pub(crate) pending_all: Mutex<Option<WaitAllReply>>,
}

/// The DAG actor's answer to a `wait_all`.
type WaitAllReply = oneshot::Receiver<Result<RunSummary, crate::error::RunError>>;

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

/// One version of a callable, as the workers offer it.
#[derive(Debug, Clone)]
pub(crate) struct Offered {
    pub(crate) version: u32,
    pub(crate) handle: KernelHandle,
    /// `name@version`, shared by every task that names it (no string is
    /// built per submit).
    pub(crate) qualified: Arc<str>,
    /// Its signature.
    pub(crate) signature: Signature,
}

impl Cluster {
    /// The worker node of `worker`, when it runs in this process
    /// ([`crate::ClusterBuilder::in_process`]): its figures, and `halt`/`resume`
    /// to see how a job rides out a lost worker.
    pub fn in_process_worker(
        &self,
        worker: WorkerId,
    ) -> Option<&strata_worker_node::InProcessWorker> {
        self.in_process.get(worker.0 as usize)?.as_ref()
    }

    /// The workers, by id.
    pub fn workers(&self) -> &[WorkerInfo] {
        &self.workers
    }

    /// The process id of `worker` now, when this cluster spawned it (a
    /// respawned worker has a new one; [`WorkerInfo::pid`] is the first).
    pub fn worker_pid(&self, worker: WorkerId) -> Option<u32> {
        self.lives.get(worker.0 as usize).and_then(|l| l.pid())
    }

    /// Whether `worker` is up: connected and taking tasks. A lost worker
    /// the cluster connected to (not one it spawned) is dialed again and
    /// is up once more when it answers: a restarted process on the same
    /// address, or the same one after a cut connection heals.
    pub fn is_up(&self, worker: WorkerId) -> bool {
        self.lives.get(worker.0 as usize).is_some_and(|l| l.is_up())
    }

    /// Waits up to `limit` for `worker` to be up.
    ///
    /// # Errors
    /// [`Error::Worker`] when it is not up in time, or there is no such
    /// worker.
    pub fn wait_up(&self, worker: WorkerId, limit: Duration) -> Result<(), Error> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if self.is_up(worker) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::Worker {
                    worker,
                    error: LinkError::TimedOut(format!("not up within {limit:?}")),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Cmd) -> Result<T, Error> {
        not_async()?;
        let (tx, rx) = oneshot::channel();
        self.cmds
            .blocking_send(make(tx))
            .map_err(|_| Error::Closed)?;
        rx.blocking_recv().map_err(|_| Error::Closed)
    }

    /// Sends `cmd` to the DAG actor, awaiting no answer.
    fn tell(&self, cmd: Cmd) -> Result<(), Error> {
        not_async()?;
        self.cmds.blocking_send(cmd).map_err(|_| Error::Closed)
    }

    fn ask_endpoint<T>(
        &self,
        worker: WorkerId,
        make: impl FnOnce(oneshot::Sender<Result<T, LinkError>>) -> EpCmd,
    ) -> Result<T, Error> {
        not_async()?;
        let ep = self
            .endpoints
            .get(worker.0 as usize)
            .ok_or(SubmitError::NoWorker { worker })?;
        let (tx, rx) = oneshot::channel();
        ep.blocking_send(make(tx)).map_err(|_| Error::Closed)?;
        rx.blocking_recv()
            .map_err(|_| Error::Closed)?
            .map_err(|error| Error::Worker { worker, error })
    }

    /// A zeroed host buffer of `nbytes`, readable and writable by tasks.
    ///
    /// # Errors
    /// [`Error::Buffer`] when the memfd cannot be made.
    pub fn buffer(&self, nbytes: u64) -> Result<Buffer, Error> {
        self.buffer_with(nbytes, Access::ReadWrite)
    }

    /// A zeroed host buffer granting tasks `access` only.
    ///
    /// # Errors
    /// As [`Cluster::buffer`].
    pub fn buffer_with(&self, nbytes: u64, access: Access) -> Result<Buffer, Error> {
        let identity = self.mint.mint().map_err(BufferError::Identity)?;
        Ok(Buffer::host(HostShared::create(
            identity,
            nbytes,
            access,
            self.released.clone(),
        )?))
    }

    /// A host buffer over the POSIX shared-memory object `name` (as
    /// `shm_open("/name")` names it), for interop with programs that share
    /// memory that way: the object is opened when it exists (it must hold
    /// at least `nbytes`; its first `nbytes` are the buffer) and created
    /// zeroed at `nbytes`, mode 0600, when it does not (then its name is
    /// unlinked when the buffer is released; an object that existed is
    /// left to its owner). Tasks on it run as on any host buffer: local
    /// workers get its fd and copy the bytes each task uses in and its
    /// writes out (never mapping it: its owner may shrink it at any time,
    /// which fails the tasks that use it and nothing else); remote workers
    /// get its bytes with each task. The driver maps it, so shrinking it
    /// while this program reads or writes it crashes this program, as it
    /// would any program that maps it.
    ///
    /// # Errors
    /// [`Error::Buffer`]: a name that is not 1–32 printable ASCII bytes
    /// without `/`, zero bytes, an object smaller than `nbytes`, or what
    /// the system refused (named with its step).
    pub fn posix_buffer(&self, name: &str, nbytes: u64) -> Result<Buffer, Error> {
        let identity = self.mint.mint().map_err(BufferError::Identity)?;
        let mem = std::sync::Arc::new(crate::buffer::Memfd::open_posix(name, nbytes)?);
        Ok(Buffer::host(HostShared::over(
            identity,
            mem,
            Access::ReadWrite,
            None,
            self.released.clone(),
        )?))
    }

    /// A host buffer holding a copy of `bytes`.
    ///
    /// # Errors
    /// As [`Cluster::buffer`].
    pub fn buffer_from_bytes(&self, bytes: &[u8]) -> Result<Buffer, Error> {
        let b = self.buffer(bytes.len() as u64)?;
        b.write_bytes(0, bytes)?;
        Ok(b)
    }

    /// A host buffer holding a copy of `values`.
    ///
    /// # Errors
    /// As [`Cluster::buffer`].
    pub fn buffer_from_slice<T: strata_chip_runtime::kernel::Pod>(
        &self,
        values: &[T],
    ) -> Result<Buffer, Error> {
        self.buffer_from_bytes(crate::mapping::as_bytes(values))
    }

    /// A worker's counters (device statistics included).
    ///
    /// # Errors
    /// An unknown or lost worker.
    pub fn worker_stats(&self, worker: WorkerId) -> Result<WorkerStats, Error> {
        self.ask_endpoint(worker, |reply| EpCmd::Stats { reply })
    }

    /// Waits for one task.
    ///
    /// # Errors
    /// [`Error::Run`] when it did not succeed (failed, skipped because a
    /// producer failed, or cancelled), naming task, callable, worker and
    /// cause.
    pub fn wait(&self, task: TaskHandle) -> Result<(), Error> {
        Ok(self.ask(|reply| Cmd::Wait {
            task: task.0,
            reply,
        })??)
    }

    /// As [`Cluster::wait`], giving up after `limit`: `Ok(true)` once the
    /// task succeeded, `Ok(false)` while it is unfinished (a poll, with
    /// `Duration::ZERO`). An abandoned request is answered into nothing
    /// when the task finishes; to wait long, use [`Cluster::wait_while`].
    ///
    /// # Errors
    /// As [`Cluster::wait`].
    pub fn wait_timeout(&self, task: TaskHandle, limit: Duration) -> Result<bool, Error> {
        match self.ask_within(limit, |reply| Cmd::Wait {
            task: task.0,
            reply,
        })? {
            Some(r) => r.map(|()| true).map_err(Error::from),
            None => Ok(false),
        }
    }

    /// As [`Cluster::wait`], calling `keep_waiting` every `slice` while
    /// the task is unfinished: for drivers that must stay responsive while
    /// they wait (an interpreter checking for Ctrl-C). When it returns
    /// `false` the wait is given up: `Ok(false)`.
    ///
    /// # Errors
    /// As [`Cluster::wait`].
    pub fn wait_while(
        &self,
        task: TaskHandle,
        slice: Duration,
        keep_waiting: impl FnMut() -> bool,
    ) -> Result<bool, Error> {
        let make = |reply| Cmd::Wait {
            task: task.0,
            reply,
        };
        match self.ask_while(slice, keep_waiting, make)? {
            Some(r) => r.map(|()| true).map_err(Error::from),
            None => Ok(false),
        }
    }

    /// As [`Cluster::wait_all`], calling `keep_waiting` every `slice`
    /// while tasks are unfinished: for drivers that must stay responsive
    /// while they wait (an interpreter checking for Ctrl-C). When it
    /// returns `false` the wait is given up and `Ok(None)` returned; the
    /// run goes on, and the next `wait_all` or `wait_all_while` takes the
    /// same request over, so the run's answer is not lost.
    ///
    /// # Errors
    /// As [`Cluster::wait_all`].
    pub fn wait_all_while(
        &self,
        slice: Duration,
        mut keep_waiting: impl FnMut() -> bool,
    ) -> Result<Option<RunSummary>, Error> {
        let runtime = self.runtime.as_ref().ok_or(Error::Closed)?;
        let mut rx = self.wait_all_request()?;
        loop {
            match runtime.block_on(async { tokio::time::timeout(slice, &mut rx).await }) {
                Ok(reply) => {
                    let summary = reply.map_err(|_| Error::Closed)?;
                    self.end_run();
                    return Ok(Some(summary?));
                }
                Err(_elapsed) if keep_waiting() => {}
                Err(_elapsed) => {
                    *self.pending_all.lock().unwrap_or_else(|e| e.into_inner()) = Some(rx);
                    return Ok(None);
                }
            }
        }
    }

    /// The run's wait-all request: one given up earlier, or a new one.
    fn wait_all_request(&self) -> Result<WaitAllReply, Error> {
        not_async()?;
        if let Some(rx) = self
            .pending_all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            return Ok(rx);
        }
        let (tx, rx) = oneshot::channel();
        self.cmds
            .blocking_send(Cmd::WaitAll { reply: tx })
            .map_err(|_| Error::Closed)?;
        Ok(rx)
    }

    /// As `ask`, calling `keep_waiting` every `slice` until the reply
    /// comes (`Some`) or it returns `false` (`None`: the request stays with
    /// the actor, whose late reply goes nowhere).
    fn ask_while<T>(
        &self,
        slice: Duration,
        mut keep_waiting: impl FnMut() -> bool,
        make: impl FnOnce(oneshot::Sender<T>) -> Cmd,
    ) -> Result<Option<T>, Error> {
        not_async()?;
        let runtime = self.runtime.as_ref().ok_or(Error::Closed)?;
        let (tx, mut rx) = oneshot::channel();
        self.cmds
            .blocking_send(make(tx))
            .map_err(|_| Error::Closed)?;
        loop {
            match runtime.block_on(async { tokio::time::timeout(slice, &mut rx).await }) {
                Ok(reply) => return reply.map(Some).map_err(|_| Error::Closed),
                Err(_elapsed) if keep_waiting() => {}
                Err(_elapsed) => return Ok(None),
            }
        }
    }

    /// As `ask`, giving up on the reply after `limit` (`None`). The
    /// request stays with the actor, whose late reply goes nowhere.
    fn ask_within<T>(
        &self,
        limit: Duration,
        make: impl FnOnce(oneshot::Sender<T>) -> Cmd,
    ) -> Result<Option<T>, Error> {
        not_async()?;
        let runtime = self.runtime.as_ref().ok_or(Error::Closed)?;
        let (tx, rx) = oneshot::channel();
        self.cmds
            .blocking_send(make(tx))
            .map_err(|_| Error::Closed)?;
        match runtime.block_on(async move { tokio::time::timeout(limit, rx).await }) {
            Ok(reply) => reply.map(Some).map_err(|_| Error::Closed),
            Err(_elapsed) => Ok(None),
        }
    }

    /// Waits until every submitted task is finished and returns the run's
    /// figures; the next call starts a new run. The run's run buffers
    /// ([`Cluster::run_buffer`]) end with it, whether the run succeeded or
    /// not: their handles are refused from now on, and each worker they
    /// lived on retires them (and resets its run region once no other
    /// session holds run buffers there).
    ///
    /// # Errors
    /// [`Error::Run`] with the first task failure of the run.
    pub fn wait_all(&self) -> Result<RunSummary, Error> {
        let summary = self
            .wait_all_request()?
            .blocking_recv()
            .map_err(|_| Error::Closed)?;
        self.end_run();
        Ok(summary?)
    }

    /// Ends the current run: refuses its run buffers here at once, then
    /// tells the workers that hold some. A worker that cannot be told (lost)
    /// has ended the session, which retires them anyway.
    fn end_run(&self) {
        let ended = self.run.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        for (i, used) in self.run_used.iter().enumerate() {
            if !used.swap(false, std::sync::atomic::Ordering::AcqRel) {
                continue;
            }
            let Ok(worker) = u32::try_from(i).map(WorkerId) else {
                continue;
            };
            match self.ask_endpoint(worker, |reply| EpCmd::EndRun { reply }) {
                Ok(end) => tracing::debug!(
                    %worker,
                    run = ended,
                    retired = end.retired,
                    reset = end.reset,
                    "run ended"
                ),
                Err(e) => {
                    tracing::debug!(%worker, run = ended, error = %e, "run end not delivered")
                }
            }
        }
    }

    /// Cancels a task that has not started; its consumers are skipped.
    ///
    /// # Errors
    /// When it is running, finished or unknown.
    pub fn cancel(&self, task: TaskHandle) -> Result<(), Error> {
        self.ask(|reply| Cmd::Cancel {
            task: task.0,
            reply,
        })?
    }

    /// Figures since the cluster started.
    ///
    /// # Errors
    /// [`Error::Closed`].
    pub fn totals(&self) -> Result<RunSummary, Error> {
        self.ask(|reply| Cmd::Totals { reply })
    }

    /// The tasks finished since the last call (or since the start), with
    /// where and when they ran; `None` unless the cluster was built with
    /// [`crate::ClusterBuilder::trace`].
    ///
    /// # Errors
    /// [`Error::Closed`].
    pub fn take_trace(&self) -> Result<Option<Trace>, Error> {
        self.ask(|reply| Cmd::TakeTrace { reply })
    }

    /// Waits for every task, then stops the actors and the workers this
    /// cluster spawned.
    ///
    /// # Errors
    /// The run's first task failure (the cluster is stopped anyway).
    pub fn shutdown(mut self) -> Result<RunSummary, Error> {
        let r = self.wait_all();
        self.stop();
        r
    }

    /// Stops the actors (closing every session), the runtime, then the
    /// spawned workers.
    fn stop(&mut self) {
        self.gate.close();
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Dropped inside an async runtime, where blocking is not
            // allowed: stop from a plain thread.
            let local = self.local.take();
            let cmds = self.cmds.clone();
            std::thread::scope(|s| {
                s.spawn(move || stop(runtime, &cmds, local));
            });
            return;
        }
        stop(runtime, &self.cmds, self.local.take());
    }
}

/// Refuses blocking calls made inside an async runtime (they would
/// stall or panic it).
fn not_async() -> Result<(), Error> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(ClusterError::InsideAsync.into());
    }
    Ok(())
}

/// The shutdown protocol: the DAG actor stops every endpoint (each closes
/// its task stream and fd channel, ending its worker session), then the
/// runtime stops, then spawned workers get SIGTERM (SIGKILL after 2 s) and
/// are reaped.
fn stop(runtime: Runtime, cmds: &mpsc::Sender<Cmd>, local: Option<Arc<Mutex<LocalWorkers>>>) {
    tracing::info!("cluster stopping");
    let (tx, rx) = oneshot::channel();
    let cmds = cmds.clone();
    runtime.block_on(async move {
        if cmds.send(Cmd::Shutdown { reply: tx }).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(3), rx).await;
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    if let Some(lw) = local {
        lw.lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown(Duration::from_secs(2));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
