//! Task timeouts ([`crate::Task::timeout`]): the endpoint keeps the
//! deadline of every member in flight that has one, in a heap, with one
//! timer armed for the earliest.
//!
//! A timeout counts from when the endpoint sends the member to its worker
//! (time queued on the worker counts; time waiting for inputs or for room
//! in the driver does not). When it passes:
//! 1. the member is reported [`Event::TimedOut`](strata_orchestrator_core::Event::TimedOut):
//!    its task fails with TASK_FAILURE and a cause saying it timed out,
//!    never retried;
//! 2. the worker is lost with that cause ([`EndpointActor::lost`]): a
//!    kernel cannot be trusted to stop, so its session cannot be trusted
//!    either. The existing loss rules then decide what its bytes do: a
//!    spawned worker is killed and seen gone (fenced) and restarted —
//!    outside the respawn budget, which counts crashes; a worker the
//!    cluster connected to is quarantined until it is seen dead or comes
//!    back proving the session ended (for a kernel that sleeps, when it
//!    returns); a staged (TCP) worker only held copies, so its loss is
//!    fenced at once; an in-process worker cannot be killed, and stays
//!    quarantined until its kernel really ends. Every other member in
//!    flight there fails with ENDPOINT_FAILURE as on any loss (or reruns
//!    under the retry policy).
//!
//! Without timeouts the heap stays empty and the timer disarmed: a
//! dispatch pays one `Option` check per member.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::pin::Pin;
use std::time::Duration;

use strata_orchestrator_core::{Event, TaskId};
use tokio::time::{Instant, Sleep};
use tracing::warn;

use super::EndpointActor;
use crate::actors::Notice;
use crate::link::Memory;

