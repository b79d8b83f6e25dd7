//! Policies a cluster is started with.

use std::time::Duration;

/// What happens to work that needs bytes a lost task may still write.
///
/// A task running on a worker that is lost *without a fence* — one the
/// cluster did not spawn (so cannot kill and see dead) and that hangs or
/// is cut off over a Unix socket — may still be writing its outputs. Those
/// bytes are quarantined: a later task that writes them is not
/// dispatched, readers are skipped (the task failed), and the driver's own
/// reads and writes of them are refused. The fence is proof that the task
/// can no longer write: the worker process is seen dead, or it comes back
/// and proves that the old session's tasks have all ended. Then the
/// quarantine lifts and what waited runs.
///
/// The default is [`Quarantine::Wait`] for 30 s: the usual unfenced loss
/// is a stall (a paused or overloaded process, a debugger) or a restart,
/// which the endpoint turns into a fence within moments of the worker
/// answering again, and waiting lets the job finish correctly without the
/// user resubmitting anything; the deadline keeps a worker that never
/// comes back from hanging the job. [`Quarantine::FailAtOnce`] is for jobs
/// that would rather fail fast and resubmit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Quarantine {
    /// Tasks that write quarantined bytes wait for the fence, at most this
    /// long; then they fail with ENDPOINT_FAILURE naming the quarantine,
    /// the lost worker and the lost task (and later writers of those bytes
    /// are refused until a late fence).
    Wait(Duration),
    /// They fail at once, as after the deadline above.
    FailAtOnce,
}

impl Default for Quarantine {
    fn default() -> Self {
        Quarantine::Wait(Duration::from_secs(30))
    }
}

/// When bytes a task writes on a local staged chip go back to host memory
/// ([`crate::ClusterBuilder::write_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WriteBack {
    /// When the task ends (the default): host memory holds every
    /// completed task's bytes, so a lost worker loses nothing but copies.
    #[default]
    Through,
    /// When something needs them: a task on another chip (or this one,
    /// through another view) that touches them, a wait, an eviction. A
    /// chain of tasks updating the same bytes on one chip moves them once;
    /// but a worker lost before it wrote them back loses them: the wait
    /// reports the task that wrote them, and tasks that would read them
    /// fail.
    Deferred,
}
