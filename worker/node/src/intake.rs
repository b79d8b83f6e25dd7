//! Where a session's tasks come in, however they travel: the worker
//! process's task stream and ring reader, and an in-process caller, all
//! hand each task to the session's [`Intake`], and say where its
//! completion goes with a [`CompletionSink`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use strata_proto::TaskId;
use strata_proto::convert::{FailureCause, FailureKind, TaskCompletion, TaskRequest};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc};

use crate::exec;
use crate::node::{Node, RunningTask, Session};

/// Where an intake's completions go: a channel read by the session's
/// completion stream or an in-process caller, or its ring's completion
/// lane. Called once per task, from whichever thread completes it (a
/// device lane, a runtime thread, or the caller of
/// [`Intake::take_blocking`]); it must not block for long.
pub trait CompletionSink: Send + Sync + std::fmt::Debug + 'static {
    /// Delivers one completion. One the sink can no longer deliver (its
    /// reader is gone) is dropped: its session is ending.
    fn complete(&self, completion: TaskCompletion);
}

impl CompletionSink for mpsc::UnboundedSender<TaskCompletion> {
    fn complete(&self, completion: TaskCompletion) {
        // A closed channel: nobody reads the session's completions any
        // more, and the session ends with its stream.
        drop(self.send(completion));
    }
}

/// A session's intake: each task is counted as running from receipt to
/// completion (what a client fencing the session waits for), waits for one
/// of the session's [`crate::Limits::max_in_flight`] permits (backpressure:
/// the caller stops taking tasks while it waits), and runs; its completion
/// goes to the intake's sink.
#[derive(Debug, Clone)]
pub struct Intake {
    node: Arc<Node>,
    session: Arc<Session>,
    permits: Arc<Semaphore>,
    done: Arc<dyn CompletionSink>,
}

impl Intake {
    /// The intake of `session`, completing into `done`.
    pub fn new(node: Arc<Node>, session: Arc<Session>, done: Arc<dyn CompletionSink>) -> Self {
        let permits = Arc::new(Semaphore::new(node.limits.max_in_flight));
        Intake {
            node,
            session,
            permits,
            done,
        }
    }

    /// Takes one task: `req` is the decoded request, or why it could not
    /// be decoded (the task then fails with that cause). Returns once the
    /// task holds a permit and is on its way.
    ///
    /// # Cancel safety
    /// Cancelling while it waits for a permit drops the task uncounted
    /// and unrun (it never started).
    pub async fn take(&self, id: TaskId, req: Result<TaskRequest, String>) {
        let running = self.session.task_received();
        let Ok(permit) = Arc::clone(&self.permits).acquire_owned().await else {
            return;
        };
        self.start(running, permit, id, req, false);
    }

    /// [`Intake::take`] from a thread outside the runtime (the ring's
    /// reader): a free permit is taken without entering `rt`; only a
    /// session at its in-flight limit blocks on it. The device may run the
    /// kernel on this thread when it would start at once anyway, which
    /// saves waking a lane thread.
    pub fn take_blocking(
        &self,
        rt: &tokio::runtime::Handle,
        id: TaskId,
        req: Result<TaskRequest, String>,
    ) {
        let running = self.session.task_received();
        let permit = match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(p) => p,
            Err(TryAcquireError::Closed) => return,
            Err(TryAcquireError::NoPermits) => {
                match rt.block_on(Arc::clone(&self.permits).acquire_owned()) {
                    Ok(p) => p,
                    Err(_) => return,
                }
            }
        };
        self.start(running, permit, id, req, true);
    }

    /// `here`: the caller's thread may run the kernel (it is the ring's
    /// reader, not a runtime thread).
    fn start(
        &self,
        running: RunningTask,
        permit: OwnedSemaphorePermit,
        id: TaskId,
        req: Result<TaskRequest, String>,
        here: bool,
    ) {
        let sink = Arc::clone(&self.done);
        let done: exec::Done = Box::new(move |c| {
            drop(permit);
            // Its effects are done: no longer running, even for a client
            // that reads the completion first.
            drop(running);
            sink.complete(c);
        });
        match req {
            Ok(req) if here => exec::execute_here(&self.node, &self.session, req, done),
            Ok(req) => exec::execute(&self.node, &self.session, req, done),
            Err(e) => {
                let c = &self.node.counters;
                c.in_flight.fetch_add(1, Ordering::Relaxed);
                c.failed.fetch_add(1, Ordering::Relaxed);
                c.in_flight.fetch_sub(1, Ordering::Relaxed);
                done(TaskCompletion::failed(
                    id,
                    FailureCause::new(FailureKind::Refused, format!("refused: {e}")),
                ));
            }
        }
    }
}
