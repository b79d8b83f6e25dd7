//! The DAG/scheduler actor: owns the [`Engine`] (dependency inference and
//! scheduling), the records of unfinished tasks (which hold their buffers
//! alive), and everyone waiting for results. It drives the engine only
//! through [`Engine::on_event`], the door the differential simulator uses
//! too, and carries out the [`Action`]s that come back.

use rustc_hash::FxHashMap as HashMap;
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use strata_orchestrator_core::{
    Action, Directory, Engine, Event, FailureCause, FailureKind, Outcome, Refusal, TaskId, WorkerId,
};
use strata_proto::convert::CacheArg;
use strata_wire::{ArgTag, CanonicalIdentity, Footprint};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::{Cmd, DispatchItem, EpCmd, Notice, Report, TaskSpec};
use crate::buffer::Buffer;
use crate::error::{Error, RunError};
use crate::summary::RunSummary;
use crate::trace::{TaskTrace, Trace};

mod finish;
mod writeback;

/// An endpoint as the DAG actor sees it.
#[derive(Debug)]
pub(crate) struct EndpointRef {
    pub(crate) tx: mpsc::Sender<EpCmd>,
    pub(crate) name: String,
    /// Times the worker came back after a loss, as this actor has heard.
    pub(crate) rejoins: u64,
    /// Whether its chip keeps copies of host bytes between tasks (a staged
    /// chip): only its tasks carry cache entries.
    pub(crate) caches: bool,
    /// Whether the bytes its tasks write may stay on its chip until needed
    /// (a caching chip that maps host buffers, with deferred write-back:
    /// [`writeback`]).
    pub(crate) keeps_dirty: bool,
    /// Its device kind for the performance models: a hash of its device
    /// spec (chips with one spec share a history).
    pub(crate) kind: u64,
}

struct Record {
    spec: TaskSpec,
    /// Per member (inline for one: a task's record is one allocation
    /// fewer per member field).
    members: SmallVec<[MemberState; 1]>,
    waiters: Vec<oneshot::Sender<Result<(), RunError>>>,
    /// When it was submitted, when tracing (the clock is read for the
    /// trace alone).
    submitted: Option<Instant>,
    edges: Vec<(TaskId, u8)>,
    /// Byte sets of buffers the driver touches directly that this task
    /// counts as live ([`DagActor::live_exposed`]); empty (no allocation)
    /// for most tasks.
    exposed: Vec<Footprint>,
}

/// A member of a task as the DAG actor knows it.
#[derive(Debug, Default, Clone, Copy)]
struct MemberState {
    /// The worker it was dispatched to.
    worker: Option<WorkerId>,
    /// When it was dispatched, when tracing.
    dispatched: Option<Instant>,
    /// What its endpoint reported.
    report: Option<Report>,
}

pub(crate) struct DagActor {
    engine: Engine,
    /// Where the performance models are kept across runs.
    models_path: Option<std::path::PathBuf>,
    endpoints: Vec<EndpointRef>,
    next_id: u64,
    records: strata_orchestrator_core::SeqMap<TaskId, Box<Record>>,
    /// Outcomes of finished tasks that did not succeed (for late waits).
    failed: HashMap<TaskId, RunError>,
    all_waiters: Vec<oneshot::Sender<Result<RunSummary, RunError>>>,
    /// This run (since the last `wait_all`): counts and the first error.
    run: RunSummary,
    first_error: Option<RunError>,
    /// Everything since the start.
    totals: RunSummary,
    /// Buffers held by open or ending scopes.
    scoped: HashMap<CanonicalIdentity, Buffer>,
    /// Finished tasks, when tracing; times from `origin`.
    trace: Option<Vec<TaskTrace>>,
    origin: Instant,
    /// Bounds the tasks submitted and not finished; left once per task.
    gate: std::sync::Arc<strata_orchestrator_core::Gate>,
    /// The arguments (and so the buffers) of tasks lost without a fence,
    /// held until the quarantine lifts: a task's bytes stay reserved until
    /// it has definitively ended on its worker.
    quarantined: HashMap<TaskId, Vec<std::sync::Arc<[super::ArgRef]>>>,
    /// What to do with work that waits on quarantined bytes.
    policy: crate::policy::Quarantine,
    /// Losses waiting for their fence, with the moment they are given up on.
    deadlines: Vec<(Instant, WorkerId, u64)>,
    /// Members dispatched and not yet sent, by worker: every message
    /// waiting for the actor is taken before they go, so a step's
    /// dispatches to one worker travel as one batch.
    pending: Vec<Vec<DispatchItem>>,
    /// Members in `pending`.
    pending_n: usize,
    /// The engine's actions for the message at hand: one buffer, reused.
    actions: Vec<Action>,
    /// Versions of the bytes workers' device caches hold; `None` when the
    /// cluster keeps no copies on chips.
    directory: Option<Directory>,
    /// Per dispatched member: the versions its writes give their bytes
    /// once it succeeds.
    writes_sent: HashMap<(TaskId, usize), Writes>,
    /// Unfinished tasks per byte set of buffers the driver touches
    /// directly: a driver may write those bytes whenever no task uses
    /// them, so when the count rises from zero the byte set's version is
    /// forgotten.
    live_exposed: HashMap<Footprint, u32>,
    /// Deferred write-back ([`writeback`]).
    wb: writeback::WriteBack,
}

