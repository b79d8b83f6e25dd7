//! The scheduler core: where and when ready tasks run.
//!
//! - Each worker has a FIFO ready queue and a bounded in-flight window
//!   (backpressure: nothing more is dispatched to a full worker).
//! - Placement: a member that names its worker goes there (if that worker
//!   is down, the task fails with ENDPOINT_FAILURE); otherwise it goes to
//!   the up worker that can take it — offering its callable, with the
//!   capabilities it needs ([`MemberInfo::needs`]: the kinds of buffer and
//!   dtypes of its arguments, the features it requires) — with the least
//!   outstanding work
//!   (queued + in flight) relative to its window (first the least work
//!   beyond the window, then the most free slots), ties broken toward a
//!   worker holding one of the task's DEVICE buffers, then the lowest id. A group's members go to
//!   distinct workers.
//! - Groups launch all-or-nothing: a group is queued on all its workers at
//!   once and dispatched only when it heads every one of those queues and
//!   each has room. Queues are FIFO in ready order, so two groups meet in
//!   the same order on every worker they share: no deadlock.
//! - A task finishes when every member reported. The first failure of a run
//!   is kept with its task, callable, worker and cause.
//! - Endpoint loss: everything in flight on the worker fails with
//!   ENDPOINT_FAILURE; queued tasks that named it fail too; queued tasks
//!   placed automatically are placed again; other workers go on. A worker
//!   that comes back up (same id) takes work again. A task allowed to
//!   retry is placed again at once when the loss is fenced; when it is not
//!   (the worker may still run it), it waits for [`Scheduler::fence`] and
//!   fails at [`Scheduler::abandon`].
//! - Timeout: a member that ran past its timeout
//!   ([`Scheduler::timed_out`]) fails with TASK_FAILURE naming the
//!   timeout, is never retried, and ends with its worker's loss.
//!
//! Invariants, checked by [`Scheduler::check_invariants`] after every
//! event in debug builds and by the property tests:
//! - SCHED-1: a worker's in-flight count never exceeds its window, and
//!   equals the members running on it;
//! - SCHED-2: every unfinished task is in exactly one state: waiting for
//!   the DAG, queued on exactly its members' workers, or running;
//! - SCHED-3: a running member's worker offers its callable and has the
//!   capabilities it needs;
//! - SCHED-4: a down worker has nothing queued or in flight;
//! - SCHED-5: a task waiting for a fence has retries left and one member.

mod invariants;
pub mod perf;
mod queue;

pub use crate::outcome::{CancelError, FirstError, Outcome, PlacementError};
pub use perf::{PerfModel, Work};

use std::collections::BTreeMap;

use rustc_hash::FxHashSet as HashSet;

use strata_boundary::{Capabilities, FailureCause, FailureKind};
use strata_wire::CanonicalIdentity;

use crate::ids::{KernelHandle, TaskId, WorkerId};

/// Where a member should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On this worker.
    On(WorkerId),
    /// Wherever the scheduler decides.
    Any,
}

/// What the scheduler needs to know of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    /// The callable.
    pub callable: KernelHandle,
    /// Where it should run.
    pub placement: Placement,
    /// DEVICE buffers it uses (a hint for placement).
    pub device_buffers: Vec<CanonicalIdentity>,
    /// What its worker must have: the kinds of buffer and the dtypes of
    /// its arguments, the features it requires. Only a worker whose
    /// capabilities cover them takes it.
    pub needs: Capabilities,
    /// What it costs, for the performance models.
    pub work: Work,
}

/// How tasks without a named worker are placed, and in which order each
/// worker's ready tasks go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Policy {
    /// The worker with the least outstanding work; queues in ready order.
    LeastLoaded,
    /// The worker where the task is expected to finish first: the
    /// modelled work queued there, plus moving the bytes it lacks there,
    /// plus its modelled duration (StarPU's `dmda`); queues in ready
    /// order.
    Dmda,
    /// As [`Policy::Dmda`], and each queue takes the task with the longest
    /// modelled path to the end of the graph first (its upward rank, as
    /// HEFT computes it): the critical path goes first (StarPU's `dmdas`
    /// with priorities).
    #[default]
    Dmdas,
}

