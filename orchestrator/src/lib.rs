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
//! Temporaries come from a pool the cluster recycles: [`Cluster::alloc`]
//! for memory owned by its handles, and [`Cluster::scope`] for memory a
//! scope holds and reclaims once it has ended and its tasks are done
//! ([`ScopeGuard::alloc`]; a handle used after that is refused).
//!
//! Inside: a DAG/scheduler actor owns the cores, one endpoint actor per
//! worker owns its gRPC stream and fd channel, and a buffer manager
//! releases buffers on the workers once nothing uses them
//! (docs/ARCHITECTURE.md#actors-and-channels draws the channel graph).

#![deny(unsafe_code)]

mod actors;
mod buffer;
mod chips;
mod cluster;
pub mod demo;
mod driver_dir;
mod error;
mod link;
mod local;
mod mapping;
pub mod npy;
mod paths;
mod perf_models;
mod policy;
mod procfs;
mod start;
mod summary;
mod task;
pub mod trace;

#[cfg(test)]
mod tests;

pub use buffer::{Buffer, DeviceExport, DeviceMapping, PoolStats, View};
pub use chips::worker_chips;
pub use cluster::{Cluster, Scope, ScopeGuard};
pub use error::{
    BufferError, ClusterError, Error, Lack, Need, NpyError, QuarantinedBytes, RunError,
    SubmitError, TraceError, ViewError,
};
pub use link::{LinkError, Refusal, Transport, WorkerInfo};
pub use local::default_worker_binary;
pub use paths::WorkerPath;
pub use policy::{Quarantine, WriteBack};
pub use start::ClusterBuilder;
pub use strata_boundary::{BackendKinds, Capabilities, DTypeSet, Features};
pub use strata_chip_runtime::kernel::Signature;
pub use strata_client::ClientTls;
pub use strata_orchestrator_core::sched::Policy as SchedulerPolicy;
pub use strata_orchestrator_core::{FailureCause, FailureKind, Outcome, TaskId, WorkerId};
pub use summary::RunSummary;
pub use task::{Task, TaskHandle};
pub use trace::Trace;
