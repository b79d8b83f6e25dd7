//! Deferred write-back: bytes a task wrote on a local staged chip may stay
//! there, dirty, and go to host memory only when someone needs them.
//!
//! - **Who keeps bytes dirty.** A member on a worker that maps host
//!   buffers and caches ([`EndpointRef::keeps_dirty`]) writes its host
//!   arguments `deferred`; the directory records the byte set as dirty on
//!   that worker once the member succeeded.
//! - **Before a member is sent**, every dirty byte set sharing a byte with
//!   one of its (ordered, host) arguments is written back by its worker —
//!   but for the argument's own byte set on the member's own worker, which
//!   the chip hands over in place. The member waits (it is *parked*) until
//!   the workers answered; flushes already asked for are joined, not asked
//!   again.
//! - **Waits.** A wait that returns has every dirty byte written back: a
//!   wait for one task, or for all, first has every worker flush what it
//!   holds dirty (one round; what finishes meanwhile is not waited for).
//! - **A lost worker** takes its dirty bytes with it: they are recorded as
//!   lost, the run's wait reports the task that wrote them, and any member
//!   that would read them later (or update them in place) fails instead of
//!   running on stale host bytes, until a task writes that exact byte set
//!   again (an `OUTPUT` may).
//!
//! Everything here runs on the DAG actor; the flushes themselves go out
//! with the step's dispatches ([`DagActor::flush`]) and come back as
//! [`Notice::Flushed`].

use smallvec::SmallVec;
use strata_orchestrator_core::residency::{Dirty, ToFlush};
use strata_orchestrator_core::{FailureCause, FailureKind, Outcome, TaskId, WorkerId};
use strata_wire::{ArgTag, Footprint, Overlap};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::DagActor;
use crate::actors::{DispatchItem, EpCmd};
use crate::error::RunError;

/// Bytes lost with a worker before they were written back.
#[derive(Debug, Clone)]
pub(super) struct Lost {
    fp: Footprint,
    writer: TaskId,
    worker: WorkerId,
    /// The writer's error.
    error: RunError,
}

/// What waits for flushes.
pub(super) enum Then {
    /// A member to send once its bytes are in host memory.
    Dispatch {
        worker: WorkerId,
        rejoins: u64,
        item: DispatchItem,
    },
    /// A task's waiters.
    Reply {
        task: TaskId,
        waiters: Vec<oneshot::Sender<Result<(), RunError>>>,
        result: Result<(), RunError>,
    },
    /// `wait_all`.
    All,
}

/// Work waiting for flush tokens.
pub(super) struct Round {
    tokens: SmallVec<[u64; 2]>,
    then: Then,
}

/// The write-back state of the DAG actor.
#[derive(Default)]
pub(super) struct WriteBack {
    /// Flushes asked for and not yet answered, by token: what each
    /// writes back.
    asked: rustc_hash::FxHashMap<u64, Vec<ToFlush>>,
    /// The token of the flush asked for each dirty byte set (at its
    /// version), so that members needing it join that flush.
    by_slot: rustc_hash::FxHashMap<(Footprint, u64), u64>,
    last_token: u64,
    /// Flush commands to send with the step's dispatches.
    pub(super) out: Vec<(WorkerId, EpCmd)>,
    rounds: Vec<Round>,
    /// Bytes lost with their worker.
    lost: Vec<Lost>,
    /// Callables of tasks whose writes are dirty (for errors naming them).
    pub(super) writers: rustc_hash::FxHashMap<TaskId, String>,
    /// A round for `wait_all` is under way.
    all_round: bool,
}

impl DagActor {
    /// Whether bytes may be dirty anywhere now.
    fn any_dirty(&self) -> bool {
        self.directory.as_ref().is_some_and(|d| d.dirty_len() > 0)
    }

    /// Sends `item` to `worker` with the step's batch, once every dirty
    /// byte it touches elsewhere is written back; fails it at once when
    /// it touches lost bytes.
    pub(super) fn route(&mut self, worker: WorkerId, mut item: DispatchItem) {
        if self.directory.is_none() {
            return self.enqueue(worker, item);
        }
        if let Some(cause) = self.touches_lost(&item) {
            item.fail = Some(FailureCause::new(FailureKind::WorkerLost, cause));
            return self.enqueue(worker, item);
        }
        let mut need = Vec::new();
        if let Some(dir) = &mut self.directory
            && dir.dirty_len() > 0
        {
            for (i, a) in item.args.iter().enumerate() {
                if a.tag == ArgTag::NoDep || !matches!(a.backing, crate::buffer::Backing::Host(_)) {
                    continue;
                }
                // Only an argument that uses the chip's cache finds its own
                // dirty copy there.
                let own = item
                    .cache
                    .iter()
                    .any(|c| c.index as usize == i)
                    .then_some(worker);
                dir.to_flush(&Footprint::of(&a.tensor), own, &mut need);
            }
        }
        if need.is_empty() {
            return self.enqueue(worker, item);
        }
        let tokens = self.ask(need);
        let rejoins = self
            .endpoints
            .get(worker.0 as usize)
            .map_or(0, |e| e.rejoins);
        debug!(task = %item.task, %worker, flushes = tokens.len(), "member waits for write-back");
        self.wb.rounds.push(Round {
            tokens,
            then: Then::Dispatch {
                worker,
                rejoins,
                item,
            },
        });
    }

