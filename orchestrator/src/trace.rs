//! Traces of runs: for every finished task, where and when each member
//! ran and which tasks it waited for; written as Chrome trace-event JSON
//! (loadable in Perfetto or `chrome://tracing`): one track per worker
//! lane, one slice per member, flow arrows for dependency edges.
//!
//! Times are microseconds from the cluster's start, on the driver's
//! monotonic clock. A member's slice ends when its completion reached the
//! driver (outputs landed) and starts `busy` earlier as the worker
//! measured it, but never before it was dispatched.

use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};
use strata_orchestrator_core::{Outcome, TaskId, WorkerId};

use crate::error::{Error, TraceError};
use crate::link::WorkerInfo;

/// One member of a traced task, as it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberTrace {
    /// The worker.
    pub worker: WorkerId,
    /// The worker's lane.
    pub lane: u32,
    /// When it was sent to the worker (µs).
    pub dispatched_us: f64,
    /// When it started (µs).
    pub start_us: f64,
    /// When its completion was in (µs).
    pub end_us: f64,
    /// Microseconds it waited for a lane on the worker.
    pub queued_us: f64,
    /// Bytes the worker staged between host and device memory.
    pub staged_bytes: u64,
    /// View bytes sent with it (remote workers).
    pub sent_bytes: u64,
    /// View bytes that came back (remote workers).
    pub returned_bytes: u64,
    /// Microseconds of its run staging in before the kernel, and after it.
    pub copy_in_us: f64,
    /// See `copy_in_us`.
    pub copy_out_us: f64,
    /// Arguments its chip held already, and arguments it copied in.
    pub cache_hits: u64,
    /// See `cache_hits`.
    pub cache_misses: u64,
    /// View bytes left out because its chip held them (remote workers).
    pub held_bytes: u64,
}

/// A finished task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskTrace {
    /// The task.
    pub id: TaskId,
    /// Its callable, `name@version`.
    pub callable: String,
    /// How it ended.
    pub outcome: Outcome,
    /// When it was submitted (µs).
    pub submitted_us: f64,
    /// When it finished (µs).
    pub finished_us: f64,
    /// Its predecessors still unfinished when it was submitted, with the
    /// edge kinds (bits of `strata_orchestrator_core::dag::edge`).
    pub edges: Vec<(TaskId, u8)>,
    /// Members that ran (one for a plain task; none when it never ran).
    pub members: Vec<MemberTrace>,
}

/// Every task finished since tracing began (or since the last take).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// Finished tasks, in finishing order.
    pub tasks: Vec<TaskTrace>,
}

/// Microseconds from `origin` to `t`.
pub(crate) fn micros(origin: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(origin).as_secs_f64() * 1e6
}

impl Trace {
    /// The time span of the traced tasks: first submit to last finish (µs).
    pub fn span(&self) -> (f64, f64) {
        let start = self
            .tasks
            .iter()
            .map(|t| t.submitted_us)
            .fold(f64::INFINITY, f64::min);
        let end = self
            .tasks
            .iter()
            .map(|t| t.finished_us)
            .fold(f64::NEG_INFINITY, f64::max);
        if start.is_finite() && end.is_finite() {
            (start, end)
        } else {
            (0.0, 0.0)
        }
    }

