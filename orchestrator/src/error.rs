//! The driver API's errors.

use strata_core::{Outcome, TaskId, WorkerId};

/// Why a driver call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cluster could not start, or a worker could not be reached.
    #[error("cluster: {0}")]
    Cluster(String),
    /// A buffer could not be made, read or written.
    #[error("buffer: {0}")]
    Buffer(String),
    /// A view is malformed or does not fit its buffer (names the field).
    #[error("view: {0}")]
    View(String),

    /// The bytes are quarantined: a task that writes them was lost without
    /// a fence and its worker may still write them.
    #[error("quarantined: {0}")]
    Quarantined(String),
    /// A task was refused at submit time; nothing was queued.
    #[error("submit: {0}")]
    Submit(String),
    /// A worker refused or failed a control call.
    #[error("{worker}: {error}")]
    Worker {
        /// The worker.
        worker: WorkerId,
        /// Why: lost, unreachable, refused (and why), timed out...
        error: crate::link::LinkError,
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
        reason: String,
    },
    /// A trace could not be written.
    #[error("trace: {0}")]
    Trace(String),
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
        Outcome::TaskFailure(c) => format!("TASK_FAILURE: {c}"),
        Outcome::EndpointFailure(c) => format!("ENDPOINT_FAILURE: {c}"),
        Outcome::Cancelled => "CANCELLED".into(),
        Outcome::Skipped { because } => format!("SKIPPED: {because} failed"),
    }
}