    fn enqueue(&mut self, worker: WorkerId, item: DispatchItem) {
        if let Some(batch) = self.pending.get_mut(worker.0 as usize) {
            self.pending_n += 1;
            batch.push(item);
        }
    }

    /// Asks the workers holding `need` to write them back, joining
    /// flushes already asked for; the tokens to wait for.
    fn ask(&mut self, need: Vec<ToFlush>) -> SmallVec<[u64; 2]> {
        let mut tokens: SmallVec<[u64; 2]> = SmallVec::new();
        let mut fresh: rustc_hash::FxHashMap<WorkerId, Vec<ToFlush>> = Default::default();
        for f in need {
            match self.wb.by_slot.get(&(f.fp, f.version)) {
                Some(&t) => {
                    if !tokens.contains(&t) {
                        tokens.push(t);
                    }
                }
                None => fresh.entry(f.dirty.worker).or_default().push(f),
            }
        }
        for (worker, mut list) in fresh {
            // Just those byte sets, as views (at most a task's worth per
            // call).
            while !list.is_empty() {
                let rest = list.split_off(list.len().min(strata_wire::MAX_TENSORS));
                let chunk = std::mem::replace(&mut list, rest);
                self.wb.last_token += 1;
                let token = self.wb.last_token;
                let views = chunk.iter().map(|f| f.dirty.view).collect();
                for f in &chunk {
                    self.wb.by_slot.insert((f.fp, f.version), token);
                }
                self.wb.asked.insert(token, chunk);
                self.wb.out.push((worker, EpCmd::Flush { views, token }));
                tokens.push(token);
            }
        }
        tokens
    }

    /// A worker answered flush `token`: the bytes it wrote back, or
    /// `None` when it could not.
    pub(super) fn flushed(&mut self, token: u64, bytes: Option<u64>) {
        let list = self.wb.asked.remove(&token).unwrap_or_default();
        for f in &list {
            self.wb.by_slot.remove(&(f.fp, f.version));
        }
        if let Some(bytes) = bytes {
            for s in [&mut self.run, &mut self.totals] {
                // The worker's count of the bytes it wrote back.
                super::add(&mut s.from_device_bytes, bytes);
                super::add(&mut s.staged_bytes, bytes);
                s.write_backs += list.len() as u64;
            }
            if let Some(dir) = &mut self.directory {
                for f in &list {
                    dir.flushed(f);
                }
            }
        } else if let Some(dir) = &mut self.directory {
            // Not written back: the worker is lost (its loss hands over
            // the rest of what it held).
            let gone: Vec<ToFlush> = list.into_iter().filter(|f| dir.lose(f)).collect();
            self.record_lost(gone);
        }
        self.prune_writers();
        let mut ready = Vec::new();
        self.wb.rounds.retain_mut(|r| {
            r.tokens.retain(|t| *t != token);
            !r.tokens.is_empty() || {
                ready.push(std::mem::replace(&mut r.then, Then::All));
                false
            }
        });
        for then in ready {
            self.carry_out(then);
        }
    }

    fn carry_out(&mut self, then: Then) {
        match then {
            Then::Dispatch {
                worker,
                rejoins,
                item,
            } => {
                // A worker lost meanwhile had the member failed by the
                // engine; its new incarnation must not get it.
                if self.endpoints.get(worker.0 as usize).map(|e| e.rejoins) == Some(rejoins) {
                    self.route(worker, item);
                }
            }
            Then::Reply {
                task,
                waiters,
                result,
            } => {
                let result = result.and_then(|()| self.lost_by(task).map_or(Ok(()), Err));
                for w in waiters {
                    let _ = w.send(result.clone());
                }
            }
            Then::All => {
                self.wb.all_round = false;
                self.settle();
            }
        }
    }

    /// Answers a task's waiters once what is dirty is written back (at
    /// once for a task that did not succeed).
    pub(super) fn reply_after_write_back(
        &mut self,
        task: TaskId,
        waiters: Vec<oneshot::Sender<Result<(), RunError>>>,
        result: Result<(), RunError>,
    ) {
        if waiters.is_empty() {
            return;
        }
        if let Err(e) = result {
            for w in waiters {
                let _ = w.send(Err(e.clone()));
            }
            return;
        }
        let then = Then::Reply {
            task,
            waiters,
            result,
        };
        if !self.any_dirty() {
            return self.carry_out(then);
        }
        self.flush_all_then(then);
    }

