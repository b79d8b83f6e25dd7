//! Describing a task: a callable, tagged views, scalars, placement and
//! explicit edges.

use std::time::Duration;

use strata_orchestrator_core::{TaskId, WorkerId};
use strata_proto::convert::Features;
use strata_wire::ArgTag;

use crate::buffer::View;

/// A submitted task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskHandle(pub(crate) TaskId);

impl TaskHandle {
    /// The task's id (submission order).
    pub fn id(&self) -> TaskId {
        self.0
    }
}

/// A task (or one member of a group) to submit.
///
/// ```no_run
/// # use strata_orchestrator::{Cluster, Task};
/// # use strata_wire::DType;
/// # fn main() -> Result<(), strata_orchestrator::Error> {
/// let cluster = Cluster::builder().local(2).start()?;
/// let a = cluster.buffer(64 * 64 * 4)?.tensor(&[64, 64], DType::F32)?;
/// let b = cluster.buffer(64 * 64 * 4)?.tensor(&[64, 64], DType::F32)?;
/// let c = cluster.buffer(64 * 64 * 4)?.tensor(&[64, 64], DType::F32)?;
/// cluster.submit(Task::new("fill").output(&a).scalar_f64(1.0))?;
/// cluster.submit(Task::new("fill").output(&b).scalar_f64(2.0))?;
/// let t = cluster.submit(Task::new("matmul").input(&a).input(&b).output(&c))?;
/// cluster.wait(t)?;
/// assert_eq!(c.read::<f32>()?[0], 128.0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Task {
    pub(crate) callable: String,
    pub(crate) args: Vec<(View, ArgTag)>,
    pub(crate) scalars: Vec<u64>,
    pub(crate) on: Option<WorkerId>,
    pub(crate) after: Vec<TaskId>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) flops: Option<u64>,
    pub(crate) required_features: Features,
}

impl Task {
    /// A task running `callable`: `name` (the highest version the workers
    /// offer) or `name@version`.
    pub fn new(callable: impl Into<String>) -> Self {
        Task {
            callable: callable.into(),
            args: Vec::new(),
            scalars: Vec::new(),
            on: None,
            after: Vec::new(),
            timeout: None,
            flops: None,
            required_features: Features::NONE,
        }
    }

    /// Requires `features` of the worker that runs it (bits this driver
    /// has no name for included): it goes only to a worker that offers
    /// them all, and is refused when it is submitted if no worker it may
    /// go to does ([`crate::SubmitError::Incapable`]). The worker
    /// checks again: a task that requires a feature the worker does not
    /// know or offer fails unrun ([`crate::FailureKind::Unsupported`]).
    #[must_use]
    pub fn require(mut self, features: Features) -> Self {
        self.required_features = self.required_features | features;
        self
    }

    /// Adds an argument with `tag`.
    #[must_use]
    pub fn arg(mut self, view: &View, tag: ArgTag) -> Self {
        self.args.push((view.clone(), tag));
        self
    }

    /// Adds an argument the task reads.
    #[must_use]
    pub fn input(self, view: &View) -> Self {
        self.arg(view, ArgTag::Input)
    }

    /// Adds an argument the task writes whole (its old bytes do not matter:
    /// a remote worker starts from zeros).
    #[must_use]
    pub fn output(self, view: &View) -> Self {
        self.arg(view, ArgTag::Output)
    }

    /// Adds an argument the task writes, keeping the bytes it does not
    /// write (a remote worker receives the old bytes).
    #[must_use]
    pub fn output_existing(self, view: &View) -> Self {
        self.arg(view, ArgTag::OutputExisting)
    }

    /// Adds an argument the task reads and writes.
    #[must_use]
    pub fn inout(self, view: &View) -> Self {
        self.arg(view, ArgTag::InOut)
    }

    /// Adds an argument outside dependency tracking (the caller orders it).
    #[must_use]
    pub fn no_dep(self, view: &View) -> Self {
        self.arg(view, ArgTag::NoDep)
    }

    /// Adds a scalar as its 64 bits.
    #[must_use]
    pub fn scalar_u64(mut self, v: u64) -> Self {
        self.scalars.push(v);
        self
    }

    /// Adds a signed scalar (two's complement).
    #[must_use]
    pub fn scalar_i64(self, v: i64) -> Self {
        self.scalar_u64(v as u64)
    }

    /// Adds a floating-point scalar (its f64 bits).
    #[must_use]
    pub fn scalar_f64(self, v: f64) -> Self {
        self.scalar_u64(v.to_bits())
    }

    /// Runs it on `worker` (otherwise the scheduler places it; a task using
    /// a device buffer runs where the buffer lives).
    #[must_use]
    pub fn on(mut self, worker: WorkerId) -> Self {
        self.on = Some(worker);
        self
    }

    /// Declares the task's cost in floating-point operations, for the
    /// performance models before they have measured its callable at these
    /// shapes: its duration is then predicted at the flop rate measured
    /// over the run's other tasks that declared theirs.
    #[must_use]
    pub fn flops(mut self, flops: u64) -> Self {
        self.flops = Some(flops);
        self
    }

    /// Bounds how long it may run: counted from when its endpoint sends
    /// it to its worker (time queued on the worker counts, time waiting
    /// for its inputs in the driver does not). When it passes, the task
    /// fails with TASK_FAILURE and a cause saying it timed out, and is
    /// never retried. A running kernel cannot be trusted to stop, so the
    /// worker's session is ended as lost: a worker the cluster spawned is
    /// killed (fenced) and restarted; one it connected to keeps the bytes
    /// the task writes quarantined until it proves the task ended; a
    /// remote (TCP) worker only held copies, so nothing is quarantined.
    /// Other tasks in flight on that worker fail with ENDPOINT_FAILURE as
    /// on any loss (or rerun under the retry policy). A group member's
    /// timeout is its own. Without one (the default) a task runs as long
    /// as its kernel does.
    ///
    /// A zero timeout is refused at submit.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Runs it after `task`, whatever their bytes.
    #[must_use]
    pub fn after(mut self, task: TaskHandle) -> Self {
        self.after.push(task.0);
        self
    }
}