/// The byte sets a member writes, with the versions it was sent with and,
/// when it keeps them on its chip, the view it writes them through.
type Writes = SmallVec<[(Footprint, u64, Option<strata_wire::Tensor>); 2]>;

/// Messages taken in one step at most before the dispatches they caused
/// are sent.
const STEP: usize = 256;

/// How long a dispatch may wait in a step for more messages to join its
/// batch: a step that has decided a dispatch ends once this has passed
/// (a stream of large submissions must not hold back the dispatches of
/// what is ready).
const STEP_HOLD: Duration = Duration::from_micros(20);

/// The scheduler's policy and its performance models' history.
pub(crate) struct Models {
    pub(crate) policy: strata_orchestrator_core::sched::Policy,
    /// Where the models are kept across runs.
    pub(crate) path: Option<std::path::PathBuf>,
    /// What that file held at the start.
    pub(crate) loaded: Vec<strata_orchestrator_core::sched::perf::Entry>,
}

impl DagActor {
    pub(crate) fn new(
        endpoints: Vec<EndpointRef>,
        tracing: bool,
        origin: Instant,
        gate: std::sync::Arc<strata_orchestrator_core::Gate>,
        policy: crate::policy::Quarantine,
        device_cache: bool,
        models: Models,
    ) -> Self {
        // Versions are kept only when some chip keeps copies.
        let caching = device_cache && endpoints.iter().any(|e| e.caches);
        let mut engine = Engine::with_policy(models.policy);
        engine.scheduler_mut().model_mut().load(&models.loaded);
        for (i, ep) in endpoints.iter().enumerate() {
            let id = WorkerId(u32::try_from(i).unwrap_or(u32::MAX));
            engine.scheduler_mut().set_kind(id, ep.kind);
        }
        DagActor {
            engine,
            models_path: models.path,
            pending: endpoints.iter().map(|_| Vec::new()).collect(),
            pending_n: 0,
            endpoints,
            next_id: 1,
            records: strata_orchestrator_core::SeqMap::default(),
            failed: HashMap::default(),
            all_waiters: Vec::new(),
            run: RunSummary::default(),
            first_error: None,
            totals: RunSummary::default(),
            scoped: HashMap::default(),
            trace: tracing.then(Vec::new),
            origin,
            gate,
            quarantined: HashMap::default(),
            policy,
            deadlines: Vec::new(),
            actions: Vec::new(),
            directory: caching.then(Directory::new),
            writes_sent: HashMap::default(),
            live_exposed: HashMap::default(),
            wb: writeback::WriteBack::default(),
        }
    }

