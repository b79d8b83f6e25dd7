//! `strata-orchestrator`: the driver side of strata, as a library (the
//! `strata` command line is `strata-cli`, on top of it).
//!
//! A driver starts a [`Cluster`] (spawning local workers, or connecting to
//! running ones by `unix:` or `tcp:` address), creates [`Buffer`]s and
//! [`View`]s over them, and submits [`Task`]s. The orchestrator infers the
//! dependency DAG from the bytes each task reads and writes (`strata-core`)
//! and dispatches ready tasks to the workers, passing host buffers to
//! local workers by fd (zero-copy) and staging bytes to remote ones.
//!
//! ```no_run
//! use strata_orchestrator::{Cluster, Task};
//! use strata_wire::DType;
//!
//! # fn main() -> Result<(), strata_orchestrator::Error> {
//! let cluster = Cluster::builder().local(4).start()?;
//! let x = cluster.buffer_from_slice(&[1.0f32; 1024])?.tensor(&[1024], DType::F32)?;
//! let y = cluster.buffer(4096)?.tensor(&[1024], DType::F32)?;
//! cluster.submit(Task::new("copy").input(&x).output(&y))?;
//! cluster.submit(Task::new("axpy").input(&x).inout(&y).scalar_f64(2.0))?;
//! cluster.wait_all()?;
//! assert!(y.read::<f32>()?.iter().all(|&v| v == 3.0));
//! # Ok(()) }
//! ```
//!
//! Inside: a DAG/scheduler actor owns the cores, one endpoint actor per
//! worker owns its gRPC stream and fd channel, and a buffer manager
//! releases buffers on the workers once nothing uses them
//! (docs/ARCHITECTURE.md#actors-and-channels draws the channel graph).

#![deny(unsafe_code)]

mod actors;
mod buffer;
mod cluster;
pub mod demo;
mod driver_dir;
mod error;
mod link;
mod local;
mod mapping;
pub mod npy;
mod perf_models;
mod policy;
mod start;
mod task;
pub mod trace;

#[cfg(test)]
mod tests;

pub use buffer::{Buffer, View};
pub use cluster::{Cluster, Scope};
pub use error::{
    BufferError, ClusterError, Error, NpyError, QuarantinedBytes, RunError, SubmitError,
    TraceError, ViewError,
};
pub use link::{LinkError, Refusal, Transport, WorkerInfo};
pub use local::default_worker_binary;
pub use policy::Quarantine;
pub use start::ClusterBuilder;
pub use strata_chip_runtime::kernel::Signature;
pub use strata_client::ClientTls;
pub use strata_orchestrator_core::sched::Policy as SchedulerPolicy;
pub use strata_orchestrator_core::{FailureCause, FailureKind, Outcome, TaskId, WorkerId};
pub use task::{Task, TaskHandle};
pub use trace::Trace;

/// When bytes a task writes on a local staged chip go back to host memory
/// ([`ClusterBuilder::write_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

/// Figures of a run (since the previous `wait_all`) or of the cluster's
/// life ([`Cluster::totals`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Tasks submitted.
    pub submitted: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that failed (TASK_FAILURE or ENDPOINT_FAILURE).
    pub failed: u64,
    /// Tasks skipped because a producer failed.
    pub skipped: u64,
    /// Tasks cancelled.
    pub cancelled: u64,
    /// The tasks that did not succeed (failed, skipped or cancelled), by
    /// kind of failure: only kinds that happened appear.
    pub by_kind: std::collections::BTreeMap<FailureKind, u64>,
    /// Dependency edges inferred (one per predecessor of a task).
    pub edges: u64,
    /// Bytes of host buffers passed to local workers by fd (each buffer
    /// counted once per worker): not copied.
    pub fd_bytes: u64,
    /// View bytes sent to remote workers with tasks.
    pub sent_bytes: u64,
    /// View bytes remote workers sent back.
    pub returned_bytes: u64,
    /// Bytes workers staged between host and device memory
    /// (`to_device_bytes + from_device_bytes`).
    pub staged_bytes: u64,
    /// Of those, bytes copied host → device (into chips' cached copies or
    /// scratch).
    pub to_device_bytes: u64,
    /// Of those, bytes copied device → host (written arguments).
    pub from_device_bytes: u64,
    /// Of `to_device_bytes`, bytes copied in ahead of their task while it
    /// waited for its chip (prefetch).
    pub prefetched_bytes: u64,
    /// Bytes copied on the chips, from a cached copy into the block a
    /// writing kernel works on.
    pub on_chip_bytes: u64,
    /// Arguments whose bytes a chip held at the version the task needed.
    pub cache_hits: u64,
    /// Arguments whose bytes a chip had to copy in.
    pub cache_misses: u64,
    /// Dirty cached copies written back (flushes and evictions).
    pub write_backs: u64,
    /// Cached copies evicted to make room.
    pub evictions: u64,
    /// View bytes left out of tasks sent to remote workers because their
    /// chip held them.
    pub held_bytes: u64,
    /// Members sent again because the chip no longer held bytes left out
    /// of them.
    pub resent: u64,
    /// Completions whose kernel time the performance models had predicted
    /// when placing them.
    pub predicted: u64,
    /// Their measured kernel time, in all (ns).
    pub predicted_measured_ns: u64,
    /// The sum of |predicted − measured| over them (ns): divided by
    /// `predicted_measured_ns`, the models' relative error.
    pub prediction_error_ns: u64,
}

impl RunSummary {
    /// The performance models' relative error over the run's completions
    /// they predicted (time-weighted: Σ|predicted − measured| / Σ measured),
    /// or `None` when they predicted none.
    pub fn prediction_error(&self) -> Option<f64> {
        (self.predicted_measured_ns > 0)
            .then(|| self.prediction_error_ns as f64 / self.predicted_measured_ns as f64)
    }
}