/// The deadlines of members in flight, earliest first, and the timer
/// armed for the earliest.
#[derive(Default)]
pub(super) struct Deadlines {
    /// (deadline, task id); an entry whose member already finished stays
    /// until it is due, and is then dropped.
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl Deadlines {
    /// Adds the deadline of the member of task `task`.
    pub(super) fn push(&mut self, at: Instant, task: u64) {
        self.heap.push(Reverse((at, task)));
        self.arm();
    }

    /// Forgets every deadline (the worker was lost: nothing is in flight).
    pub(super) fn clear(&mut self) {
        self.heap.clear();
        self.timer = None;
    }

    /// Whether a deadline is pending (the branch that awaits
    /// [`Deadlines::next`] is disabled otherwise).
    pub(super) fn armed(&self) -> bool {
        self.timer.is_some()
    }

    /// Resolves when the earliest deadline passes.
    ///
    /// # Cancel safety
    /// Cancel safe: the timer stays armed.
    pub(super) async fn next(&mut self) {
        match &mut self.timer {
            Some(t) => t.as_mut().await,
            None => std::future::pending().await,
        }
    }

    /// Takes the deadlines that passed by `now` and re-arms the timer for
    /// the next one.
    fn due(&mut self, now: Instant) -> Vec<(Instant, u64)> {
        let mut due = Vec::new();
        while let Some(&Reverse((at, task))) = self.heap.peek() {
            if at > now {
                break;
            }
            self.heap.pop();
            due.push((at, task));
        }
        self.arm();
        due
    }

    fn arm(&mut self) {
        let Some(&Reverse((at, _))) = self.heap.peek() else {
            self.timer = None;
            return;
        };
        match &mut self.timer {
            Some(t) if t.deadline() == at => {}
            Some(t) => t.as_mut().reset(at),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }
}

impl EndpointActor {
    /// Starts the clocks of members just sent: `timed` holds the task id
    /// and timeout of each that has one.
    pub(super) fn start_clocks(&mut self, timed: &[(TaskId, Duration)]) {
        let now = Instant::now();
        for &(task, timeout) in timed {
            // A timeout too long for the clock is no bound at all.
            let Some(at) = now.checked_add(timeout) else {
                continue;
            };
            if let Some(f) = self.in_flight.get_mut(&task.0) {
                f.deadline = Some(at);
                self.deadlines.push(at, task.0);
            }
        }
    }

    /// The earliest deadline passed: every member whose deadline passed
    /// is reported timed out, and the worker is lost with the first's
    /// cause.
    pub(super) fn expire(&mut self) {
        let mut lost = None;
        for (at, task) in self.deadlines.due(Instant::now()) {
            let Some(f) = self.in_flight.get(&task) else {
                continue; // it finished in time
            };
            let (Some(deadline), Some(timeout)) = (f.deadline, f.timeout) else {
                continue;
            };
            if deadline != at {
                continue;
            }
            let what = format!(
                "{} ({}) timed out after {} on {}",
                f.task,
                self.callable_name(f.callable),
                span(timeout),
                self.id
            );
            warn!(worker = %self.id, task = f.task.0, timeout_ms = timeout.as_millis(), "task timed out");
            let cause = format!(
                "{what} (counted from when it was sent to the worker); {UNTRUSTED}, so {}",
                self.after_timeout()
            );
            let _ = self.up.send(Notice::Event(Event::TimedOut {
                task: f.task,
                member: f.member,
                cause,
            }));
            lost.get_or_insert(what);
        }
        if let Some(what) = lost {
            self.timed_out = true;
            self.lost(format!("{what}, and {UNTRUSTED}"));
        }
    }

    /// What a timeout does to this worker, in words.
    fn after_timeout(&self) -> &'static str {
        if self.spawned.is_some() {
            "the worker is killed and restarted"
        } else if self.link.facts().memory == Memory::Staged {
            "the worker's session is ended; it only held copies of the bytes, and its late \
             results are dropped"
        } else {
            "the worker's session is ended and the bytes the task writes stay quarantined \
             until the worker is seen dead or proves the task ended"
        }
    }

    /// `name@version` of a callable this worker offers.
    fn callable_name(&self, handle: strata_chip_runtime::KernelHandle) -> String {
        self.link
            .facts()
            .worker
            .callables
            .iter()
            .find(|c| c.handle == handle)
            .map_or_else(
                || format!("callable {handle:?}"),
                |c| c.signature.qualified_name(),
            )
    }
}

/// Why a timeout loses the worker.
const UNTRUSTED: &str = "a running kernel cannot be trusted to stop";

/// A duration as a person reads it: whole milliseconds when it is some.
fn span(d: Duration) -> String {
    if d.subsec_nanos() % 1_000_000 == 0 {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.3} ms", d.as_secs_f64() * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_timer_fires_at_the_earliest_deadline_and_rearms_for_the_next() {
        let mut d = Deadlines::default();
        assert!(!d.armed());
        let t0 = Instant::now();
        d.push(t0 + Duration::from_millis(90), 3);
        d.push(t0 + Duration::from_millis(30), 1);
        d.push(t0 + Duration::from_millis(30), 2);
        assert!(d.armed());
        d.next().await;
        let first = Instant::now() - t0;
        assert!(first >= Duration::from_millis(30), "{first:?}");
        let due: Vec<u64> = d.due(Instant::now()).into_iter().map(|(_, t)| t).collect();
        assert_eq!(due, vec![1, 2]);
        assert!(d.armed(), "task 3's deadline is still ahead");
        d.next().await;
        assert!(Instant::now() - t0 >= Duration::from_millis(90));
        assert_eq!(d.due(Instant::now()).len(), 1);
        assert!(!d.armed());
        d.push(Instant::now() + Duration::from_secs(1), 4);
        assert!(d.due(Instant::now()).is_empty());
        d.clear();
        assert!(!d.armed());
        assert_eq!(span(Duration::from_millis(200)), "200 ms");
        assert_eq!(span(Duration::from_micros(1500)), "1.500 ms");
    }
}