    /// Serves until the driver asks for shutdown or goes away.
    ///
    /// One step: one message awaited, then what else is already waiting
    /// (completions first, up to [`STEP`] in all), then the dispatches all
    /// of them caused, one batch per worker. Under load that turns one
    /// channel send, one task-stream write and one wake-up of the worker
    /// per task into one per batch; a lone message is sent on at once.
    pub(crate) async fn run(
        mut self,
        mut cmds: mpsc::Receiver<Cmd>,
        mut ups: mpsc::UnboundedReceiver<Notice>,
    ) {
        let mut ups_open = true;
        'serve: loop {
            let next = self.deadlines.iter().map(|d| d.0).min();
            let first = tokio::select! {
                biased;
                () = sleep_until(next), if next.is_some() => {
                    self.flush().await;
                    self.deadline_passed();
                    None
                }
                up = ups.recv(), if ups_open => match up {
                    Some(up) => Some(Msg::Up(up)),
                    None => {
                        ups_open = false;
                        None
                    }
                },
                cmd = cmds.recv() => match cmd {
                    None => break 'serve,
                    Some(cmd) => Some(Msg::Cmd(cmd)),
                },
            };
            let mut msg = first;
            let mut taken = 0;
            let mut held_since = None;
            // A dispatch a completion made ready is the next step of a
            // chain: it waits for no submission.
            let mut chained = false;
            loop {
                // Anything but a completion or a submission first sends
                // what is pending (see `on_notice` and `on_cmd`, which
                // are not `async`: a message is handled without being
                // moved into a future).
                if msg.as_ref().is_some_and(Msg::flushes) {
                    self.flush().await;
                }
                match msg {
                    Some(Msg::Up(up)) => {
                        let before = self.pending_n;
                        self.on_notice(up);
                        chained |= self.pending_n > before;
                    }
                    Some(Msg::Cmd(Cmd::Shutdown { reply })) => {
                        self.shutdown().await;
                        self.save_models();
                        let _ = reply.send(());
                        return;
                    }
                    Some(Msg::Cmd(cmd)) => self.on_cmd(cmd),
                    None => {}
                }
                taken += 1;
                if taken == STEP {
                    break;
                }
                if self.pending_n > 0 {
                    let since = *held_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= STEP_HOLD {
                        break;
                    }
                }
                // `try_recv` takes nothing from the task's cooperative
                // budget, as `recv` does: without this, a long stream of
                // submissions would keep the actor on its thread and
                // starve the endpoints woken onto the same thread by its
                // sends (seen: the demo's first imports two times later).
                // With a dispatch pending the step ends within 20 µs (plus
                // the message at hand) without yielding.
                if self.pending_n == 0 {
                    tokio::task::coop::consume_budget().await;
                }
                // Completions first; then submissions, which join a batch
                // of new work (dispatches that submissions decided): when
                // only completions did, the throughput bench's batches
                // held 2-3 members (about 8 now), and the hold above
                // bounds what a dispatch waits for them. A batch with a
                // chain's next step goes at once instead (a chain
                // submitted as it runs waited up to the hold per hop).
                msg = match ups.try_recv() {
                    Ok(up) if ups_open => Some(Msg::Up(up)),
                    _ if chained => break,
                    _ => match cmds.try_recv() {
                        Ok(cmd) => Some(Msg::Cmd(cmd)),
                        Err(_) => break,
                    },
                };
            }
            self.flush().await;
        }
        self.flush().await;
        self.shutdown().await;
    }

    /// Sends the members dispatched since the last flush, one batch per
    /// worker.
    async fn flush(&mut self) {
        // Write-backs asked for go first: members parked on them are not
        // in the batches.
        for (worker, cmd) in std::mem::take(&mut self.wb.out) {
            let EpCmd::Flush { token, .. } = cmd else {
                continue;
            };
            let sent = match self.endpoints.get(worker.0 as usize) {
                Some(ep) => ep.tx.send(cmd).await.is_ok(),
                None => false,
            };
            if !sent {
                // Nobody will answer: what it held dirty is lost.
                debug!(%worker, "endpoint gone; its write-back fails with it");
                self.flushed(token, None);
            }
        }
        if self.pending_n == 0 {
            return;
        }
        self.pending_n = 0;
        for (i, items) in self.pending.iter_mut().enumerate() {
            if items.is_empty() {
                continue;
            }
            let items = std::mem::take(items);
            let worker = WorkerId(i as u32);
            let ep = &self.endpoints[i];
            debug!(%worker, members = items.len(), "dispatching");
            // An endpoint that stopped has reported (or will report) its
            // worker down, which fails these members in the engine.
            let dispatch = EpCmd::Dispatch {
                items,
                rejoins: ep.rejoins,
            };
            if ep.tx.send(dispatch).await.is_err() {
                debug!(%worker, "endpoint gone; its dispatches fail with it");
            }
        }
    }

    /// Stops every endpoint (each closes its task stream and fd channel)
    /// and lets go of every record: waiters see the cluster closed.
    /// Writes the performance models to their file, if they have one.
    fn save_models(&self) {
        if let Some(path) = &self.models_path {
            let entries = self.engine.scheduler().model().entries();
            if let Err(e) = crate::perf_models::save(path, entries) {
                tracing::warn!(path = %path.display(), error = %e, "cannot save the performance models");
            }
        }
    }

    async fn shutdown(&mut self) {
        self.gate.close();
        for ep in &self.endpoints {
            let (tx, rx) = oneshot::channel();
            if ep.tx.send(EpCmd::Shutdown { reply: tx }).await.is_ok() {
                let _ = rx.await;
            }
        }
        self.records.clear();
        self.scoped.clear();
        self.all_waiters.clear();
    }

    /// A message from an endpoint. What is not a completion changes a
    /// worker's state (up, lost, fenced): the caller first sent the
    /// dispatches decided before it, as they were decided, under the
    /// worker's session as it was ([`Msg::flushes`]).
    fn on_notice(&mut self, up: Notice) {
        let event = match up {
            Notice::Event(event) => event,
            Notice::Completed { event, report } => {
                // Counts a worker reported: summed saturating, so that no
                // figure of a worker's can overflow the driver's sums.
                for s in [&mut self.run, &mut self.totals] {
                    add(&mut s.sent_bytes, report.sent);
                    add(&mut s.returned_bytes, report.returned);
                    add(&mut s.staged_bytes, report.staged);
                    add(&mut s.to_device_bytes, report.to_device);
                    add(&mut s.from_device_bytes, report.from_device);
                    add(&mut s.on_chip_bytes, report.cache.device_to_device);
                    add(&mut s.prefetched_bytes, report.cache.prefetched);
                    add(&mut s.cache_hits, report.cache.hits);
                    add(&mut s.cache_misses, report.cache.misses);
                    add(&mut s.write_backs, report.cache.write_backs);
                    add(&mut s.evictions, report.cache.evictions);
                    add(&mut s.held_bytes, report.held);
                    add(&mut s.resent, u64::from(report.resent));
                }
                if let Event::Finished {
                    task,
                    member,
                    result,
                } = &event
                {
                    if result.is_ok() {
                        // The kernel's own time, without the copies around it.
                        // The report's figures are the worker's: summed
                        // without trusting them not to overflow.
                        let copies = report.copy_in_ns.saturating_add(report.copy_out_ns);
                        let kernel_ns = report.busy_ns.saturating_sub(copies);
                        let predicted = self.engine.scheduler_mut().observe(
                            *task,
                            *member,
                            kernel_ns,
                            report.to_device,
                            report.copy_in_ns,
                        );
                        if let Some(p) = predicted {
                            // `as` saturates: a prediction far off (or a
                            // worker's absurd time) pins the sums at the
                            // top instead of overflowing them.
                            let err = (p - kernel_ns as f64).abs() as u64;
                            for s in [&mut self.run, &mut self.totals] {
                                s.predicted += 1;
                                add(&mut s.predicted_measured_ns, kernel_ns);
                                add(&mut s.prediction_error_ns, err);
                            }
                        }
                    }
                    if let Some(slot) = self
                        .records
                        .get_mut(task)
                        .and_then(|r| r.members.get_mut(*member))
                    {
                        slot.report = Some(report);
                    }
                    // Before the engine answers: the tasks it releases are
                    // dispatched with the versions these writes gave.
                    self.writes_landed(*task, *member, result.is_ok());
                }
                event
            }
            Notice::Imported { bytes } => {
                self.run.fd_bytes += bytes;
                self.totals.fd_bytes += bytes;
                return;
            }
            Notice::Flushed { token, bytes } => {
                self.flushed(token, bytes);
                return;
            }
        };
        match &event {
            Event::WorkerUp { worker, .. } => {
                if let Some(ep) = self.endpoints.get_mut(worker.0 as usize) {
                    if self.engine.scheduler().knows(*worker) {
                        ep.rejoins += 1;
                    }
                }
            }
            Event::WorkerLost { worker, .. } => self.worker_lost(*worker),
            Event::Fenced { worker, epoch } => {
                debug!(%worker, epoch, "loss fenced");
                self.deadlines
                    .retain(|&(_, w, e)| (w, e) != (*worker, *epoch));
            }
            _ => {}
        }
        let lost = match &event {
            Event::WorkerLost {
                worker,
                fenced: false,
                ..
            } => Some(*worker),
            _ => None,
        };
        let mut actions = self.answer_of(event);
        // A loss without a fence: wait for the fence (up to the policy's
        // limit), or give up on it at once.
        if let Some(worker) = lost {
            let epoch = self.engine.losses(worker);
            match self.policy {
                crate::policy::Quarantine::Wait(limit) => {
                    self.deadlines.push((Instant::now() + limit, worker, epoch));
                }
                crate::policy::Quarantine::FailAtOnce => {
                    let why = format!(
                        "{} lost without a fence, and the cluster fails what waits \
                         on its bytes at once (Quarantine::FailAtOnce)",
                        self.worker_name(worker)
                    );
                    self.engine
                        .on_event_into(Event::Abandoned { worker, epoch, why }, &mut actions);
                }
            }
        }
        self.act_reusing(actions);
    }

    /// The engine's answer to `event`, in the actor's reused buffer (hand
    /// it back through [`DagActor::act_reusing`]).
    fn answer_of(&mut self, event: Event) -> Vec<Action> {
        let mut actions = std::mem::take(&mut self.actions);
        self.engine.on_event_into(event, &mut actions);
        actions
    }

    /// [`DagActor::act`] on `actions`, keeping the buffer for the next
    /// message.
    fn act_reusing(&mut self, mut actions: Vec<Action>) {
        self.act(actions.drain(..));
        self.actions = actions;
    }

    /// A driver's call; any but a submit comes after the caller sent what
    /// was pending ([`Msg::flushes`]).
    fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Submit { spec, submission } => {
                let id = submission.task.id();
                self.next_id = self.next_id.max(id.0 + 1);
                let n = spec.members.len();
                let exposed = self.count_exposed(&spec);
                // The record first: the engine's answer (accepted, maybe
                // dispatched or done at once; or refused) acts on it.
                self.records.insert(
                    id,
                    Box::new(Record {
                        spec,
                        members: smallvec::smallvec![MemberState::default(); n],
                        waiters: Vec::new(),
                        submitted: self.trace.is_some().then(Instant::now),
                        edges: Vec::new(),
                        exposed,
                    }),
                );
                let actions = self.answer_of(Event::Submit(submission));
                self.act_reusing(actions);
            }
            Cmd::Wait { task, reply } => {
                if let Some(r) = self.records.get_mut(&task) {
                    r.waiters.push(reply);
                } else if task.0 == 0 || task.0 >= self.next_id {
                    let _ = reply.send(Err(RunError {
                        task,
                        callable: "?".into(),
                        worker: None,
                        outcome: Outcome::TaskFailure(FailureCause::new(
                            FailureKind::Refused,
                            format!("{task} was never submitted"),
                        )),
                    }));
                } else {
                    let result = match self.failed.get(&task) {
                        Some(e) => Err(e.clone()),
                        None => Ok(()),
                    };
                    self.reply_after_write_back(task, vec![reply], result);
                }
            }
            Cmd::WaitAll { reply } => {
                self.all_waiters.push(reply);
                self.settle();
            }
            Cmd::Cancel { task, reply } => self.answer(Event::Cancel(task), reply),
            Cmd::OpenScope { reply } => {
                for a in self.engine.on_event(Event::OpenScope) {
                    if let Action::ScopeOpened(scope) = a {
                        let _ = reply.send(scope);
                        break;
                    }
                }
            }
            Cmd::ScopeBuffer {
                scope,
                buffer,
                reply,
            } => {
                let actions = self.engine.on_event(Event::ScopeBuffer {
                    scope,
                    identity: buffer.identity(),
                });
                let r = match refused(&actions) {
                    Some(r) => Err(r.into()),
                    None => {
                        self.scoped.insert(buffer.identity(), buffer);
                        Ok(())
                    }
                };
                match reply {
                    Some(reply) => drop(reply.send(r)),
                    None => {
                        if let Err(e) = r {
                            debug!(scope = scope.0, error = %e, "scope buffer refused: dropped");
                        }
                    }
                }
            }
            Cmd::EndScope { scope, reply } => match reply {
                Some(reply) => self.answer(Event::EndScope(scope), reply),
                None => {
                    let actions = self.engine.on_event(Event::EndScope(scope));
                    if let Some(r) = refused(&actions) {
                        debug!(scope = scope.0, refusal = ?r, "scope end refused");
                    } else {
                        self.act(actions);
                    }
                }
            },
            Cmd::Totals { reply } => {
                let _ = reply.send(self.totals.clone());
            }
            Cmd::TakeTrace { reply } => {
                let tasks = self.trace.as_mut().map(std::mem::take);
                let _ = reply.send(tasks.map(|tasks| Trace { tasks }));
            }
            Cmd::Shutdown { .. } => unreachable!("handled by run"),
        }
    }

    /// A driver's call as an engine event: refused (the reply says why,
    /// nothing changed), or done (the reply says so, then its actions are
    /// carried out).
    fn answer(&mut self, event: Event, reply: oneshot::Sender<Result<(), Error>>) {
        let actions = self.engine.on_event(event);
        match refused(&actions) {
            Some(r) => {
                let _ = reply.send(Err(r.into()));
            }
            None => {
                let _ = reply.send(Ok(()));
                self.act(actions);
            }
        }
    }

    /// Carries out the engine's actions: dispatches join their worker's
    /// batch (sent by [`DagActor::flush`] at the end of the step); finished
    /// tasks wake their waiters and let go of their buffers; scoped buffers
    /// whose scope ended are dropped.
    fn act(&mut self, actions: impl IntoIterator<Item = Action>) {
        let mut now = None;
        let tracing = self.trace.is_some();
        for a in actions {
            match a {
                Action::Accepted { task, edges } => {
                    for s in [&mut self.run, &mut self.totals] {
                        s.submitted += 1;
                        s.edges += edges.len() as u64;
                    }
                    if let Some(r) = self.records.get_mut(&task) {
                        r.edges = edges;
                    }
                }
                Action::Refused(Refusal::Submit(e)) => self.refused(e),
                // Refusals of the driver's calls are answered where the
                // call is (they come alone).
                Action::Refused(_) | Action::ScopeOpened(_) => {}
                Action::Dispatch {
                    task,
                    member,
                    worker,
                    rank,
                } => {
                    let Some(r) = self.records.get_mut(&task) else {
                        continue;
                    };
                    if self.pending.get(worker.0 as usize).is_none() {
                        continue;
                    }
                    let Some(slot) = r.members.get_mut(member) else {
                        continue;
                    };
                    slot.worker = Some(worker);
                    if tracing {
                        slot.dispatched = Some(*now.get_or_insert_with(Instant::now));
                    }
                    let m = &r.spec.members[member];
                    // Members of a group may write the same bytes at once
                    // (its completion token): no copies are kept for them.
                    let grouped = r.spec.members.len() > 1;
                    let (caches, keeps_dirty) = self
                        .endpoints
                        .get(worker.0 as usize)
                        .map_or((false, false), |e| (e.caches, e.keeps_dirty));
                    // A write on any worker changes the versions the
                    // caching ones hold, so it is recorded wherever it runs;
                    // only caching workers are told the versions.
                    let cache = match &mut self.directory {
                        Some(dir) => {
                            let (cache, writes) = cache_args(dir, &m.args, keeps_dirty && !grouped);
                            if writes.is_empty() {
                                self.writes_sent.remove(&(task, member));
                            } else {
                                self.writes_sent.insert((task, member), writes);
                            }
                            if caches && !grouped {
                                cache
                            } else {
                                Vec::new()
                            }
                        }
                        None => Vec::new(),
                    };
                    let item = DispatchItem {
                        task,
                        member,
                        callable: m.callable,
                        args: std::sync::Arc::clone(&m.args),
                        scalars: std::sync::Arc::clone(&m.scalars),
                        timeout: m.timeout,
                        required_features: m.required_features,
                        cache,
                        fail: None,
                        priority: rank,
                    };
                    self.route(worker, item);
                }
                Action::Done { task, outcome } => self.done(task, outcome),
                Action::Release(identity) => {
                    self.scoped.remove(&identity);
                }
                Action::Quarantined { task, loss } => self.quarantine(task, loss),
                Action::Lifted { task } => {
                    for args in self.quarantined.remove(&task).unwrap_or_default() {
                        for a in args.iter().filter(|a| a.tag.writes()) {
                            match &a.backing {
                                crate::buffer::Backing::Host(h) => h.lift(task),
                                crate::buffer::Backing::Device(d) => d.marks.lift(task),
                            }
                            // It may have written them until its fence.
                            if let Some(dir) = &mut self.directory {
                                dir.forget(&Footprint::of(&a.tensor));
                            }
                        }
                    }
                }
            }
        }
        self.settle();
    }

    /// A member's writes ended: once it succeeded, the bytes have the
    /// versions it was sent with; otherwise they may hold anything (a
    /// failed kernel writes nothing back, but a lost worker may have
    /// written part), and their versions are forgotten.
    fn writes_landed(&mut self, task: TaskId, member: usize, ok: bool) {
        let (Some(dir), Some(writes)) = (
            &mut self.directory,
            self.writes_sent.remove(&(task, member)),
        ) else {
            return;
        };
        let (worker, callable) = self
            .records
            .get(&task)
            .map(|r| {
                (
                    r.members.get(member).and_then(|m| m.worker),
                    r.spec.members.get(member).map(|m| m.name.to_string()),
                )
            })
            .unwrap_or_default();
        let mut dirty = false;
        let mut rewritten: SmallVec<[Footprint; 2]> = SmallVec::new();
        for (fp, version, deferred) in writes {
            if !ok {
                dir.forget(&fp);
                continue;
            }
            let superseded = match (worker, deferred) {
                (Some(w), Some(view)) => {
                    dirty = true;
                    dir.written_dirty(&fp, version, Self::dirty_of(w, task, view))
                }
                _ => dir.written(&fp, version),
            };
            for f in superseded {
                // Dispatch had them written back first: a bug if not.
                warn!(%task, worker = %f.dirty.worker, "a write superseded bytes still dirty on a chip");
            }
            rewritten.push(fp);
        }
        for fp in &rewritten {
            self.rewritten(fp);
        }
        if dirty && let Some(name) = callable {
            self.dirty_writer(task, &name);
        }
    }

    /// Counts a new task as a live user of the byte sets it names in
    /// buffers the driver touches directly ([`DagActor::live_exposed`]),
    /// forgetting the versions of those no task used until now.
    fn count_exposed(&mut self, spec: &TaskSpec) -> Vec<Footprint> {
        let mut counted = Vec::new();
        let Some(dir) = &mut self.directory else {
            return counted;
        };
        for m in &spec.members {
            for a in m.args.iter() {
                let crate::buffer::Backing::Host(h) = &a.backing else {
                    continue;
                };
                h.mark_used();
                if h.exposed() {
                    let fp = Footprint::of(&a.tensor);
                    let n = self.live_exposed.entry(fp).or_default();
                    if *n == 0 {
                        dir.forget(&fp);
                    }
                    *n += 1;
                    counted.push(fp);
                }
            }
        }
        counted
    }

    fn worker_name(&self, worker: WorkerId) -> String {
        match self.endpoints.get(worker.0 as usize) {
            Some(ep) => format!("{worker} ({})", ep.name),
            None => worker.to_string(),
        }
    }

    /// A task was running on a worker lost without a fence: its written
    /// views (of host buffers, and of device buffers for their mappings)
    /// are refused to the driver, and its buffers held, until
    /// the quarantine lifts.
    fn quarantine(&mut self, task: TaskId, loss: strata_orchestrator_core::Loss) {
        let Some(r) = self.records.get(&task) else {
            return;
        };
        let lost = crate::buffer::Loss {
            task,
            callable: r
                .spec
                .members
                .first()
                .map_or_else(|| "?".to_owned(), |m| m.name.to_string()),
            worker: loss.worker,
            address: self
                .endpoints
                .get(loss.worker.0 as usize)
                .map(|ep| ep.name.clone()),
        };
        let args: Vec<_> = r
            .spec
            .members
            .iter()
            .map(|m| std::sync::Arc::clone(&m.args))
            .collect();
        for a in args
            .iter()
            .flat_map(|a| a.iter())
            .filter(|a| a.tag.writes())
        {
            match &a.backing {
                crate::buffer::Backing::Host(h) => h.quarantine(a.tensor, lost.clone()),
                // A mapping of a shared buffer may outlive its worker.
                crate::buffer::Backing::Device(d) => d.marks.mark(a.tensor, lost.clone()),
            }
        }
        self.quarantined.insert(task, args);
    }

    /// The fence of a loss did not come in time: what waits on its
    /// quarantined bytes fails.
    fn deadline_passed(&mut self) {
        let now = Instant::now();
        let (due, rest): (Vec<_>, Vec<_>) = self.deadlines.drain(..).partition(|d| d.0 <= now);
        self.deadlines = rest;
        let mut actions = Vec::new();
        for (_, worker, epoch) in due {
            let limit = match self.policy {
                crate::policy::Quarantine::Wait(limit) => limit,
                crate::policy::Quarantine::FailAtOnce => Duration::ZERO,
            };
            let why = format!(
                "{} gave no proof within {} ms that the task ended (Quarantine::Wait)",
                self.worker_name(worker),
                limit.as_millis()
            );
            actions.extend(
                self.engine
                    .on_event(Event::Abandoned { worker, epoch, why }),
            );
        }
        self.act(actions);
    }
}

