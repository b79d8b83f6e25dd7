//! Queues and dispatch: placing a ready task on its workers' queues,
//! dispatching what heads them while windows allow (groups all-or-nothing),
//! and finishing tasks.

use super::{Action, Outcome, Placement, Scheduler, State};
use crate::ids::{TaskId, WorkerId};

impl Scheduler {
    /// Places a ready task's members and queues it on their workers.
    pub(super) fn enqueue(&mut self, task: TaskId, out: &mut Vec<Action>) {
        let Some(t) = self.tasks.get(&task) else {
            return;
        };
        let mut chosen: super::Members<WorkerId> = super::Members::new();
        for info in &t.members {
            let pick = match info.placement {
                Placement::On(w) => match self.workers.get(&w) {
                    Some(worker) if worker.up => Ok(w),
                    _ => Err(Outcome::EndpointFailure(format!("{w} is down"))),
                },
                Placement::Any => self
                    .workers
                    .iter()
                    .filter(|(id, w)| {
                        w.up && w.callables.contains(&info.callable) && !chosen.contains(id)
                    })
                    .min_by_key(|(id, w)| {
                        let holds = info
                            .device_buffers
                            .iter()
                            .any(|b| w.device_buffers.contains(b));
                        let outstanding = w.queue.len() + w.in_flight;
                        // Work beyond the window first, then free slots
                        // (windows differ), then the device-buffer holder.
                        (
                            outstanding.saturating_sub(w.window),
                            std::cmp::Reverse(w.window.saturating_sub(outstanding)),
                            !holds,
                            **id,
                        )
                    })
                    .map(|(id, _)| *id)
                    .ok_or_else(|| {
                        Outcome::EndpointFailure(format!(
                            "no worker that offers callable {} is up",
                            info.callable
                        ))
                    }),
            };
            match pick {
                Ok(w) => chosen.push(w),
                Err(outcome) => {
                    let callable = info.callable;
                    self.note_failure(task, callable, None, &outcome);
                    self.tasks.remove(&task);
                    out.push(Action::Done { task, outcome });
                    return;
                }
            }
        }
        for w in &chosen {
            if let Some(worker) = self.workers.get_mut(w) {
                worker.queue.push_back(task);
            }
        }
        if let Some(t) = self.tasks.get_mut(&task) {
            t.state = State::Queued(chosen);
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
            heads.extend(
                self.workers
                    .values()
                    .filter_map(|w| w.queue.front().copied()),
            );
            for &task in &heads {
                let workers = &mut self.workers;
                let Some(t) = self.tasks.get_mut(&task) else {
                    continue;
                };
                let State::Queued(ws) = &t.state else {
                    continue;
                };
                let fits = ws.iter().all(|w| {
                    workers.get(w).is_some_and(|x| {
                        x.up && x.in_flight < x.window && x.queue.front() == Some(&task)
                    })
                });
                if !fits {
                    continue;
                }
                for (m, w) in ws.iter().enumerate() {
                    if let Some(worker) = workers.get_mut(w) {
                        worker.queue.pop_front();
                        worker.in_flight += 1;
                    }
                    out.push(Action::Dispatch {
                        task,
                        member: m,
                        worker: *w,
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
