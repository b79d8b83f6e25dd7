//! Queues and dispatch: placing a ready task on its workers' queues,
//! dispatching what heads them while windows allow (groups all-or-nothing),
//! and finishing tasks.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{Action, HOLDERS_MAX, IN_FLIGHT_HORIZON_NS, Outcome, Placement, Scheduler, State};
use crate::ids::{TaskId, WorkerId};
use strata_boundary::{FailureCause, FailureKind};

/// A task's place in its workers' queues: higher priority first, then
/// ready order. Every queue orders by the same keys, so two groups meet in
/// the same order on every worker they share (no deadlock), as with FIFO
/// queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    /// The upward rank in ns (0 when not ranking).
    pub(super) prio: Reverse<u64>,
    /// Ready order.
    pub(super) seq: u64,
    pub(super) task: TaskId,
}

impl Key {
    /// The key of a task not queued yet.
    pub(super) fn unqueued(task: TaskId) -> Key {
        Key {
            prio: Reverse(0),
            seq: 0,
            task,
        }
    }
}

/// A worker's ready queue.
#[derive(Debug, Default)]
pub(super) struct ReadyQueue {
    keys: BTreeSet<Key>,
}

impl ReadyQueue {
    pub(super) fn push(&mut self, key: Key) {
        self.keys.insert(key);
    }
    pub(super) fn front(&self) -> Option<TaskId> {
        self.keys.first().map(|k| k.task)
    }
    pub(super) fn pop_front(&mut self) -> Option<TaskId> {
        self.keys.pop_first().map(|k| k.task)
    }
    pub(super) fn remove(&mut self, key: Key) {
        self.keys.remove(&key);
    }
    /// A queued task's key changed (its rank grew).
    pub(super) fn rekey(&mut self, old: Key, new: Key) {
        if self.keys.remove(&old) {
            self.keys.insert(new);
        }
    }
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }
    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
    pub(super) fn iter(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.keys.iter().map(|k| k.task)
    }
    /// Empties the queue, returning its tasks in order.
    pub(super) fn drain(&mut self) -> Vec<TaskId> {
        std::mem::take(&mut self.keys)
            .into_iter()
            .map(|k| k.task)
            .collect()
    }
}

impl Scheduler {
    /// Places a ready task's members and queues it on their workers.
    pub(super) fn enqueue(&mut self, task: TaskId, out: &mut Vec<Action>) {
        let Some(t) = self.tasks.get(&task) else {
            return;
        };
        let mut chosen: super::Members<WorkerId> = super::Members::new();
        let mut predicted: super::Members<Option<f64>> = super::Members::new();
        let models = self.policy.models();
        for info in &t.members {
            // Each worker's kind has its own model: the prediction is the
            // chosen worker's.
            let expect_on = |w: &super::Worker| {
                if models {
                    self.model.predict(info.callable, w.kind, &info.work)
                } else {
                    None
                }
            };
            let pick = match info.placement {
                Placement::On(w) => match self.workers.get(&w) {
                    Some(worker) if worker.up => Ok(w),
                    _ => Err(Outcome::EndpointFailure(FailureCause::new(
                        FailureKind::WorkerLost,
                        format!("{w} is down"),
                    ))),
                },
                Placement::Any => self
                    .workers
                    .iter()
                    .filter(|(id, w)| {
                        w.up && w.takes(info) && !chosen.contains(id)
                    })
                    .min_by_key(|(id, w)| {
                        let holds = info
                            .device_buffers
                            .iter()
                            .any(|b| w.device_buffers.contains(b));
                        let outstanding = w.queue.len() + w.in_flight;
                        // Modelled finish first (whole µs, so that noise in
                        // the models does not override the rest), when
                        // modelling and the task's duration is known.
                        let finish = match expect_on(w) {
                            Some(ns) => {
                                let lacking: f64 = info
                                    .work
                                    .data
                                    .iter()
                                    .filter(|(k, _, _)| {
                                        !self.holders.get(k).is_some_and(|h| h.contains(id))
                                    })
                                    .map(|&(_, bytes, _)| self.model.copy_ns(**id, bytes))
                                    .sum();
                                ((w.backlog_ns + lacking + ns) / 1e3) as u64
                            }
                            None => 0,
                        };
                        // Work beyond the window, then free slots (windows
                        // differ), then the device-buffer holder.
                        (
                            finish,
                            outstanding.saturating_sub(w.window),
                            std::cmp::Reverse(w.window.saturating_sub(outstanding)),
                            !holds,
                            **id,
                        )
                    })
                    .map(|(id, _)| *id)
                    .ok_or_else(|| {
                        Outcome::EndpointFailure(FailureCause::new(
                            FailureKind::WorkerLost,
                            format!(
                                "no worker that offers callable {} and has what it needs ({}) is up",
                                info.callable, info.needs
                            ),
                        ))
                    }),
            };
            match pick {
                Ok(w) => {
                    chosen.push(w);
                    predicted.push(self.workers.get(&w).and_then(expect_on));
                }
                Err(outcome) => {
                    let callable = info.callable;
                    self.note_failure(task, callable, None, &outcome);
                    self.tasks.remove(&task);
                    out.push(Action::Done { task, outcome });
                    return;
                }
            }
        }
        self.next_seq += 1;
        let Some(t) = self.tasks.get_mut(&task) else {
            return;
        };
        t.key = Key {
            prio: Reverse(if self.policy == super::Policy::Dmdas {
                t.rank as u64
            } else {
                0
            }),
            seq: self.next_seq,
            task,
        };
        if models {
            if self.holders.len() > HOLDERS_MAX {
                self.holders.clear();
            }
            for (info, w) in t.members.iter().zip(&chosen) {
                for &(k, _, written) in &info.work.data {
                    let h = self.holders.entry(k).or_default();
                    if written {
                        h.clear();
                    }
                    if !h.contains(w) {
                        h.push(*w);
                    }
                }
            }
        }
        for (w, p) in chosen.iter().zip(&predicted) {
            if let Some(worker) = self.workers.get_mut(w) {
                worker.queue.push(t.key);
                worker.backlog_ns += p.unwrap_or(0.0);
            }
        }
        t.predicted = predicted;
        t.state = State::Queued(chosen);
    }

