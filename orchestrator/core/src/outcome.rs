//! The words the cores' parts share about a task's end and their
//! refusals: how a task ended ([`Outcome`], the run's [`FirstError`]), a
//! placement that cannot work ([`PlacementError`]) and a cancel of a task
//! that is not waiting ([`CancelError`]). A leaf module, so that the DAG,
//! the scheduler and their [`Action`](crate::Action)s all use it and none
//! imports another for it.

use strata_boundary::{Capabilities, FailureCause, FailureKind};

use crate::ids::{KernelHandle, TaskId, WorkerId};

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every member ran to success.
    Success,
    /// The task failed where it was sent (its kernel, its arguments, its
    /// chip, its timeout); the cause.
    TaskFailure(FailureCause),
    /// Its worker died, hung, or its link broke, or its bytes are
    /// quarantined by such a loss; the cause.
    EndpointFailure(FailureCause),
    /// Cancelled before it started.
    Cancelled,
    /// Not run, because a task it depends on failed.
    Skipped {
        /// The failed task at the root.
        because: TaskId,
    },
}

impl Outcome {
    /// Whether the task produced its outputs.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Success)
    }

    /// What kind of failure it was (`None` for success).
    pub fn kind(&self) -> Option<FailureKind> {
        match self {
            Outcome::Success => None,
            Outcome::TaskFailure(c) | Outcome::EndpointFailure(c) => Some(c.kind),
            Outcome::Cancelled => Some(FailureKind::Cancelled),
            Outcome::Skipped { .. } => Some(FailureKind::Skipped),
        }
    }

    /// The cause of a failure, where one was given (not for success,
    /// cancelled or skipped).
    pub fn cause(&self) -> Option<&FailureCause> {
        match self {
            Outcome::TaskFailure(c) | Outcome::EndpointFailure(c) => Some(c),
            _ => None,
        }
    }
}

/// The first failure of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstError {
    /// The task.
    pub task: TaskId,
    /// Its callable (of the member that failed).
    pub callable: KernelHandle,
    /// The worker it failed on, if it got one.
    pub worker: Option<WorkerId>,
    /// The outcome.
    pub outcome: Outcome,
}

/// Why the scheduler cannot place a task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// A member is placed on a worker the scheduler does not know.
    #[error("member {member}: {worker} is unknown")]
    UnknownWorker {
        /// The member.
        member: usize,
        /// The worker it names.
        worker: WorkerId,
    },
    /// A member is placed on a worker that does not offer its callable.
    #[error("member {member}: callable {callable} is not registered on {worker}")]
    NotRegistered {
        /// The member.
        member: usize,
        /// Its callable.
        callable: KernelHandle,
        /// The worker it names.
        worker: WorkerId,
    },
    /// Two members of a group are placed on one worker.
    #[error("member {member}: {worker} already runs another member of this group")]
    WorkerTaken {
        /// The later member.
        member: usize,
        /// The worker both name.
        worker: WorkerId,
    },
    /// No worker offers a member's callable.
    #[error("member {member}: no worker offers callable {callable}")]
    NotOffered {
        /// The member.
        member: usize,
        /// Its callable.
        callable: KernelHandle,
    },
    /// A member is placed on a worker without what it needs.
    #[error("member {member}: {worker} lacks what it needs: {missing}")]
    Lacks {
        /// The member.
        member: usize,
        /// The worker it names.
        worker: WorkerId,
        /// What the worker lacks of it.
        missing: Capabilities,
    },
    /// Workers offer a member's callable, but none has what it needs.
    #[error(
        "member {member}: no worker that offers callable {callable} has what it needs ({needs})"
    )]
    NoneCapable {
        /// The member.
        member: usize,
        /// Its callable.
        callable: KernelHandle,
        /// What it needs.
        needs: Capabilities,
    },
    /// A group has more members than there are workers.
    #[error("a group of {members} members needs as many workers; there are {workers}")]
    GroupTooLarge {
        /// Members of the group.
        members: usize,
        /// Workers known.
        workers: usize,
    },
}

/// Why a task cannot be cancelled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CancelError {
    /// No such task is live (never submitted, or finished).
    #[error("{0} is unknown")]
    Unknown(TaskId),
    /// It is not live any more (the DAG retired it).
    #[error("{0} is not live")]
    NotLive(TaskId),
    /// It is running.
    #[error("{0} is already running")]
    Running(TaskId),
    /// It was lost with its worker.
    #[error("{0} was lost with its worker")]
    Lost(TaskId),
    /// It may still run on a worker lost without a fence.
    #[error("{task} may still be running on {worker}, which was lost without a fence")]
    Fencing {
        /// The task.
        task: TaskId,
        /// The lost worker.
        worker: WorkerId,
    },
}

impl CancelError {
    /// The task that was not cancelled.
    pub fn task(&self) -> TaskId {
        match self {
            CancelError::Unknown(t)
            | CancelError::NotLive(t)
            | CancelError::Running(t)
            | CancelError::Lost(t)
            | CancelError::Fencing { task: t, .. } => *t,
        }
    }
}
