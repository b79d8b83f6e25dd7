//! The DAG builder and the scheduler, composed: what the orchestrator's
//! DAG/scheduler actor owns. Calls go in, [`Action`]s come out; no IO, no
//! clocks.
//!
//! Flow: `submit` checks placement and inserts into the DAG; a ready task
//! goes to the scheduler, which dispatches it when its worker has room.
//! `finished` (one call per member) ends a task in the scheduler, then in
//! the DAG (complete or fail), whose transitions make more tasks ready or
//! skip them. Losing a worker fails what ran there.
//!
//! Quarantine (DESIGN §7). A loss is *fenced* when the worker can no
//! longer touch task memory (the caller saw it dead, or its bytes were
//! staged copies); otherwise the tasks it was running may still write.
//! Each such task is reported [`Action::Quarantined`] — the driver then
//! refuses its own reads and writes of the task's written bytes — and,
//! once it finishes, is *lost* in the DAG rather than failed: writers of
//! its bytes wait ([`crate::dag::Dag::lose`]). A task allowed to retry
//! instead waits in the scheduler, still running as far as the DAG
//! knows. Each loss is numbered per worker (its *epoch*, 1 for the first);
//! [`Engine::fence`] with that number lifts the quarantine of the loss's
//! tasks ([`Action::Lifted`]; waiting writers go on, retries are placed),
//! and [`Engine::abandon`] gives up on the fence: what waits fails with a
//! cause naming the quarantine, the lost worker and the lost task, and
//! later writers of those bytes are refused until a late fence.

use std::collections::HashMap;

use strata_wire::CanonicalIdentity;

use crate::dag::{Born, Dag, NewTask, ScopeError, SubmitError, SubmitReason, Transition};
use crate::ids::{CallableId, ScopeId, TaskId, WorkerId};
use crate::sched::{self, CancelError, FirstError, MemberInfo, Outcome, Scheduler};

/// What the engine asks its owner to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send member `member` of `task` to `worker`.
    Dispatch {
        /// The task.
        task: TaskId,
        /// Which member.
        member: usize,
        /// Where.
        worker: WorkerId,
    },
    /// The task is finished, with this outcome.
    Done {
        /// The task.
        task: TaskId,
        /// How it ended.
        outcome: Outcome,
    },
    /// A scoped buffer is no longer used: release it.
    Release(CanonicalIdentity),
    /// The task was running on a worker lost without a fence: the bytes it
    /// writes are quarantined until [`Action::Lifted`]. Comes before the
    /// task's `Done` (if it is done now; a task allowed to retry waits).
    Quarantined {
        /// The task.
        task: TaskId,
        /// The loss.
        loss: Loss,
    },
    /// The loss that quarantined the task's bytes is fenced: the task can
    /// no longer write them.
    Lifted {
        /// The task.
        task: TaskId,
    },
}

/// One loss of a worker: the worker and how many times it had been lost
/// by then (1 for the first loss).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loss {
    /// The worker.
    pub worker: WorkerId,
    /// Its loss count at this loss.
    pub epoch: u64,
}

/// Something that happened, for [`Engine::on_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A worker came up (or back) offering these callables, taking at most
    /// `window` tasks at a time.
    WorkerUp {
        /// The worker.
        worker: WorkerId,
        /// Its callables.
        callables: Vec<CallableId>,
        /// Its in-flight window.
        window: usize,
    },
    /// A worker was lost.
    WorkerDown {
        /// The worker.
        worker: WorkerId,
        /// Why.
        cause: String,
    },
    /// A member of a dispatched task reported.
    Finished {
        /// The task.
        task: TaskId,
        /// Which member.
        member: usize,
        /// Its result; the error is the cause.
        result: Result<(), String>,
    },
}

/// A task to submit: the DAG's view plus, per member, callable and placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The DAG's view (id, member arguments, `after`).
    pub task: NewTask,
    /// Per member: callable, placement, device buffers.
    pub members: Vec<MemberInfo>,
}

/// A task's predecessors with the kinds of each edge (bits of
/// [`crate::dag::edge`]).
pub type Edges = Vec<(TaskId, u8)>;

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
}