    /// A queued task leaves its queues without running: its modelled work
    /// leaves their backlogs.
    pub(super) fn unqueue_backlog(&mut self, task: TaskId) {
        let Some(t) = self.tasks.get(&task) else {
            return;
        };
        if let State::Queued(ws) = &t.state {
            for (w, p) in ws.iter().zip(&t.predicted) {
                if let Some(worker) = self.workers.get_mut(w) {
                    worker.backlog_ns = (worker.backlog_ns - p.unwrap_or(0.0)).max(0.0);
                }
            }
        }
    }

    /// Dispatches whatever heads its queues and fits.
    pub(super) fn pump(&mut self, out: &mut Vec<Action>) {
        // The heads' buffer is the scheduler's, reused: pumping runs once
        // per task event and allocates nothing of its own.
        let mut heads = std::mem::take(&mut self.heads);
        loop {
            let mut progressed = false;
            heads.clear();
            heads.extend(self.workers.values().filter_map(|w| w.queue.front()));
            for &task in &heads {
                let workers = &mut self.workers;
                let Some(t) = self.tasks.get_mut(&task) else {
                    continue;
                };
                let State::Queued(ws) = &t.state else {
                    continue;
                };
                let predicted = &t.predicted;
                let fits = ws.iter().zip(predicted).all(|(w, p)| {
                    workers.get(w).is_some_and(|x| {
                        x.up && x.in_flight < x.window
                            && (x.in_flight < 2
                                || x.in_flight_ns + p.unwrap_or(0.0) <= IN_FLIGHT_HORIZON_NS)
                            && x.queue.front() == Some(task)
                    })
                });
                if !fits {
                    continue;
                }
                for (m, (w, p)) in ws.iter().zip(predicted).enumerate() {
                    if let Some(worker) = workers.get_mut(w) {
                        worker.queue.pop_front();
                        worker.in_flight += 1;
                        worker.in_flight_ns += p.unwrap_or(0.0);
                    }
                    out.push(Action::Dispatch {
                        task,
                        member: m,
                        worker: *w,
                        rank: t.rank.max(0.0) as u64,
                    });
                }
                if let State::Queued(ws) = std::mem::replace(&mut t.state, State::Waiting) {
                    let n = ws.len();
                    t.state = State::Running {
                        workers: ws,
                        left: smallvec::smallvec![true; n],
                        failure: None,
                    };
                }
                progressed = true;
            }
            if !progressed {
                self.heads = heads;
                return;
            }
        }
    }

    pub(super) fn finish(&mut self, task: TaskId, out: &mut Vec<Action>) {
        let Some(t) = self.tasks.get(&task) else {
            return;
        };
        let State::Running {
            workers, failure, ..
        } = &t.state
        else {
            return;
        };
        let (member, outcome) = failure.clone().unwrap_or((0, Outcome::Success));
        let worker = workers.get(member).copied();
        self.done(task, member, worker, outcome, out);
    }

    pub(super) fn done(
        &mut self,
        task: TaskId,
        member: usize,
        worker: Option<WorkerId>,
        outcome: Outcome,
        out: &mut Vec<Action>,
    ) {
        if let Some(t) = self.tasks.remove(&task) {
            if let Some(info) = t.members.get(member) {
                self.note_failure(task, info.callable, worker, &outcome);
            }
        }
        out.push(Action::Done { task, outcome });
    }
}
