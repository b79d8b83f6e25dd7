//! The driver API's errors: one [`Error`] whose variants each hold a
//! typed reason a program can match on ([`ClusterError`], [`BufferError`],
//! [`ViewError`], [`QuarantinedBytes`], [`SubmitError`], [`NpyError`],
//! [`TraceError`], the worker's [`LinkError`], a task's [`RunError`]).
//! Lower layers' errors (`strata_wire::Error`, `strata_orchestrator_core::SubmitError`,
//! `std::io::Error`) are kept as they came, not turned into text.

mod buffer;
mod cluster;
mod files;
mod submit;

pub use buffer::{BufferError, QuarantinedBytes, ViewError};
pub use cluster::ClusterError;
pub use files::{NpyError, TraceError};
use strata_orchestrator_core::{Outcome, TaskId, WorkerId};
pub use submit::{Lack, Need, SubmitError};

use crate::link::LinkError;

/// Why a driver call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cluster could not start, or a worker could not be reached.
    #[error("cluster: {0}")]
    Cluster(#[from] ClusterError),
    /// A buffer could not be made, read or written.
    #[error("buffer: {0}")]
    Buffer(#[from] BufferError),
    /// A view is malformed or does not fit its buffer (names the field).
    #[error("view: {0}")]
    View(#[from] ViewError),
    /// The bytes are quarantined: a task that writes them was lost without
    /// a fence and its worker may still write them.
    #[error("quarantined: {0}")]
    Quarantined(#[from] QuarantinedBytes),
    /// A task (or a call about one) was refused; nothing was queued.
    #[error("submit: {0}")]
    Submit(#[from] SubmitError),
    /// A worker refused or failed a control call.
    #[error("{worker}: {error}")]
    Worker {
        /// The worker.
        worker: WorkerId,
        /// Why: lost, unreachable, refused (and why), timed out...
        error: LinkError,
    },
    /// A task of the run did not succeed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A `.npy` file could not be read or written.
    #[error("{path}: {reason}")]
    Npy {
        /// The file.
        path: String,
        /// Why.
        reason: NpyError,
    },
    /// A trace could not be written.
    #[error("trace: {0}")]
    Trace(#[from] TraceError),
    /// The cluster is shut down (or its actors stopped).
    #[error("the cluster is shut down")]
    Closed,
}

/// A task that did not succeed: which, running what, where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{task} ({callable}){}: {}", .worker.as_ref().map(|w| format!(" on {w}")).unwrap_or_default(), describe(.outcome))]
pub struct RunError {
    /// The task.
    pub task: TaskId,
    /// Its callable, `name@version`.
    pub callable: String,
    /// The worker it ran on (id and address), if it was dispatched.
    pub worker: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Success => "SUCCESS".into(),
        Outcome::TaskFailure(c) => format!("TASK_FAILURE ({}): {}", c.kind, c.message),
        Outcome::EndpointFailure(c) => format!("ENDPOINT_FAILURE ({}): {}", c.kind, c.message),
        Outcome::Cancelled => "CANCELLED".into(),
        Outcome::Skipped { because } => format!("SKIPPED: {because} failed"),
    }
}