impl Engine {
    /// An empty engine without workers.
    pub fn new() -> Self {
        Engine::default()
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

    /// Applies one event and returns what to do next.
    pub fn on_event(&mut self, event: Event) -> Vec<Action> {
        match event {
            Event::WorkerUp {
                worker,
                callables,
                window,
            } => self.worker_up(worker, callables, window),
            Event::WorkerDown { worker, cause } => self.worker_down(worker, &cause),
            Event::Finished {
                task,
                member,
                result,
            } => self.finished(task, member, result),
        }
    }

    /// A worker came up (or back).
    pub fn worker_up(
        &mut self,
        worker: WorkerId,
        callables: impl IntoIterator<Item = CallableId>,
        window: usize,
    ) -> Vec<Action> {
        let out = self.sched.worker_up(worker, callables, window);
        self.after_sched(out)
    }

    /// A worker was lost.
    pub fn worker_down(&mut self, worker: WorkerId, cause: &str) -> Vec<Action> {
        let out = self.sched.worker_down(worker, cause);
        self.after_sched(out)
    }

    /// A worker was lost; `fenced` when it can no longer touch task
    /// memory, so that tasks allowed to retry are placed again. Otherwise
    /// what it was running is quarantined (module docs) under this loss,
    /// numbered [`Engine::losses`] after the call.
    pub fn worker_lost(&mut self, worker: WorkerId, cause: &str, fenced: bool) -> Vec<Action> {
        let epoch = {
            let e = self.losses.entry(worker).or_insert(0);
            *e += 1;
            *e
        };
        let mut out = Vec::new();
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
        out.extend(self.after_sched(sched));
        out
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

    /// Loss `epoch` of `worker` is fenced: its tasks can no longer write.
    /// Their quarantine lifts (once every loss that touched them is
    /// fenced): writers that waited go on, tasks allowed to retry are
    /// placed again. Unknown or repeated fences do nothing.
    pub fn fence(&mut self, worker: WorkerId, epoch: u64) -> Vec<Action> {
        let loss = Loss { worker, epoch };
        self.abandoned.remove(&loss);
        let mut out = Vec::new();
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
        out.extend(self.after_sched(placed));
        out.extend(self.transitions(transitions));
        out
    }

    /// Gives up on the fence of loss `epoch` of `worker` (`why` says why,
    /// e.g. the deadline that passed). Its tasks waiting to retry fail;
    /// writers waiting on its quarantined bytes fail, and later ones are
    /// refused, with a cause naming the quarantine, the worker and the lost
    /// task. A later [`Engine::fence`] still lifts it.
    pub fn abandon(&mut self, worker: WorkerId, epoch: u64, why: &str) -> Vec<Action> {
        let loss = Loss { worker, epoch };
        let tasks = self.tasks_of(loss);
        if tasks.is_empty() {
            return Vec::new();
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
        let mut out = self.after_sched(failed);
        let mut transitions = Vec::new();
        for task in tasks {
            if self.dag.is_lost(task) {
                transitions.extend(self.dag.abandon(task).unwrap_or_default());
            }
        }
        out.extend(self.transitions(transitions));
        out
    }

    /// Why a task that writes bytes quarantined by `lost` fails.
    fn quarantine_cause(&self, lost: TaskId) -> String {
        let loss = self.unfenced.get(&lost).and_then(|ls| {
            ls.iter()
                .find(|l| self.abandoned.contains_key(l))
                .or(ls.first())
        });
        match loss {
            Some(l) => format!(
                "writes bytes quarantined by {lost}, which was lost on {} without a fence \
                 and may still write them; gave up waiting: {}",
                l.worker,
                self.abandoned.get(l).map_or("no fence", String::as_str)
            ),
            None => format!("writes bytes quarantined by {lost}, lost without a fence"),
        }
    }

    /// Lets a submitted task be run again elsewhere, up to `retries`
    /// times, if its worker is lost while it runs (see
    /// [`Scheduler::allow_retries`]).
    pub fn allow_retries(&mut self, task: TaskId, retries: u32) {
        self.sched.allow_retries(task, retries);
    }

    /// Records where a DEVICE buffer lives (placement hint).
    pub fn device_buffer(&mut self, worker: WorkerId, identity: CanonicalIdentity, present: bool) {
        self.sched.device_buffer(worker, identity, present);
    }

    /// Submits a task.
    ///
    /// # Errors
    /// The DAG's submit checks, or a placement that cannot work (unknown
    /// worker, callable not registered there or anywhere, members that do
    /// not match).
    pub fn submit(&mut self, s: Submission) -> Result<Vec<Action>, SubmitError> {
        self.submit_with_edges(s).map(|(actions, _)| actions)
    }

    /// Submits a task and also returns its edges: each live predecessor
    /// with the kinds of the edge (bits of [`crate::dag::edge`]).
    ///
    /// # Errors
    /// As [`Engine::submit`].
    pub fn submit_with_edges(
        &mut self,
        s: Submission,
    ) -> Result<(Vec<Action>, Edges), SubmitError> {
        let id = s.task.id;
        if s.members.len() != s.task.members.len() {
            return Err(SubmitError {
                task: id,
                reason: SubmitReason::PlacementCount {
                    placements: s.members.len(),
                    members: s.task.members.len(),
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
        let actions = match inserted.born {
            Born::Skipped { because } => vec![Action::Done {
                task: id,
                outcome: Outcome::Skipped { because },
            }],
            Born::Quarantined { lost } => vec![Action::Done {
                task: id,
                outcome: Outcome::EndpointFailure(self.quarantine_cause(lost)),
            }],
            Born::Waiting => {
                self.sched.submit(id, s.members);
                Vec::new()
            }
            Born::Ready => {
                self.sched.submit(id, s.members);
                let out = self.sched.ready(id);
                self.after_sched(out)
            }
        };
        Ok((actions, inserted.edges))
    }

    /// A member reported its result.
    pub fn finished(
        &mut self,
        task: TaskId,
        member: usize,
        result: Result<(), String>,
    ) -> Vec<Action> {
        let out = self.sched.finished(task, member, result);
        self.after_sched(out)
    }

    /// Cancels a task that has not started.
    ///
    /// # Errors
    /// When it is running, finished or unknown.
    pub fn cancel(&mut self, task: TaskId) -> Result<Vec<Action>, CancelError> {
        let transitions = self.dag.cancel(task)?;
        let cancelled = self.sched.cancel(task)?;
        let mut out = self.after_sched(cancelled);
        out.extend(self.transitions(transitions));
        Ok(out)
    }

    /// Opens a scope.
    pub fn open_scope(&mut self) -> ScopeId {
        self.dag.open_scope()
    }

    /// Registers a buffer in a scope.
    ///
    /// # Errors
    /// An unknown or ended scope.
    pub fn scope_buffer(
        &mut self,
        scope: ScopeId,
        identity: CanonicalIdentity,
    ) -> Result<(), ScopeError> {
        self.dag.scope_buffer(scope, identity)
    }

    /// Ends a scope.
    ///
    /// # Errors
    /// An unknown or ended scope.
    pub fn end_scope(&mut self, scope: ScopeId) -> Result<Vec<Action>, ScopeError> {
        let t = self.dag.end_scope(scope)?;
        Ok(self.transitions(t))
    }

    /// Follows scheduler actions through the DAG until nothing changes:
    /// dispatches mark tasks running; finished tasks complete or fail in the
    /// DAG, whose transitions feed the scheduler again.
    fn after_sched(&mut self, mut pending: Vec<sched::Action>) -> Vec<Action> {
        let mut out = Vec::new();
        while !pending.is_empty() {
            let mut next = Vec::new();
            for a in pending {
                match a {
                    sched::Action::Dispatch {
                        task,
                        member,
                        worker,
                    } => {
                        if member == 0 {
                            let _ = self.dag.start(task);
                        }
                        out.push(Action::Dispatch {
                            task,
                            member,
                            worker,
                        });
                    }
                    sched::Action::Done { task, outcome } => {
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
                        next.extend(self.apply(transitions.unwrap_or_default(), &mut out));
                    }
                }
            }
            pending = next;
        }
        out
    }

    fn transitions(&mut self, ts: Vec<Transition>) -> Vec<Action> {
        let mut out = Vec::new();
        let sched_actions = self.apply(ts, &mut out);
        out.extend(self.after_sched(sched_actions));
        out
    }

    /// Feeds DAG transitions to the scheduler: ready tasks are placed (the
    /// scheduler's actions are returned), skipped ones finish, released
    /// buffers are reported in `out`.
    fn apply(&mut self, ts: Vec<Transition>, out: &mut Vec<Action>) -> Vec<sched::Action> {
        let mut sched_actions = Vec::new();
        for t in ts {
            match t {
                Transition::Ready(r) => sched_actions.extend(self.sched.ready(r)),
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
        sched_actions
    }
}