impl Policy {
    /// Every policy, by name.
    pub const ALL: [(&'static str, Policy); 3] = [
        ("least-loaded", Policy::LeastLoaded),
        ("dmda", Policy::Dmda),
        ("dmdas", Policy::Dmdas),
    ];

    /// The policy's name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::LeastLoaded => "least-loaded",
            Policy::Dmda => "dmda",
            Policy::Dmdas => "dmdas",
        }
    }

    /// The policy named `name`.
    ///
    /// # Errors
    /// An unknown name, listing the known ones.
    pub fn from_name(name: &str) -> Result<Policy, String> {
        Policy::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                format!(
                    "unknown scheduler {name:?}: one of {}",
                    Policy::ALL.map(|(n, _)| n).join(", ")
                )
            })
    }

    fn models(self) -> bool {
        self != Policy::LeastLoaded
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub use crate::action::Action;

#[derive(Debug)]
struct Worker {
    up: bool,
    callables: HashSet<KernelHandle>,
    /// What its tasks may use ([`Scheduler::worker_up`]).
    capabilities: Capabilities,
    window: usize,
    in_flight: usize,
    queue: queue::ReadyQueue,
    device_buffers: HashSet<CanonicalIdentity>,
    /// Its device kind, for the performance models (0 until said).
    kind: u64,
    /// Modelled ns of the work queued and in flight here.
    backlog_ns: f64,
    /// Of that, in flight.
    in_flight_ns: f64,
}

impl Worker {
    /// Whether it can take `m`: it offers the callable and has what the
    /// member needs (the one test of placement, its checks and SCHED-3).
    fn takes(&self, m: &MemberInfo) -> bool {
        self.callables.contains(&m.callable) && self.capabilities.covers(&m.needs)
    }
}

/// Per member of a task, inline up to two members: placing and running a
/// plain task allocates nothing.
type Members<T> = smallvec::SmallVec<[T; 2]>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Submitted, not ready yet.
    Waiting,
    /// Ready, queued on these workers (one per member).
    Queued(Members<WorkerId>),
    /// Dispatched to these workers; members still to report, and the first
    /// failure among them.
    Running {
        workers: Members<WorkerId>,
        left: Members<bool>,
        failure: Option<(usize, Outcome)>,
    },
    /// Lost with its worker without a fence; placed again once fenced.
    Fencing(WorkerId),
}

#[derive(Debug)]
struct Task {
    members: Vec<MemberInfo>,
    state: State,
    /// Times it may still be run again elsewhere after its worker is lost.
    retries: u32,
    /// Each member's modelled duration where it was placed.
    predicted: Members<Option<f64>>,
    /// Its key in its workers' queues while queued.
    key: queue::Key,
    /// Upward rank (ns): its modelled duration plus the longest modelled
    /// path after it among the tasks submitted so far.
    rank: f64,
    /// Its modelled duration when it was submitted (ns), for ranking.
    cost: f64,
    /// Unfinished predecessors, for raising their ranks ([`Policy::Dmdas`]).
    preds: smallvec::SmallVec<[TaskId; 4]>,
}

