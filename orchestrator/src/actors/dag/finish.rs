//! How a task leaves the DAG actor: refused, or done with its outcome —
//! counted, its first failure kept, its waiters woken, its trace taken,
//! and its record (with its hold on its buffers) dropped.

use std::time::Instant;

use strata_orchestrator_core::{FailureCause, FailureKind, Outcome, TaskId};

use super::{DagActor, Record};
use crate::error::RunError;
use crate::summary::RunSummary;
use crate::trace::{MemberTrace, TaskTrace, micros};

impl DagActor {
    /// The engine refused a submission (what is left to refuse after the
    /// driver's checks depends on the run, such as no worker up offering
    /// the callable): the task fails.
    pub(super) fn refused(&mut self, e: strata_orchestrator_core::SubmitError) {
        let Some(record) = self.records.remove(&e.task) else {
            return;
        };
        let err = RunError {
            task: e.task,
            callable: record
                .spec
                .members
                .first()
                .map(|m| m.name.to_string())
                .unwrap_or_default(),
            worker: None,
            outcome: Outcome::TaskFailure(FailureCause::new(
                FailureKind::Refused,
                format!("refused: {}", e.reason),
            )),
        };
        for s in [&mut self.run, &mut self.totals] {
            s.submitted += 1;
            s.failed += 1;
        }
        self.first_error.get_or_insert_with(|| err.clone());
        self.failed.insert(e.task, err);
        self.gate.leave(1);
        self.uncount_exposed(&record.exposed);
        for w in record.waiters {
            let _ = w.send(Err(self.failed[&e.task].clone()));
        }
        self.settle();
    }

    /// A task that counted as a live user of exposed byte sets
    /// ([`DagActor::live_exposed`]) is gone, whether it ran or was refused.
    fn uncount_exposed(&mut self, exposed: &[strata_wire::Footprint]) {
        for fp in exposed {
            if let Some(n) = self.live_exposed.get_mut(fp) {
                *n -= 1;
                if *n == 0 {
                    self.live_exposed.remove(fp);
                }
            }
        }
    }

    pub(super) fn done(&mut self, task: TaskId, outcome: Outcome) {
        let Some(record) = self.records.remove(&task) else {
            return;
        };
        self.gate.leave(1);
        self.uncount_exposed(&record.exposed);
        // Members that never finished (a lost worker, a cancel) may have
        // written part of their bytes.
        for m in 0..record.members.len() {
            self.writes_landed(task, m, false);
        }
        for s in [&mut self.run, &mut self.totals] {
            match &outcome {
                Outcome::Success => s.succeeded += 1,
                Outcome::TaskFailure(_) | Outcome::EndpointFailure(_) => s.failed += 1,
                Outcome::Cancelled => s.cancelled += 1,
                Outcome::Skipped { .. } => s.skipped += 1,
            }
            if let Some(kind) = outcome.kind() {
                *s.by_kind.entry(kind).or_default() += 1;
            }
        }
        let result = if outcome.is_success() {
            Ok(())
        } else {
            let (member, worker) = record
                .members
                .iter()
                .enumerate()
                .find_map(|(m, s)| s.worker.map(|w| (m, w)))
                .map_or((0, None), |(m, w)| (m, Some(w)));
            let err = RunError {
                task,
                callable: record.spec.members[member].name.to_string(),
                worker: worker.map(|w| match self.endpoints.get(w.0 as usize) {
                    Some(ep) => format!("{w} ({})", ep.name),
                    None => w.to_string(),
                }),
                outcome: outcome.clone(),
            };
            if matches!(
                outcome,
                Outcome::TaskFailure(_) | Outcome::EndpointFailure(_)
            ) && self.first_error.is_none()
            {
                self.first_error = Some(err.clone());
            }
            self.failed.insert(task, err.clone());
            Err(err)
        };
        if let Some(trace) = &mut self.trace {
            trace.push(task_trace(
                self.origin,
                task,
                &record,
                outcome.clone(),
                Instant::now(),
            ));
        }
        // A wait that returns has the bytes written back.
        self.reply_after_write_back(task, record.waiters, result);
        // `record` (and with it the task's hold on its buffers) drops here.
    }

    /// Answers `wait_all` once nothing is left unfinished, then starts a
    /// new run.
    pub(super) fn settle(&mut self) {
        if !self.records.is_empty() || self.all_waiters.is_empty() {
            return;
        }
        if !self.all_written_back() {
            return;
        }
        let result = match self.first_error.take() {
            Some(e) => Err(e),
            None => Ok(self.run.clone()),
        };
        for w in self.all_waiters.drain(..) {
            let _ = w.send(result.clone());
        }
        self.run = RunSummary::default();
    }
}

/// The trace of a finished task.
fn task_trace(
    origin: Instant,
    id: TaskId,
    r: &Record,
    outcome: Outcome,
    finished: Instant,
) -> TaskTrace {
    let members = r
        .members
        .iter()
        .filter_map(|s| {
            let (worker, dispatched, rep) = (s.worker?, s.dispatched?, s.report?);
            let received = rep.received?;
            let end = micros(origin, received);
            let dispatched_us = micros(origin, dispatched);
            let busy = rep.busy_ns as f64 / 1e3;
            Some(MemberTrace {
                worker,
                lane: rep.lane,
                dispatched_us,
                start_us: (end - busy).max(dispatched_us),
                end_us: end,
                queued_us: rep.queued_ns as f64 / 1e3,
                staged_bytes: rep.staged,
                sent_bytes: rep.sent,
                returned_bytes: rep.returned,
                copy_in_us: rep.copy_in_ns as f64 / 1e3,
                copy_out_us: rep.copy_out_ns as f64 / 1e3,
                cache_hits: rep.cache.hits,
                cache_misses: rep.cache.misses,
                held_bytes: rep.held,
            })
        })
        .collect();
    TaskTrace {
        id,
        callable: r
            .spec
            .members
            .first()
            .map(|m| m.name.to_string())
            .unwrap_or_default(),
        outcome,
        submitted_us: r.submitted.map_or(0.0, |at| micros(origin, at)),
        finished_us: micros(origin, finished),
        edges: r.edges.clone(),
        members,
    }
}
