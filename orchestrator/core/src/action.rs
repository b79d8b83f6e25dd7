//! What the cores ask their owner to do: one vocabulary for the scheduler
//! (which asks only for [`Action::Dispatch`] and [`Action::Done`]) and the
//! engine that composes it with the DAG.

use strata_wire::CanonicalIdentity;

use crate::dag::{ScopeError, SubmitError};
use crate::ids::{ScopeId, TaskId, WorkerId};
use crate::outcome::{CancelError, Outcome};

/// A task's predecessors with the kinds of each edge (bits of
/// [`crate::dag::edge`]).
pub type Edges = Vec<(TaskId, u8)>;

/// What the engine (or the scheduler) asks its owner to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A submitted task is in, after these predecessors; the actions that
    /// follow in the same answer are its first (a dispatch, or its `Done`
    /// when it is born skipped).
    Accepted {
        /// The task.
        task: TaskId,
        /// Its live predecessors and the kinds of each edge.
        edges: Edges,
    },
    /// An event was refused; nothing changed.
    Refused(Refusal),
    /// Send member `member` of `task` to `worker`.
    Dispatch {
        /// The task.
        task: TaskId,
        /// Which member.
        member: usize,
        /// Where.
        worker: WorkerId,
        /// The task's upward rank when dispatched: its longest modelled
        /// path to the end of the graph, in ns (0 when the policy does not
        /// rank). A chip that can favour some work (a CUDA chip's
        /// high-priority streams) favours the higher.
        rank: u64,
    },
    /// The task is finished, with this outcome.
    Done {
        /// The task.
        task: TaskId,
        /// How it ended.
        outcome: Outcome,
    },
    /// A scoped buffer is no longer used: release it.
    Release(CanonicalIdentity),
    /// The task was running on a worker lost without a fence: the bytes it
    /// writes are quarantined until [`Action::Lifted`]. Comes before the
    /// task's `Done` (if it is done now; a task allowed to retry waits).
    Quarantined {
        /// The task.
        task: TaskId,
        /// The loss.
        loss: Loss,
    },
    /// The loss that quarantined the task's bytes is fenced: the task can
    /// no longer write them.
    Lifted {
        /// The task.
        task: TaskId,
    },
    /// A scope was opened, with this id.
    ScopeOpened(ScopeId),
}

/// Why an event was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// A submission: its placement cannot work with the workers up, or its
    /// id does not come after every earlier one.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// A cancel: the task is running, finished or unknown.
    #[error(transparent)]
    Cancel(#[from] CancelError),
    /// A scope call: the scope is unknown or ended.
    #[error(transparent)]
    Scope(#[from] ScopeError),
}

/// One loss of a worker: the worker and how many times it had been lost
/// by then (1 for the first loss).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loss {
    /// The worker.
    pub worker: WorkerId,
    /// Its loss count at this loss.
    pub epoch: u64,
}