/// The scheduler.
#[derive(Debug, Default)]
pub struct Scheduler {
    workers: BTreeMap<WorkerId, Worker>,
    /// Boxed, as [`crate::ids::SeqMap`] asks: with its 264 bytes inline,
    /// the table's growth through a fresh cluster's first burst of 1,000
    /// tasks was where the driver touched most of its fresh memory
    /// (profiled: all of the burst's page zeroing), which slowed those
    /// tasks; boxed, the burst grows the driver by half as much.
    tasks: crate::ids::SeqMap<TaskId, Box<Task>>,
    first_error: Option<FirstError>,
    /// Scratch for `pump` (the workers' queue heads), kept to be reused.
    heads: Vec<TaskId>,
    policy: Policy,
    model: PerfModel,
    /// Which workers' chips hold (or will, once what is queued there ran)
    /// each byte set a task named, by [`Work::data`] key: an estimate for
    /// placement, bounded by [`HOLDERS_MAX`].
    holders: rustc_hash::FxHashMap<u64, Members<WorkerId>>,
    /// Ready order, for queue keys.
    next_seq: u64,
    /// Device kinds said by [`Scheduler::set_kind`].
    kinds: rustc_hash::FxHashMap<WorkerId, u64>,
}

/// Byte sets whose holders the scheduler remembers at most (then it
/// forgets them all: an estimate may start over).
const HOLDERS_MAX: usize = 1 << 16;

/// Modelled duration assumed for a task the models cannot predict, when
/// ranking (ns).
const UNKNOWN_NS: f64 = 1_000.0;

/// With a model, a worker takes more tasks in flight beyond two only while
/// their modelled durations add up to less than this (ns): a small window
/// of long tasks keeps later placements and priorities meaningful, a long
/// one of short tasks keeps the link busy.
const IN_FLIGHT_HORIZON_NS: f64 = 4_000_000.0;

/// Rank updates one submission may make before it stops raising its
/// ancestors' ranks (deep graphs then rank by what is near).
const RANK_BUDGET: usize = 128;

/// A submission raises an ancestor's rank only when the path through it is
/// longer than the rank by more than this fraction: along every edge a
/// rank then covers its successor's rank and its own cost to within this
/// fraction (well inside the models' own error), which is what the order
/// of ready tasks needs. Without it a chain cost a walk of [`RANK_BUDGET`]
/// ancestors per submission, each raised by one task's cost: in a chain of
/// equal tasks the walk now stops after about `1 / RANK_SLACK` of them.
const RANK_SLACK: f64 = 1.0 / 16.0;

impl Scheduler {
    /// A scheduler without workers, with the default policy.
    pub fn new() -> Self {
        Scheduler::default()
    }

    /// A scheduler without workers, placing by `policy`.
    pub fn with_policy(policy: Policy) -> Self {
        Scheduler {
            policy,
            ..Scheduler::default()
        }
    }

    /// The placement policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The performance models.
    pub fn model(&self) -> &PerfModel {
        &self.model
    }

    /// The performance models, to load saved history into.
    pub fn model_mut(&mut self) -> &mut PerfModel {
        &mut self.model
    }