    /// Asks for everything dirty to be written back, then `then`.
    fn flush_all_then(&mut self, then: Then) {
        let all = self
            .directory
            .as_ref()
            .map(|d| d.all_dirty())
            .unwrap_or_default();
        let tokens = self.ask(all);
        self.wb.rounds.push(Round { tokens, then });
    }

    /// For `wait_all`: whether its answer must wait for write-backs (then
    /// asked for; [`DagActor::settle`] runs again when they are done).
    pub(super) fn all_written_back(&mut self) -> bool {
        if self.wb.all_round {
            return false;
        }
        if !self.any_dirty() {
            return true;
        }
        self.wb.all_round = true;
        self.flush_all_then(Then::All);
        false
    }

    /// `worker` is lost: the bytes it held dirty are.
    pub(super) fn worker_lost(&mut self, worker: WorkerId) {
        let Some(dir) = &mut self.directory else {
            return;
        };
        let gone = dir.lost(worker);
        self.record_lost(gone);
        self.prune_writers();
    }

    fn record_lost(&mut self, gone: Vec<ToFlush>) {
        for f in gone {
            let err = self.lost_error(f.dirty.task, f.dirty.worker, &f.fp);
            warn!(task = %f.dirty.task, worker = %f.dirty.worker, "{err}");
            self.first_error.get_or_insert_with(|| err.clone());
            self.wb.lost.push(Lost {
                fp: f.fp,
                writer: f.dirty.task,
                worker: f.dirty.worker,
                error: err,
            });
        }
    }

    fn lost_error(&self, task: TaskId, worker: WorkerId, fp: &Footprint) -> RunError {
        let r = fp.byte_range();
        RunError {
            task,
            callable: self
                .wb
                .writers
                .get(&task)
                .cloned()
                .unwrap_or_else(|| "?".into()),
            worker: Some(self.worker_name(worker)),
            outcome: Outcome::EndpointFailure(FailureCause::new(
                FailureKind::WorkerLost,
                format!(
                    "the bytes it wrote ({}..{} of buffer {}) were lost with the worker before they were written back to host memory",
                    r.start,
                    r.end,
                    fp.identity()
                ),
            )),
        }
    }

    /// The error for a task whose written bytes were lost, if any.
    fn lost_by(&self, task: TaskId) -> Option<RunError> {
        self.wb
            .lost
            .iter()
            .find(|l| l.writer == task)
            .map(|l| l.error.clone())
    }

    /// Why `item` may not run: an argument it reads (or keeps in part)
    /// shares bytes with bytes lost before they were written back. A pure
    /// `OUTPUT` may: it writes them anew.
    fn touches_lost(&self, item: &DispatchItem) -> Option<String> {
        if self.wb.lost.is_empty() {
            return None;
        }
        item.args.iter().enumerate().find_map(|(i, a)| {
            if matches!(a.tag, ArgTag::NoDep | ArgTag::Output)
                || !matches!(a.backing, crate::buffer::Backing::Host(_))
            {
                return None;
            }
            let fp = Footprint::of(&a.tensor);
            self.wb
                .lost
                .iter()
                .find(|l| l.fp.overlap(&fp) != Overlap::Disjoint)
                .map(|l| {
                    let r = l.fp.byte_range();
                    format!(
                        "argument {i}: bytes {}..{} of buffer {} that {} wrote were lost with {} before they were written back to host memory",
                        r.start,
                        r.end,
                        l.fp.identity(),
                        l.writer,
                        self.worker_name(l.worker)
                    )
                })
        })
    }

    /// A task wrote `fp` again: lost bytes of exactly that byte set are
    /// whole again.
    pub(super) fn rewritten(&mut self, fp: &Footprint) {
        if !self.wb.lost.is_empty() {
            self.wb.lost.retain(|l| l.fp != *fp);
        }
    }

    /// Records the callable of a task whose write is now dirty.
    pub(super) fn dirty_writer(&mut self, task: TaskId, callable: &str) {
        self.wb
            .writers
            .entry(task)
            .or_insert_with(|| callable.to_owned());
    }

    fn prune_writers(&mut self) {
        if !self.any_dirty() && self.wb.asked.is_empty() {
            self.wb.writers.clear();
        }
    }

    /// The dirty record of a write of `view` kept on `worker` by `task`.
    pub(super) fn dirty_of(worker: WorkerId, task: TaskId, view: strata_wire::Tensor) -> Dirty {
        Dirty { worker, task, view }
    }
}