    /// The Chrome trace-event JSON of this trace; `workers` names the
    /// tracks.
    pub fn to_chrome_json(&self, workers: &[WorkerInfo]) -> Value {
        let mut events = Vec::new();
        let pid = |w: WorkerId| u64::from(w.0) + 1;
        let mut lanes: Vec<(WorkerId, u32)> = self
            .tasks
            .iter()
            .flat_map(|t| t.members.iter().map(|m| (m.worker, m.lane)))
            .collect();
        lanes.sort_unstable();
        lanes.dedup();
        for w in workers {
            events.push(json!({
                "ph": "M", "name": "process_name", "pid": pid(w.id),
                "args": {"name": format!("{} (chip {})", w.id, w.chip)},
            }));
            events.push(json!({
                "ph": "M", "name": "process_labels", "pid": pid(w.id),
                "args": {"labels": w.endpoint},
            }));
            events.push(json!({
                "ph": "M", "name": "process_sort_index", "pid": pid(w.id),
                "args": {"sort_index": w.id.0},
            }));
        }
        for (w, lane) in &lanes {
            events.push(json!({
                "ph": "M", "name": "thread_name", "pid": pid(*w), "tid": lane,
                "args": {"name": format!("lane {lane}")},
            }));
        }
        let mut first_member = std::collections::HashMap::new();
        for t in &self.tasks {
            for (i, m) in t.members.iter().enumerate() {
                events.push(json!({
                    "ph": "X", "cat": "task", "name": t.callable,
                    "pid": pid(m.worker), "tid": m.lane,
                    "ts": m.start_us, "dur": (m.end_us - m.start_us).max(0.0),
                    "args": {
                        "task": t.id.0, "member": i,
                        "queued_us": m.queued_us,
                        "bytes_staged": m.staged_bytes,
                        "bytes_sent": m.sent_bytes,
                        "bytes_returned": m.returned_bytes,
                        "bytes_held": m.held_bytes,
                        "cache_hits": m.cache_hits,
                        "cache_misses": m.cache_misses,
                    },
                }));
                // The transfers, as slices of their own inside the task's:
                // staging in from its start, staging out up to its end on
                // the worker.
                let span = (m.end_us - m.start_us).max(0.0);
                let (copy_in, copy_out) = (m.copy_in_us.min(span), m.copy_out_us.min(span));
                for (name, ts, dur) in [
                    ("copy in", m.start_us, copy_in),
                    ("copy out", m.end_us - copy_out, copy_out),
                ] {
                    if dur > 0.0 {
                        events.push(json!({
                            "ph": "X", "cat": "transfer", "name": name,
                            "pid": pid(m.worker), "tid": m.lane,
                            "ts": ts, "dur": dur,
                            "args": {"task": t.id.0, "member": i},
                        }));
                    }
                }
            }
            if let Some(m) = t.members.first() {
                first_member.insert(t.id, m);
            }
        }
        let mut flow = 0u64;
        for t in &self.tasks {
            let Some(to) = first_member.get(&t.id) else {
                continue;
            };
            for (pred, _) in &t.edges {
                let Some(from) = first_member.get(pred) else {
                    continue;
                };
                flow += 1;
                // Flow ends bind to the slices enclosing their timestamps.
                let at = from.end_us - ((from.end_us - from.start_us) / 2.0).min(1.0);
                events.push(json!({
                    "ph": "s", "cat": "dep", "name": "dependency", "id": flow,
                    "pid": pid(from.worker), "tid": from.lane, "ts": at,
                }));
                events.push(json!({
                    "ph": "f", "bp": "e", "cat": "dep", "name": "dependency", "id": flow,
                    "pid": pid(to.worker), "tid": to.lane, "ts": to.start_us,
                }));
            }
        }
        let (start, end) = self.span();
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {
                "producer": concat!("strata ", env!("CARGO_PKG_VERSION")),
                "tasks": self.tasks.len(),
                "run_start_us": start,
                "run_end_us": end,
            },
        })
    }

    /// Writes [`Trace::to_chrome_json`] to `path`.
    ///
    /// # Errors
    /// [`Error::Trace`] naming the file.
    pub fn write_chrome(
        &self,
        path: impl AsRef<Path>,
        workers: &[WorkerInfo],
    ) -> Result<(), Error> {
        let path = path.as_ref();
        let text = serde_json::to_string(&self.to_chrome_json(workers)).map_err(|source| {
            TraceError::Json {
                path: path.to_owned(),
                source,
            }
        })?;
        std::fs::write(path, text).map_err(|source| {
            TraceError::Write {
                path: path.to_owned(),
                source,
            }
            .into()
        })
    }
}