    /// `worker`'s device kind (a hash of its device spec): its tasks'
    /// times are learned and predicted apart from other kinds'. Kept
    /// across the worker's losses and returns; a worker whose kind was
    /// never said is kind 0.
    pub fn set_kind(&mut self, worker: WorkerId, kind: u64) {
        self.kinds.insert(worker, kind);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.kind = kind;
        }
    }

    fn kind_of(&self, worker: WorkerId) -> u64 {
        self.kinds.get(&worker).copied().unwrap_or(0)
    }

    /// A member's modelled duration before it is placed (for ranking): on
    /// the kind of the lowest worker that can take it.
    fn unplaced_cost(&self, m: &MemberInfo) -> f64 {
        let kind = self
            .workers
            .values()
            .find(|w| w.takes(m))
            .map_or(0, |w| w.kind);
        self.model
            .predict(m.callable, kind, &m.work)
            .unwrap_or(UNKNOWN_NS)
    }

    /// Member `member` of `task` ran its kernel for `kernel_ns` and copied
    /// `copied_bytes` to its chip in `copy_ns`: the models learn from it.
    /// Call before the member's [`Scheduler::finished`]. Returns what the
    /// models had predicted for it when it was placed (ns), if they had.
    pub fn observe(
        &mut self,
        task: TaskId,
        member: usize,
        kernel_ns: u64,
        copied_bytes: u64,
        copy_ns: u64,
    ) -> Option<f64> {
        let t = self.tasks.get(&task)?;
        let (Some(info), State::Running { workers, .. }) = (t.members.get(member), &t.state) else {
            return None;
        };
        let predicted = t.predicted.get(member).copied().flatten();
        let w = *workers.get(member)?;
        let kind = self.kind_of(w);
        self.model.observe_copy(w, copied_bytes, copy_ns);
        self.model
            .observe(info.callable, kind, &info.work, kernel_ns as f64, predicted);
        predicted
    }

    /// `task`'s predecessors in the graph (the DAG's edges): under
    /// [`Policy::Dmdas`], their upward ranks grow to cover the path
    /// through it.
    pub fn link(&mut self, task: TaskId, preds: &[(TaskId, u8)]) {
        if self.policy != Policy::Dmdas {
            return;
        }
        let cost = match self.tasks.get(&task) {
            Some(t) => t
                .members
                .first()
                .map_or(UNKNOWN_NS, |m| self.unplaced_cost(m)),
            None => return,
        };
        if let Some(t) = self.tasks.get_mut(&task) {
            t.rank = cost;
            t.cost = cost;
            t.preds = preds
                .iter()
                .map(|(p, _)| *p)
                .filter(|p| *p != task)
                .collect();
        }
        let mut stack: smallvec::SmallVec<[(TaskId, f64); 8]> =
            preds.iter().map(|(p, _)| (*p, cost)).collect();
        let mut budget = RANK_BUDGET;
        while let Some((p, below)) = stack.pop() {
            if budget == 0 {
                break;
            }
            budget -= 1;
            let Some(t) = self.tasks.get_mut(&p) else {
                continue;
            };
            let want = t.cost + below;
            if want <= t.rank * (1.0 + RANK_SLACK) {
                continue;
            }
            t.rank = want;
            stack.extend(t.preds.iter().map(|q| (*q, want)));
            if let State::Queued(ws) = &t.state {
                let old = t.key;
                t.key.prio = std::cmp::Reverse(want as u64);
                let new = t.key;
                for w in ws.clone() {
                    if let Some(worker) = self.workers.get_mut(&w) {
                        worker.queue.rekey(old, new);
                    }
                }
            }
        }
    }

    /// A worker came up (or back up) offering `callables`, whose tasks may
    /// use `capabilities`, taking at most `window` tasks at a time.
    pub fn worker_up(
        &mut self,
        worker: WorkerId,
        callables: impl IntoIterator<Item = KernelHandle>,
        capabilities: Capabilities,
        window: usize,
    ) -> Vec<Action> {
        let w = self.workers.entry(worker).or_insert_with(|| Worker {
            up: true,
            callables: HashSet::default(),
            capabilities,
            window: 1,
            in_flight: 0,
            queue: queue::ReadyQueue::default(),
            device_buffers: HashSet::default(),
            kind: 0,
            backlog_ns: 0.0,
            in_flight_ns: 0.0,
        });
        w.up = true;
        w.kind = self.kinds.get(&worker).copied().unwrap_or(0);
        w.callables = callables.into_iter().collect();
        w.capabilities = capabilities;
        w.window = window.max(1);
        let mut out = Vec::new();
        self.pump(&mut out);
        self.debug_check();
        out
    }

    /// Whether `worker` ever came up (it may be down now).
    pub fn knows(&self, worker: WorkerId) -> bool {
        self.workers.contains_key(&worker)
    }

    /// Records that a DEVICE buffer lives on `worker` (or no longer does).
    pub fn device_buffer(&mut self, worker: WorkerId, identity: CanonicalIdentity, present: bool) {
        if let Some(w) = self.workers.get_mut(&worker) {
            if present {
                w.device_buffers.insert(identity);
            } else {
                w.device_buffers.remove(&identity);
            }
        }
    }

    /// Checks that a task could be placed: named workers are known, offer
    /// the callable and have what the member needs; other members have
    /// some worker that can take them.
    ///
    /// # Errors
    /// Why not, naming the member.
    pub fn check_placeable(&self, members: &[MemberInfo]) -> Result<(), PlacementError> {
        for (m, info) in members.iter().enumerate() {
            match info.placement {
                Placement::On(w) => {
                    let worker = self.workers.get(&w).ok_or(PlacementError::UnknownWorker {
                        member: m,
                        worker: w,
                    })?;
                    if !worker.callables.contains(&info.callable) {
                        return Err(PlacementError::NotRegistered {
                            member: m,
                            callable: info.callable,
                            worker: w,
                        });
                    }
                    if !worker.capabilities.covers(&info.needs) {
                        return Err(PlacementError::Lacks {
                            member: m,
                            worker: w,
                            missing: worker.capabilities.missing(&info.needs),
                        });
                    }
                    // A scan of the earlier members allocates nothing (a
                    // set per task did, on the DAG actor's thread).
                    if members[..m].iter().any(|e| e.placement == Placement::On(w)) {
                        return Err(PlacementError::WorkerTaken {
                            member: m,
                            worker: w,
                        });
                    }
                }
                Placement::Any => {
                    if !self
                        .workers
                        .values()
                        .any(|w| w.callables.contains(&info.callable))
                    {
                        return Err(PlacementError::NotOffered {
                            member: m,
                            callable: info.callable,
                        });
                    }
                    if !self.workers.values().any(|w| w.takes(info)) {
                        return Err(PlacementError::NoneCapable {
                            member: m,
                            callable: info.callable,
                            needs: info.needs,
                        });
                    }
                }
            }
        }
        if members.len() > self.workers.len() {
            return Err(PlacementError::GroupTooLarge {
                members: members.len(),
                workers: self.workers.len(),
            });
        }
        Ok(())
    }

    /// Registers a submitted task (not yet ready).
    pub fn submit(&mut self, task: TaskId, members: Vec<MemberInfo>) {
        self.tasks.insert(
            task,
            Box::new(Task {
                members,
                state: State::Waiting,
                retries: 0,
                predicted: Members::new(),
                key: queue::Key::unqueued(task),
                rank: 0.0,
                cost: 0.0,
                preds: smallvec::SmallVec::new(),
            }),
        );
    }

    /// Lets `task` be run again on another worker, up to `retries` times,
    /// when the worker running it is lost and known not to touch memory
    /// any more ([`Scheduler::worker_lost`] with `fenced`). Only a plain
    /// task placed by the scheduler qualifies; the caller decides that
    /// its writes make a rerun safe (every write OUTPUT, none INOUT).
    pub fn allow_retries(&mut self, task: TaskId, retries: u32) {
        if let Some(t) = self.tasks.get_mut(&task) {
            let plain = t.members.len() == 1 && t.members[0].placement == Placement::Any;
            t.retries = if plain { retries } else { 0 };
        }
    }

    /// The task became ready: place and, room allowing, dispatch it.
    pub fn ready(&mut self, task: TaskId) -> Vec<Action> {
        let mut out = Vec::new();
        self.ready_into(task, &mut out);
        out
    }

    /// [`Scheduler::ready`], appending to `out` (a buffer the caller
    /// reuses: the engine's per-task path allocates no `Vec` of actions).
    pub fn ready_into(&mut self, task: TaskId, out: &mut Vec<Action>) {
        self.enqueue(task, out);
        self.pump(out);
        self.debug_check();
    }

    /// Forgets a task that will not run (skipped or cancelled before ready).
    pub fn forget(&mut self, task: TaskId) {
        self.tasks.remove(&task);
    }

    /// A member reported. When every member has, the task is done.
    pub fn finished(
        &mut self,
        task: TaskId,
        member: usize,
        result: Result<(), FailureCause>,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        self.finished_into(task, member, result, &mut out);
        out
    }

    /// [`Scheduler::finished`], appending to `out`.
    pub fn finished_into(
        &mut self,
        task: TaskId,
        member: usize,
        result: Result<(), FailureCause>,
        out: &mut Vec<Action>,
    ) {
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        let State::Running {
            workers,
            left,
            failure,
        } = &mut t.state
        else {
            return;
        };
        if !left.get(member).copied().unwrap_or(false) {
            return; // unknown or duplicate report
        }
        left[member] = false;
        let w = workers[member];
        let predicted = t.predicted.get(member).copied().flatten().unwrap_or(0.0);
        if let Some(worker) = self.workers.get_mut(&w) {
            worker.in_flight = worker.in_flight.saturating_sub(1);
            worker.backlog_ns = (worker.backlog_ns - predicted).max(0.0);
            worker.in_flight_ns = (worker.in_flight_ns - predicted).max(0.0);
        }
        if let Err(cause) = result {
            failure.get_or_insert((member, Outcome::TaskFailure(cause)));
        }
        if left.iter().all(|l| !l) {
            self.finish(task, out);
        }
        self.pump(out);
        self.debug_check();
    }

    /// A worker was lost (nothing is retried: see
    /// [`Scheduler::worker_lost`]).
    pub fn worker_down(&mut self, worker: WorkerId, cause: &str) -> Vec<Action> {
        self.worker_lost(worker, cause, false)
    }

    /// A worker was lost. `fenced`: it can no longer touch task memory
    /// (it is dead, or its tasks' bytes were staged copies), so a task
    /// with retries left is placed again instead of failing.
    pub fn worker_lost(&mut self, worker: WorkerId, cause: &str, fenced: bool) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(w) = self.workers.get_mut(&worker) else {
            return out;
        };
        w.up = false;
        w.in_flight = 0;
        w.backlog_ns = 0.0;
        w.in_flight_ns = 0.0;
        // Its device memory went with it.
        w.device_buffers.clear();
        let queued: Vec<TaskId> = w.queue.drain();
        for h in self.holders.values_mut() {
            h.retain(|x| *x != worker);
        }
        let why = format!("{worker} lost: {cause}");
        let why_running = if fenced {
            why.clone()
        } else {
            format!(
                "{why}; it may still be running the task, so the bytes the task writes \
                 are quarantined until the worker is fenced"
            )
        };
        // In flight on it: failed.
        let running = self.running_on(worker);
        for id in running {
            if let Some(t) = self.tasks.get_mut(&id) {
                if t.retries > 0 && t.members.len() == 1 {
                    if fenced {
                        t.retries -= 1;
                        t.state = State::Waiting;
                        self.enqueue(id, &mut out);
                    } else {
                        t.state = State::Fencing(worker);
                    }
                    continue;
                }
            }
            let mut all_reported = false;
            if let Some(State::Running {
                workers,
                left,
                failure,
            }) = self.tasks.get_mut(&id).map(|t| &mut t.state)
            {
                for (m, (w, l)) in workers.iter().zip(left.iter_mut()).enumerate() {
                    if *w == worker && *l {
                        *l = false;
                        failure.get_or_insert((
                            m,
                            Outcome::EndpointFailure(FailureCause::new(
                                FailureKind::WorkerLost,
                                why_running.clone(),
                            )),
                        ));
                    }
                }
                all_reported = left.iter().all(|l| !l);
            }
            if all_reported {
                self.finish(id, &mut out);
            }
        }
        // Queued on it: named ones fail, automatic ones are placed again.
        for id in queued {
            let Some(t) = self.tasks.get(&id) else {
                continue;
            };
            let State::Queued(ws) = &t.state else {
                continue;
            };
            let ws = ws.clone();
            let named = t
                .members
                .iter()
                .zip(&ws)
                .any(|(m, w)| *w == worker && matches!(m.placement, Placement::On(_)));
            let key = t.key;
            for w in &ws {
                if let Some(other) = self.workers.get_mut(w) {
                    other.queue.remove(key);
                }
            }
            self.unqueue_backlog(id);
            if named {
                let cause = FailureCause::new(FailureKind::WorkerLost, why.clone());
                self.done(id, 0, None, Outcome::EndpointFailure(cause), &mut out);
            } else {
                self.enqueue(id, &mut out);
            }
        }
        self.pump(&mut out);
        self.debug_check();
        out
    }

    /// Member `member` of `task` ran past its timeout: its failure is
    /// TASK_FAILURE with `cause` (unless another member failed first), and
    /// the task is not run again by the retry policy (it would likely time
    /// out again). The member stays in flight: the worker's loss, which the
    /// caller reports next, ends it (and quarantines its bytes when that
    /// loss has no fence). Does nothing for a member not in flight.
    pub fn timed_out(&mut self, task: TaskId, member: usize, cause: &str) {
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        if let State::Running { left, failure, .. } = &mut t.state {
            if left.get(member).copied().unwrap_or(false) {
                failure.get_or_insert((
                    member,
                    Outcome::TaskFailure(FailureCause::new(FailureKind::TimedOut, cause)),
                ));
                t.retries = 0;
            }
        }
        self.debug_check();
    }

    /// Tasks with a member in flight on `worker`.
    pub fn running_on(&self, worker: WorkerId) -> Vec<TaskId> {
        self.tasks
            .iter()
            .filter(|(_, t)| matches!(&t.state, State::Running { workers, left, .. } if workers.iter().zip(left).any(|(w, l)| *w == worker && *l)))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether `task` waits for the fence of a lost worker.
    pub fn is_fencing(&self, task: TaskId) -> bool {
        self.tasks
            .get(&task)
            .is_some_and(|t| matches!(t.state, State::Fencing(_)))
    }

    /// The lost worker is fenced: its tasks that wait for that (`tasks`,
    /// those of one loss) are placed again.
    pub fn fence(&mut self, tasks: &[TaskId]) -> Vec<Action> {
        let mut out = Vec::new();
        for &id in tasks {
            if let Some(t) = self.tasks.get_mut(&id) {
                if matches!(t.state, State::Fencing(_)) {
                    t.retries = t.retries.saturating_sub(1);
                    t.state = State::Waiting;
                    self.enqueue(id, &mut out);
                }
            }
        }
        self.pump(&mut out);
        self.debug_check();
        out
    }

    /// The fence of a lost worker will not come: its tasks that waited for
    /// it (`tasks`) fail with ENDPOINT_FAILURE and `why`.
    pub fn abandon(&mut self, tasks: &[TaskId], why: &str) -> Vec<Action> {
        let mut out = Vec::new();
        for &id in tasks {
            if let Some(State::Fencing(w)) = self.tasks.get(&id).map(|t| t.state.clone()) {
                self.done(
                    id,
                    0,
                    Some(w),
                    Outcome::EndpointFailure(FailureCause::new(FailureKind::WorkerLost, why)),
                    &mut out,
                );
            }
        }
        self.debug_check();
        out
    }

    /// Cancels a task that is not running.
    ///
    /// # Errors
    /// When it is running or unknown.
    pub fn cancel(&mut self, task: TaskId) -> Result<Vec<Action>, CancelError> {
        let state = self
            .tasks
            .get(&task)
            .map(|t| t.state.clone())
            .ok_or(CancelError::Unknown(task))?;
        match state {
            State::Running { .. } => Err(CancelError::Running(task)),
            State::Fencing(worker) => Err(CancelError::Fencing { task, worker }),
            State::Queued(ws) => {
                let key = self
                    .tasks
                    .get(&task)
                    .map_or(queue::Key::unqueued(task), |t| t.key);
                for w in ws {
                    if let Some(worker) = self.workers.get_mut(&w) {
                        worker.queue.remove(key);
                    }
                }
                self.unqueue_backlog(task);
                self.tasks.remove(&task);
                let mut out = vec![Action::Done {
                    task,
                    outcome: Outcome::Cancelled,
                }];
                self.pump(&mut out);
                Ok(out)
            }
            State::Waiting => {
                self.tasks.remove(&task);
                Ok(vec![Action::Done {
                    task,
                    outcome: Outcome::Cancelled,
                }])
            }
        }
    }

    /// The first failure seen.
    pub fn first_error(&self) -> Option<&FirstError> {
        self.first_error.as_ref()
    }

    /// Records `outcome` as a run's failure if it is the first (the DAG's
    /// skips are not failures of their own).
    pub fn note_failure(
        &mut self,
        task: TaskId,
        callable: KernelHandle,
        worker: Option<WorkerId>,
        outcome: &Outcome,
    ) {
        if !matches!(
            outcome,
            Outcome::Success | Outcome::Skipped { .. } | Outcome::Cancelled
        ) && self.first_error.is_none()
        {
            self.first_error = Some(FirstError {
                task,
                callable,
                worker,
                outcome: outcome.clone(),
            });
        }
    }

    /// Tasks queued or running on `worker`.
    pub fn outstanding(&self, worker: WorkerId) -> usize {
        self.workers
            .get(&worker)
            .map_or(0, |w| w.queue.len() + w.in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upward ranks against the longest path computed by brute force, on
    /// random graphs of tasks with declared costs linked as they are
    /// submitted: no kept rank exceeds its longest modelled path, and
    /// along every edge a rank covers the path through its successor to
    /// within [`RANK_SLACK`] (what priorities rely on: a task ranks above
    /// what comes after it).
    #[test]
    fn ranks_cover_the_paths_below_them_to_within_the_slack() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200 {
            let mut s = Scheduler::with_policy(Policy::Dmdas);
            let n = 5 + next(40) as usize;
            let mut cost = Vec::new();
            let mut preds: Vec<Vec<usize>> = Vec::new();
            for i in 0..n {
                let flops = 1_000 * (1 + next(50));
                let work = Work {
                    flops: Some(flops),
                    ..Work::default()
                };
                s.submit(
                    TaskId(i as u64),
                    vec![MemberInfo {
                        callable: KernelHandle([1; 16]),
                        placement: Placement::Any,
                        device_buffers: Vec::new(),
                        needs: Capabilities::NONE,
                        work,
                    }],
                );
                let mut p: Vec<usize> = (0..next(4))
                    .filter(|_| i > 0)
                    .map(|_| i - 1 - next(i.min(6) as u64) as usize)
                    .collect();
                p.sort_unstable();
                p.dedup();
                let edges: Vec<(TaskId, u8)> = p.iter().map(|&q| (TaskId(q as u64), 0)).collect();
                s.link(TaskId(i as u64), &edges);
                cost.push(s.tasks[&TaskId(i as u64)].cost);
                preds.push(p);
            }
            // The longest path from each task to the end, by brute force.
            let mut longest = cost.clone();
            for v in (0..n).rev() {
                for &u in &preds[v] {
                    longest[u] = longest[u].max(cost[u] + longest[v]);
                }
            }
            let rank = |i: usize| s.tasks[&TaskId(i as u64)].rank;
            for v in 0..n {
                assert!(
                    rank(v) <= longest[v] * (1.0 + 1e-12),
                    "round {round}: task {v} ranks {} above its longest path {}",
                    rank(v),
                    longest[v]
                );
                for &u in &preds[v] {
                    assert!(
                        rank(u) * (1.0 + RANK_SLACK) >= cost[u] + rank(v) - 1e-6,
                        "round {round}: task {u} ranks {} under {} + {} through {v}",
                        rank(u),
                        cost[u],
                        rank(v)
                    );
                }
            }
        }
    }
}
