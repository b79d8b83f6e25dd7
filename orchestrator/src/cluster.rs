//! [`Cluster`]: the driver API. It starts (or connects to) workers, runs
//! the orchestrator's actors on its own tokio runtime, and offers
//! blocking calls to create buffers, submit tasks and wait for them.
//!
//! Call it from ordinary threads, not from inside an async runtime (its
//! calls block on the actors' replies).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_chip::KernelHandle;
use strata_core::{Placement, ScopeId, TaskId, WorkerId};
use strata_proto::convert::WorkerStats;
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing as WireBacking, BufferDescriptor, IdentityMint,
};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

use crate::RunSummary;
use crate::actors::endpoint::Life;
use crate::actors::{ArgRef, Cmd, EpCmd, MemberSpec, TaskSpec};
use crate::buffer::{Backing, Buffer, DeviceShared, HostShared, Released};
use crate::error::{BufferError, ClusterError, Error, SubmitError};
use crate::link::LinkError;
use crate::link::WorkerInfo;
use crate::local::LocalWorkers;
use crate::task::{Task, TaskHandle};
use crate::trace::Trace;

/// A scope: buffers registered in it are released once it has ended and
/// no unfinished task uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope(ScopeId);

/// A set of workers and the orchestrator driving them.
pub struct Cluster {
    pub(crate) runtime: Option<Runtime>,
    pub(crate) cmds: mpsc::Sender<Cmd>,
    pub(crate) endpoints: Vec<mpsc::Sender<EpCmd>>,
    pub(crate) workers: Vec<WorkerInfo>,
    /// Callable name → (version, handle, canonical descriptor), highest
    /// version last.
    pub(crate) callables: BTreeMap<String, Vec<(u32, KernelHandle, String)>>,
    pub(crate) mint: IdentityMint,
    pub(crate) released: mpsc::UnboundedSender<Released>,
    pub(crate) local: Option<Arc<Mutex<LocalWorkers>>>,
    /// Per worker, the callables it offers.
    pub(crate) offers: Vec<std::collections::HashSet<KernelHandle>>,
    /// Per worker, whether it is up and how many times it was lost.
    pub(crate) lives: Vec<std::sync::Arc<Life>>,
    /// The retry policy ([`crate::ClusterBuilder::retry`]).
    pub(crate) retries: u32,
    /// Bounds the tasks submitted and not finished.
    pub(crate) gate: std::sync::Arc<strata_core::Gate>,
    /// The next task id; held while a submit is handed to the DAG actor,
    /// so that ids reach it in increasing order.
    pub(crate) next_id: std::sync::Mutex<u64>,
    /// The current run: run buffers of earlier runs are refused.
    pub(crate) run: std::sync::atomic::AtomicU64,
    /// Per worker, whether this run allocated run buffers there (only
    /// those workers are told when the run ends).
    pub(crate) run_used: Vec<std::sync::atomic::AtomicBool>,
    /// Per worker, the node itself when it runs in this process.
    pub(crate) in_process: Vec<Option<strata_worker::InProcessWorker>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// The worker node of `worker`, when it runs in this process
    /// ([`crate::ClusterBuilder::in_process`]): its figures, and `halt`/`resume`
    /// to see how a job rides out a lost worker.
    pub fn in_process_worker(&self, worker: WorkerId) -> Option<&strata_worker::InProcessWorker> {
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
    pub fn buffer_from_slice<T: strata_chip::kernel::Pod>(
        &self,
        values: &[T],
    ) -> Result<Buffer, Error> {
        self.buffer_from_bytes(crate::mapping::as_bytes(values))
    }

    /// A device buffer of `nbytes` in `worker`'s device memory (persistent
    /// region). Tasks that use it run on that worker.
    ///
    /// # Errors
    /// An unknown worker, or the worker's refusal (out of memory names the
    /// region).
    pub fn device_buffer(&self, worker: WorkerId, nbytes: u64) -> Result<Buffer, Error> {
        self.device_alloc(worker, nbytes, None)
    }

    /// A device buffer of `nbytes` in `worker`'s *run* region, which lives
    /// until the current run ends: the next [`Cluster::wait_all`] (or the
    /// cluster's shutdown). The worker then reclaims the whole run region
    /// at once — no per-buffer free, no fragmentation — and the buffer is
    /// refused from then on, by the driver at once ([`Error::Buffer`] or
    /// [`Error::Submit`] naming the run) and by the worker as a backstop.
    /// For intermediates of one job; keep data that outlives it in
    /// [`Cluster::device_buffer`].
    ///
    /// # Errors
    /// As [`Cluster::device_buffer`] (out of memory names the run region).
    pub fn run_buffer(&self, worker: WorkerId, nbytes: u64) -> Result<Buffer, Error> {
        let run = self.run.load(std::sync::atomic::Ordering::Acquire);
        if let Some(used) = self.run_used.get(worker.0 as usize) {
            used.store(true, std::sync::atomic::Ordering::Release);
        }
        self.device_alloc(worker, nbytes, Some(run))
    }

    /// The number of the current run: 0 at the start, one more after each
    /// [`Cluster::wait_all`].
    pub fn current_run(&self) -> u64 {
        self.run.load(std::sync::atomic::Ordering::Acquire)
    }

    fn device_alloc(
        &self,
        worker: WorkerId,
        nbytes: u64,
        run: Option<u64>,
    ) -> Result<Buffer, Error> {
        let incarnation = self
            .lives
            .get(worker.0 as usize)
            .ok_or(SubmitError::NoWorker { worker })?
            .incarnation();
        let identity = self.mint.mint().map_err(BufferError::Identity)?;
        let region = match run {
            Some(_) => strata_chip::Region::Run,
            None => strata_chip::Region::Persistent,
        };
        let addr = self.ask_endpoint(worker, |reply| EpCmd::DeviceAlloc {
            identity,
            nbytes,
            region,
            reply,
        })?;
        let addr = std::num::NonZeroU64::new(addr).ok_or_else(|| Error::Worker {
            worker,
            error: LinkError::Internal("device address 0".into()),
        })?;
        let desc = BufferDescriptor::new(
            identity,
            nbytes,
            AddressSpace::Device,
            Access::ReadWrite,
            WireBacking::DeviceMalloc { addr },
        )
        .map_err(BufferError::Descriptor)?;
        Ok(Buffer::device(DeviceShared {
            desc,
            worker,
            incarnation,
            run,
            notify: self.released.clone(),
        }))
    }

    fn device_of(&self, buffer: &Buffer) -> Result<WorkerId, Error> {
        match &buffer.backing {
            Backing::Device(d) => {
                self.check_alive(d)?;
                Ok(d.worker)
            }
            Backing::Host(_) => Err(BufferError::OnHost {
                buffer: buffer.identity(),
            }
            .into()),
        }
    }

    /// Refuses a device buffer whose worker was lost since it was
    /// allocated (its contents went with the worker), and a run buffer
    /// whose run has ended (its memory went with the run).
    fn check_alive(&self, d: &DeviceShared) -> Result<(), BufferError> {
        let current = self.current_run();
        if let Some(run) = d.run.filter(|r| *r != current) {
            return Err(BufferError::RunEnded {
                buffer: *d.desc.identity(),
                worker: d.worker,
                run,
                current,
            });
        }
        let now = self
            .lives
            .get(d.worker.0 as usize)
            .map_or(u64::MAX, |l| l.incarnation());
        if now == d.incarnation {
            Ok(())
        } else {
            Err(BufferError::WorkerLost {
                buffer: *d.desc.identity(),
                worker: d.worker,
            })
        }
    }

    /// Writes `data` at `offset` of a device buffer. Order it against
    /// tasks yourself (write before submitting readers; wait for writers).
    ///
    /// # Errors
    /// A host buffer, or the worker's refusal.
    pub fn write_device(&self, buffer: &Buffer, offset: u64, data: &[u8]) -> Result<(), Error> {
        let worker = self.device_of(buffer)?;
        let identity = buffer.identity();
        let data = data.to_vec();
        self.ask_endpoint(worker, |reply| EpCmd::CopyToDevice {
            identity,
            offset,
            data,
            reply,
        })
    }

    /// Reads `len` bytes at `offset` of a device buffer.
    ///
    /// # Errors
    /// A host buffer, or the worker's refusal.
    pub fn read_device(&self, buffer: &Buffer, offset: u64, len: u64) -> Result<Vec<u8>, Error> {
        let worker = self.device_of(buffer)?;
        let identity = buffer.identity();
        self.ask_endpoint(worker, |reply| EpCmd::CopyFromDevice {
            identity,
            offset,
            len,
            reply,
        })
    }

    /// A worker's counters (device statistics included).
    ///
    /// # Errors
    /// An unknown or lost worker.
    pub fn worker_stats(&self, worker: WorkerId) -> Result<WorkerStats, Error> {
        self.ask_endpoint(worker, |reply| EpCmd::Stats { reply })
    }

    /// The canonical descriptor of `name` or `name@version` as the workers
    /// reported it (`name@version(arg:ACCESS:dtypes:rank,…;scalar:kind,…)`).
    ///
    /// # Errors
    /// [`Error::Submit`] for an unknown callable or version.
    pub fn callable_signature(&self, callable: &str) -> Result<String, Error> {
        self.resolve_full(callable).map(|(_, _, sig)| sig)
    }

    /// The handle of `name` or `name@version`, and its qualified name.
    fn resolve(&self, callable: &str) -> Result<(KernelHandle, String), Error> {
        self.resolve_full(callable).map(|(h, q, _)| (h, q))
    }

    fn resolve_full(&self, callable: &str) -> Result<(KernelHandle, String, String), Error> {
        let (name, version) = match callable.split_once('@') {
            Some((n, v)) => (
                n,
                Some(v.parse::<u32>().map_err(|_| SubmitError::BadVersion {
                    callable: callable.to_owned(),
                })?),
            ),
            None => (callable, None),
        };
        let versions = self
            .callables
            .get(name)
            .ok_or_else(|| SubmitError::UnknownCallable {
                name: name.to_owned(),
                offered: self.callables.keys().cloned().collect(),
            })?;
        let found = match version {
            Some(v) => versions.iter().find(|(ver, _, _)| *ver == v),
            None => versions.last(),
        };
        let (v, h, sig) = found.ok_or_else(|| SubmitError::UnknownVersion {
            name: name.to_owned(),
            version: version.unwrap_or(0),
            offered: versions.iter().map(|(v, _, _)| *v).collect(),
        })?;
        Ok((*h, format!("{name}@{v}"), sig.clone()))
    }

    fn member(&self, task: Task) -> Result<(MemberSpec, Vec<TaskId>), Error> {
        let (callable, name) = self.resolve(&task.callable)?;
        let mut device_on: Option<(usize, WorkerId)> = None;
        let mut device_buffers = Vec::new();
        let mut args = Vec::with_capacity(task.args.len());
        for (i, (view, tag)) in task.args.into_iter().enumerate() {
            if let Backing::Device(d) = &view.buffer.backing {
                self.check_alive(d)
                    .map_err(|source| SubmitError::DeadArgument {
                        callable: name.clone(),
                        arg: i,
                        source: Box::new(source),
                    })?;
                device_buffers.push(*d.desc.identity());
                match device_on {
                    Some((j, w)) if w != d.worker => {
                        return Err(SubmitError::DevicesDiffer {
                            callable: name,
                            first: j,
                            first_worker: w,
                            second: i,
                            second_worker: d.worker,
                        }
                        .into());
                    }
                    _ => device_on = Some((i, d.worker)),
                }
            }
            args.push(ArgRef {
                tensor: view.tensor,
                tag,
                backing: view.buffer.backing,
            });
        }
        let placement = match (task.on, device_on) {
            (Some(w), Some((i, d))) if w != d => {
                return Err(SubmitError::PlacedAway {
                    callable: name,
                    placed: w,
                    arg: i,
                    device: d,
                }
                .into());
            }
            (Some(w), _) | (None, Some((_, w))) => Placement::On(w),
            (None, None) => Placement::Any,
        };
        Ok((
            MemberSpec {
                callable,
                name,
                args: args.into(),
                scalars: task.scalars.into(),
                placement,
                device_buffers,
            },
            task.after,
        ))
    }

    /// Checks a task where it is submitted — the DAG's submit-time rules
    /// and its placement against the workers' callables — numbers it and
    /// hands it to the DAG actor without waiting for an answer.
    fn submit_spec(
        &self,
        spec: TaskSpec,
        after: Vec<TaskId>,
        retries: u32,
    ) -> Result<TaskHandle, Error> {
        not_async()?;
        self.check_placement(&spec)?;
        self.gate.enter().map_err(|_| Error::Closed)?;
        let r = self.submit_entered(spec, after, retries);
        if r.is_err() {
            self.gate.leave(1);
        }
        r
    }

    /// [`Cluster::submit_spec`] once the task holds its place in the gate:
    /// the one place a task becomes what the engine takes. Its DAG view is
    /// built and checked here, once ([`strata_core::Dag::check`]); the DAG
    /// actor inserts the checked task as it is.
    fn submit_entered(
        &self,
        spec: TaskSpec,
        after: Vec<TaskId>,
        retries: u32,
    ) -> Result<TaskHandle, Error> {
        let mut next = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
        let id = TaskId(*next);
        let task = strata_core::dag::NewTask {
            id,
            members: spec
                .members
                .iter()
                .map(|m| {
                    m.args
                        .iter()
                        .map(|a| strata_core::dag::Arg {
                            tensor: a.tensor,
                            tag: a.tag,
                        })
                        .collect()
                })
                .collect(),
            scalars: spec.members.iter().map(|m| m.scalars.len()).collect(),
            after,
        };
        let task = strata_core::Dag::check(task).map_err(SubmitError::Rejected)?;
        let submission = strata_core::Submission {
            task,
            members: spec
                .members
                .iter()
                .map(|m| strata_core::sched::MemberInfo {
                    callable: m.callable,
                    placement: m.placement,
                    device_buffers: m.device_buffers.clone(),
                })
                .collect(),
            retries,
        };
        self.cmds
            .blocking_send(Cmd::Submit { spec, submission })
            .map_err(|_| Error::Closed)?;
        *next += 1;
        Ok(TaskHandle(id))
    }

    /// The scheduler's placement rules, checked against the callables each
    /// worker reported at the start.
    fn check_placement(&self, spec: &TaskSpec) -> Result<(), Error> {
        let mut named = std::collections::HashSet::new();
        for (m, member) in spec.members.iter().enumerate() {
            match member.placement {
                Placement::On(w) => {
                    let offers = self.offers.get(w.0 as usize).ok_or_else(|| {
                        SubmitError::UnknownPlacement {
                            callable: member.name.clone(),
                            member: m,
                            worker: w,
                            workers: self.offers.len(),
                        }
                    })?;
                    if !offers.contains(&member.callable) {
                        return Err(SubmitError::NotRegistered {
                            member: m,
                            callable: member.name.clone(),
                            worker: w,
                        }
                        .into());
                    }
                    if !named.insert(w) {
                        return Err(SubmitError::WorkerTaken {
                            member: m,
                            worker: w,
                        }
                        .into());
                    }
                }
                Placement::Any => {
                    if !self.offers.iter().any(|o| o.contains(&member.callable)) {
                        return Err(SubmitError::NotOffered {
                            member: m,
                            callable: member.name.clone(),
                        }
                        .into());
                    }
                }
            }
        }
        if spec.members.len() > self.offers.len() {
            return Err(SubmitError::GroupTooLarge {
                members: spec.members.len(),
                workers: self.offers.len(),
            }
            .into());
        }
        Ok(())
    }

    /// Submits a task. Its dependencies on earlier tasks are inferred from
    /// the bytes its arguments read and write (plus its `after` edges).
    ///
    /// # Errors
    /// [`Error::Submit`] when it is refused (unknown callable, grant
    /// mismatch, arguments of the task overlapping where one is written,
    /// placement that cannot work); nothing is queued then.
    pub fn submit(&self, task: Task) -> Result<TaskHandle, Error> {
        let (member, after) = self.member(task)?;
        let rerunnable = member.placement == Placement::Any
            && member.device_buffers.is_empty()
            && member.args.iter().all(|a| {
                matches!(
                    a.tag,
                    ArgTag::Input | ArgTag::Output | ArgTag::OutputExisting
                )
            });
        let retries = if rerunnable { self.retries } else { 0 };
        self.submit_spec(
            TaskSpec {
                members: vec![member],
            },
            after,
            retries,
        )
    }

    /// Submits a group: one member per worker, launched all-or-nothing
    /// (for members that wait for each other). `after` edges of every
    /// member apply to the group.
    ///
    /// # Errors
    /// As [`Cluster::submit`].
    pub fn submit_group(&self, members: Vec<Task>) -> Result<TaskHandle, Error> {
        let mut specs = Vec::with_capacity(members.len());
        let mut after = Vec::new();
        for t in members {
            let (m, a) = self.member(t)?;
            specs.push(m);
            after.extend(a);
        }
        after.sort_unstable();
        after.dedup();
        self.submit_spec(TaskSpec { members: specs }, after, 0)
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
        let summary = self.ask(|reply| Cmd::WaitAll { reply })?;
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

    /// Opens a scope.
    ///
    /// # Errors
    /// [`Error::Closed`].
    pub fn open_scope(&self) -> Result<Scope, Error> {
        self.ask(|reply| Cmd::OpenScope { reply }).map(Scope)
    }

    /// Registers `buffer` in `scope`: the scope holds it until the scope
    /// has ended and no unfinished task uses it.
    ///
    /// # Errors
    /// An unknown or ended scope.
    pub fn scope_buffer(&self, scope: Scope, buffer: &Buffer) -> Result<(), Error> {
        let buffer = buffer.clone();
        self.ask(|reply| Cmd::ScopeBuffer {
            scope: scope.0,
            buffer,
            reply,
        })?
    }

    /// Ends `scope`.
    ///
    /// # Errors
    /// An unknown or ended scope.
    pub fn end_scope(&self, scope: Scope) -> Result<(), Error> {
        self.ask(|reply| Cmd::EndScope {
            scope: scope.0,
            reply,
        })?
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
