//! The DAG builder and the scheduler, composed: what the orchestrator's
//! DAG/scheduler actor owns. [`Event`]s go in through one door,
//! [`Engine::on_event`], and [`Action`]s come out; no IO, no clocks. The
//! orchestrator's actor and the differential simulator (`sim`) enter by
//! that same door; everything else on an engine only reads.
//!
//! Flow: a submission (a task already checked, [`CheckedTask`]) has its
//! placement checked against the workers up and is inserted into the DAG
//! ([`Action::Accepted`] with its edges, or [`Action::Refused`]); a ready task
//! goes to the scheduler, which dispatches it when its worker has room.
//! `finished` (one call per member) ends a task in the scheduler, then in
//! the DAG (complete or fail), whose transitions make more tasks ready or
//! skip them. Losing a worker fails what ran there.
//!
//! Quarantine (docs/reliability.md, quarantine). A loss is *fenced* when the worker can no
//! longer touch task memory (the caller saw it dead, or its bytes were
//! staged copies); otherwise the tasks it was running may still write.
//! Each such task is reported [`Action::Quarantined`] — the driver then
//! refuses its own reads and writes of the task's written bytes — and,
//! once it finishes, is *lost* in the DAG rather than failed: writers of
//! its bytes wait ([`crate::dag::Dag::lose`]). A task allowed to retry
//! instead waits in the scheduler, still running as far as the DAG
//! knows. Each loss is numbered per worker (its *epoch*, 1 for the first);
//! [`Event::Fenced`] with that number lifts the quarantine of the loss's
//! tasks ([`Action::Lifted`]; waiting writers go on, retries are placed),
//! and [`Event::Abandoned`] gives up on the fence: what waits fails with a
//! cause naming the quarantine, the lost worker and the lost task, and
//! later writers of those bytes are refused until a late fence.

use rustc_hash::FxHashMap as HashMap;

use strata_boundary::{Capabilities, FailureCause, FailureKind};
use strata_wire::CanonicalIdentity;

pub use crate::action::{Action, Edges, Loss, Refusal};
use crate::dag::{Born, CheckedTask, Dag, SubmitError, SubmitReason, Transition};
use crate::ids::{KernelHandle, ScopeId, TaskId, WorkerId};
use crate::sched::{CancelError, FirstError, MemberInfo, Outcome, Scheduler};

/// Something that happened, for [`Engine::on_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The driver submitted a task: [`Action::Accepted`] (then what it
    /// started) or [`Action::Refused`].
    Submit(Submission),
    /// The driver cancels a task that has not started: its `Done` as
    /// [`Outcome::Cancelled`] (and what that skips), or
    /// [`Action::Refused`] when it is running, finished or unknown.
    Cancel(TaskId),
    /// A worker came up (or back) offering these callables, whose tasks may
    /// use these capabilities, taking at most `window` tasks at a time.
    WorkerUp {
        /// The worker.
        worker: WorkerId,
        /// Its callables.
        callables: Vec<KernelHandle>,
        /// What its tasks may use: only a member whose
        /// [`MemberInfo::needs`] these cover is placed there.
        capabilities: Capabilities,
        /// Its in-flight window.
        window: usize,
    },
    /// A worker was lost (`cause` says how); `fenced` when it can no
    /// longer touch task memory, so that tasks allowed to retry are placed
    /// again. Otherwise what it was running is quarantined (module docs)
    /// under this loss, numbered [`Engine::losses`] after it.
    WorkerLost {
        /// The worker.
        worker: WorkerId,
        /// Why.
        cause: String,
        /// It can no longer touch task memory.
        fenced: bool,
    },
    /// A member of a dispatched task reported.
    Finished {
        /// The task.
        task: TaskId,
        /// Which member.
        member: usize,
        /// Its result; the error is the cause.
        result: Result<(), FailureCause>,
    },
    /// Member `member` of `task` ran past its timeout on its worker. Its
    /// task fails with TASK_FAILURE and `cause` (never retried) once the
    /// worker's loss, which must follow ([`Event::WorkerLost`]: a kernel
    /// cannot be trusted to stop), ends it; that loss quarantines its
    /// bytes like any other when it has no fence. Nothing for a member not
    /// in flight.
    TimedOut {
        /// The task.
        task: TaskId,
        /// Which member.
        member: usize,
        /// Why, in words (saying it timed out).
        cause: String,
    },
    /// Loss `epoch` of `worker` is fenced: its tasks can no longer write.
    /// Their quarantine lifts (once every loss that touched them is
    /// fenced): writers that waited go on, tasks allowed to retry are
    /// placed again. Unknown or repeated fences do nothing.
    Fenced {
        /// The worker.
        worker: WorkerId,
        /// Which of its losses.
        epoch: u64,
    },
    /// The fence of loss `epoch` of `worker` is given up on (`why` says
    /// why, e.g. the deadline that passed). Its tasks waiting to retry
    /// fail; writers waiting on its quarantined bytes fail, and later ones
    /// are refused, with a cause naming the quarantine, the worker and the
    /// lost task. A later fence still lifts it.
    Abandoned {
        /// The worker.
        worker: WorkerId,
        /// Which of its losses.
        epoch: u64,
        /// Why.
        why: String,
    },
    /// Where a DEVICE buffer lives (or no longer does): a placement hint.
    DeviceBuffer {
        /// The worker whose memory holds it.
        worker: WorkerId,
        /// The buffer.
        identity: CanonicalIdentity,
        /// Whether it is there now.
        present: bool,
    },
    /// The driver opens a scope: [`Action::ScopeOpened`].
    OpenScope,
    /// The driver registers a buffer in a scope ([`Action::Refused`] for
    /// an unknown or ended scope).
    ScopeBuffer {
        /// The scope.
        scope: ScopeId,
        /// The buffer.
        identity: CanonicalIdentity,
    },
    /// The driver ends a scope: its buffers no live task uses are
    /// released ([`Action::Refused`] for an unknown or ended scope).
    EndScope(ScopeId),
}