/// A message the actor took.
enum Msg {
    Up(Notice),
    Cmd(Cmd),
}

impl Msg {
    /// Whether the dispatches pending go before this message is acted on:
    /// all but a completion and a submission (which join the batch).
    fn flushes(&self) -> bool {
        !matches!(
            self,
            Msg::Up(
                Notice::Imported { .. }
                    | Notice::Completed {
                        event: Event::Finished { .. },
                        ..
                    }
            ) | Msg::Up(Notice::Event(Event::Finished { .. }))
                | Msg::Cmd(Cmd::Submit { .. })
        )
    }
}

/// The refusal an answer of the engine holds, if it is one.
fn refused(actions: &[Action]) -> Option<Refusal> {
    actions.iter().find_map(|a| match a {
        Action::Refused(r) => Some(r.clone()),
        _ => None,
    })
}

/// Sleeps until `at` (the branch that awaits it is disabled for `None`).
async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
    }
}

/// The cache entries of one member's dispatch: for each host argument the
/// DAG orders (not NO_DEP), the version of its bytes now and, for one it
/// writes, the version they have once it succeeds (write-through: the
/// bytes also go back to host memory when it ends). Returns them and the
/// writes to record when it finishes.
fn cache_args(
    dir: &mut Directory,
    args: &[super::ArgRef],
    deferred: bool,
) -> (Vec<CacheArg>, Writes) {
    let mut cache = Vec::new();
    let mut writes = SmallVec::new();
    for (i, a) in args.iter().enumerate() {
        // A POSIX_SHM buffer is copied for each task and never cached on
        // a chip (its worker writes it back when the task ends).
        if a.tag == ArgTag::NoDep
            || !matches!(a.backing, crate::buffer::Backing::Host(_))
            || a.tensor.buffer().backing().kind() == strata_wire::BackendKind::PosixShm
        {
            continue;
        }
        let fp = Footprint::of(&a.tensor);
        let version = dir.version(&fp);
        let written = if a.tag.writes() {
            let v = dir.fresh();
            writes.push((fp, v, deferred.then_some(a.tensor)));
            v
        } else {
            0
        };
        cache.push(CacheArg {
            index: i as u32,
            version,
            written,
            deferred: deferred && a.tag.writes(),
            held: false,
        });
    }
    (cache, writes)
}

/// `sum += n`, pinned at the top instead of overflowing.
fn add(sum: &mut u64, n: u64) {
    *sum = sum.saturating_add(n);
}