/// A task to submit: the DAG's view, checked, plus per member callable
/// and placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The DAG's view (id, member arguments, `after`), checked where it
    /// was built ([`Dag::check`]).
    pub task: CheckedTask,
    /// Per member: callable, placement, device buffers.
    pub members: Vec<MemberInfo>,
    /// Times it may run again elsewhere if its worker is lost while it
    /// runs (see [`Scheduler::allow_retries`]).
    pub retries: u32,
}

/// DAG + scheduler.
#[derive(Debug, Default)]
pub struct Engine {
    dag: Dag,
    sched: Scheduler,
    /// Losses so far, per worker.
    losses: HashMap<WorkerId, u64>,
    /// Tasks touched by a loss without a fence, until every such loss is
    /// fenced: lost in the DAG, waiting in the scheduler, or (a group) still
    /// finishing on other workers.
    unfenced: HashMap<TaskId, Vec<Loss>>,
    /// Losses whose fence was given up on, with the reason.
    abandoned: HashMap<Loss, String>,
    /// Scheduler actions not yet followed through the DAG, and those their
    /// transitions caused: buffers kept between events, so that a task's
    /// way through the engine allocates no `Vec` of actions.
    pending: Vec<Action>,
    next: Vec<Action>,
}

impl Engine {
    /// An empty engine without workers.
    pub fn new() -> Self {
        Engine::default()
    }

    /// An empty engine without workers whose scheduler places by `policy`.
    pub fn with_policy(policy: crate::sched::Policy) -> Self {
        Engine {
            sched: Scheduler::with_policy(policy),
            ..Engine::default()
        }
    }

    /// The scheduler, to feed its performance models
    /// ([`Scheduler::observe`], [`Scheduler::model_mut`]): nothing there
    /// changes what runs or when it is safe to, only where and in which
    /// order.
    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.sched
    }

    /// The DAG, for inspection.
    pub fn dag(&self) -> &Dag {
        &self.dag
    }

    /// The scheduler, for inspection.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// The first failure of the run.
    pub fn first_error(&self) -> Option<&FirstError> {
        self.sched.first_error()
    }

    /// Applies one event and returns what to do next: the one way to
    /// drive an engine.
    pub fn on_event(&mut self, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        self.on_event_into(event, &mut out);
        out
    }

    /// [`Engine::on_event`], appending the actions to `out`: the same
    /// door for a caller that reuses one buffer across events.
    pub fn on_event_into(&mut self, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::Submit(s) => {
                if let Err(e) = self.on_submit(s, out) {
                    out.push(Action::Refused(Refusal::Submit(e)));
                }
            }
            Event::Cancel(task) => {
                if let Err(error) = self.on_cancel(task, out) {
                    out.push(Action::Refused(Refusal::Cancel(error)));
                }
            }
            Event::WorkerUp {
                worker,
                callables,
                capabilities,
                window,
            } => {
                let up = self
                    .sched
                    .worker_up(worker, callables, capabilities, window);
                self.follow_these(up, out);
            }
            Event::WorkerLost {
                worker,
                cause,
                fenced,
            } => self.on_worker_lost(worker, &cause, fenced, out),
            Event::Finished {
                task,
                member,
                result,
            } => {
                self.sched
                    .finished_into(task, member, result, &mut self.pending);
                self.follow(out);
            }
            Event::TimedOut {
                task,
                member,
                cause,
            } => self.sched.timed_out(task, member, &cause),
            Event::Fenced { worker, epoch } => self.on_fence(worker, epoch, out),
            Event::Abandoned { worker, epoch, why } => self.on_abandon(worker, epoch, &why, out),
            Event::DeviceBuffer {
                worker,
                identity,
                present,
            } => self.sched.device_buffer(worker, identity, present),
            Event::OpenScope => out.push(Action::ScopeOpened(self.dag.open_scope())),
            Event::ScopeBuffer { scope, identity } => {
                if let Err(error) = self.dag.scope_buffer(scope, identity) {
                    out.push(Action::Refused(Refusal::Scope(error)));
                }
            }
            Event::EndScope(scope) => match self.dag.end_scope(scope) {
                Ok(t) => self.transitions(t, out),
                Err(error) => out.push(Action::Refused(Refusal::Scope(error))),
            },
        }
    }

    fn on_worker_lost(
        &mut self,
        worker: WorkerId,
        cause: &str,
        fenced: bool,
        out: &mut Vec<Action>,
    ) {
        let epoch = {
            let e = self.losses.entry(worker).or_insert(0);
            *e += 1;
            *e
        };
        if !fenced {
            let loss = Loss { worker, epoch };
            let mut running = self.sched.running_on(worker);
            running.sort_unstable();
            for task in running {
                self.unfenced.entry(task).or_default().push(loss);
                out.push(Action::Quarantined { task, loss });
            }
        }
        let sched = self.sched.worker_lost(worker, cause, fenced);
        self.follow_these(sched, out);
    }

    /// How many times `worker` was lost.
    pub fn losses(&self, worker: WorkerId) -> u64 {
        self.losses.get(&worker).copied().unwrap_or(0)
    }

    /// Tasks whose bytes are quarantined by a loss not fenced yet.
    pub fn quarantined(&self) -> usize {
        self.unfenced.len()
    }

    fn tasks_of(&self, loss: Loss) -> Vec<TaskId> {
        let mut tasks: Vec<TaskId> = self
            .unfenced
            .iter()
            .filter(|(_, ls)| ls.contains(&loss))
            .map(|(t, _)| *t)
            .collect();
        tasks.sort_unstable();
        tasks
    }

    /// [`Event::Fenced`].
    fn on_fence(&mut self, worker: WorkerId, epoch: u64, out: &mut Vec<Action>) {
        let loss = Loss { worker, epoch };
        self.abandoned.remove(&loss);
        let mut retry = Vec::new();
        let mut transitions = Vec::new();
        for task in self.tasks_of(loss) {
            let Some(ls) = self.unfenced.get_mut(&task) else {
                continue;
            };
            ls.retain(|l| *l != loss);
            if !ls.is_empty() {
                continue;
            }
            self.unfenced.remove(&task);
            out.push(Action::Lifted { task });
            if self.dag.is_lost(task) {
                transitions.extend(self.dag.lift(task).unwrap_or_default());
            } else if self.sched.is_fencing(task) {
                retry.push(task);
            }
        }
        let placed = self.sched.fence(&retry);
        self.follow_these(placed, out);
        self.transitions(transitions, out);
    }

    /// [`Event::Abandoned`].
    fn on_abandon(&mut self, worker: WorkerId, epoch: u64, why: &str, out: &mut Vec<Action>) {
        let loss = Loss { worker, epoch };
        let tasks = self.tasks_of(loss);
        if tasks.is_empty() {
            return;
        }
        self.abandoned.insert(loss, why.to_string());
        let fencing: Vec<TaskId> = tasks
            .iter()
            .copied()
            .filter(|t| self.sched.is_fencing(*t))
            .collect();
        let cause = format!(
            "{worker} was lost while running the task and never proved it ended, so it \
             was not retried: {why}"
        );
        let failed = self.sched.abandon(&fencing, &cause);
        self.follow_these(failed, out);
        let mut transitions = Vec::new();
        for task in tasks {
            if self.dag.is_lost(task) {
                transitions.extend(self.dag.abandon(task).unwrap_or_default());
            }
        }
        self.transitions(transitions, out);
    }

    /// Why a task that writes bytes quarantined by `lost` fails.
    fn quarantine_cause(&self, lost: TaskId) -> FailureCause {
        let loss = self.unfenced.get(&lost).and_then(|ls| {
            ls.iter()
                .find(|l| self.abandoned.contains_key(l))
                .or(ls.first())
        });
        let message = match loss {
            Some(l) => format!(
                "writes bytes quarantined by {lost}, which was lost on {} without a fence \
                 and may still write them; gave up waiting: {}",
                l.worker,
                self.abandoned.get(l).map_or("no fence", String::as_str)
            ),
            None => format!("writes bytes quarantined by {lost}, lost without a fence"),
        };
        FailureCause::new(FailureKind::Quarantined, message)
    }

    /// [`Event::Submit`]: the placement against the workers up, then the
    /// DAG (which checks only that ids increase: the rest was checked when
    /// the task was built).
    fn on_submit(&mut self, s: Submission, out: &mut Vec<Action>) -> Result<(), SubmitError> {
        let id = s.task.id();
        if s.members.len() != s.task.task().members.len() {
            return Err(SubmitError {
                task: id,
                reason: SubmitReason::PlacementCount {
                    placements: s.members.len(),
                    members: s.task.task().members.len(),
                },
            });
        }
        self.sched
            .check_placeable(&s.members)
            .map_err(|e| SubmitError {
                task: id,
                reason: e.into(),
            })?;
        let inserted = self.dag.insert(s.task)?;
        if matches!(inserted.born, Born::Waiting | Born::Ready) {
            self.sched.submit(id, s.members);
            self.sched.link(id, &inserted.edges);
            if s.retries > 0 {
                self.sched.allow_retries(id, s.retries);
            }
        }
        out.push(Action::Accepted {
            task: id,
            edges: inserted.edges,
        });
        match inserted.born {
            Born::Skipped { because } => out.push(Action::Done {
                task: id,
                outcome: Outcome::Skipped { because },
            }),
            Born::Quarantined { lost } => out.push(Action::Done {
                task: id,
                outcome: Outcome::EndpointFailure(self.quarantine_cause(lost)),
            }),
            Born::Waiting => {}
            Born::Ready => {
                self.sched.ready_into(id, &mut self.pending);
                self.follow(out);
            }
        }
        Ok(())
    }

    /// [`Event::Cancel`].
    fn on_cancel(&mut self, task: TaskId, out: &mut Vec<Action>) -> Result<(), CancelError> {
        let transitions = self.dag.cancel(task)?;
        let cancelled = self.sched.cancel(task)?;
        self.follow_these(cancelled, out);
        self.transitions(transitions, out);
        Ok(())
    }

    /// Follows the scheduler's actions in `self.pending` through the DAG
    /// until nothing changes, appending them to `out`: dispatches mark
    /// tasks running; finished tasks complete or fail in the DAG, whose
    /// transitions feed the scheduler again (the next round).
    fn follow(&mut self, out: &mut Vec<Action>) {
        let mut pending = std::mem::take(&mut self.pending);
        let mut next = std::mem::take(&mut self.next);
        while !pending.is_empty() {
            for a in pending.drain(..) {
                match a {
                    Action::Dispatch { task, member, .. } => {
                        if member == 0 {
                            let _ = self.dag.start(task);
                        }
                        out.push(a);
                    }
                    Action::Done { task, outcome } => {
                        let transitions = if outcome.is_success() {
                            self.dag.complete(task)
                        } else if outcome == Outcome::Cancelled {
                            Ok(Vec::new())
                        } else if self.unfenced.contains_key(&task) {
                            self.dag.lose(task)
                        } else {
                            self.dag.fail(task)
                        };
                        out.push(Action::Done { task, outcome });
                        self.apply(transitions.unwrap_or_default(), out, &mut next);
                    }
                    // The scheduler asks for nothing else.
                    other => out.push(other),
                }
            }
            std::mem::swap(&mut pending, &mut next);
        }
        self.pending = pending;
        self.next = next;
    }

    /// [`Engine::follow`] for actions the scheduler returned in a `Vec`
    /// of their own (its rarer calls: a worker up or lost, a fence).
    fn follow_these(&mut self, actions: Vec<Action>, out: &mut Vec<Action>) {
        self.pending.extend(actions);
        self.follow(out);
    }

    fn transitions(&mut self, ts: Vec<Transition>, out: &mut Vec<Action>) {
        let mut sched_actions = std::mem::take(&mut self.pending);
        self.apply(ts, out, &mut sched_actions);
        self.pending = sched_actions;
        self.follow(out);
    }

    /// Feeds DAG transitions to the scheduler: ready tasks are placed (the
    /// scheduler's actions go to `sched_actions`), skipped ones finish,
    /// released buffers are reported in `out`.
    fn apply(
        &mut self,
        ts: Vec<Transition>,
        out: &mut Vec<Action>,
        sched_actions: &mut Vec<Action>,
    ) {
        for t in ts {
            match t {
                Transition::Ready(r) => self.sched.ready_into(r, sched_actions),
                Transition::Skipped { task, because } => {
                    self.sched.forget(task);
                    out.push(Action::Done {
                        task,
                        outcome: Outcome::Skipped { because },
                    });
                }
                Transition::Release(b) => out.push(Action::Release(b)),
                Transition::Quarantined { task, lost } => {
                    self.sched.forget(task);
                    out.push(Action::Done {
                        task,
                        outcome: Outcome::EndpointFailure(self.quarantine_cause(lost)),
                    });
                }
            }
        }
    }
}
