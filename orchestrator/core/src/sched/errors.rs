//! Why the scheduler refuses: a placement that cannot work, a cancel of a
//! task that is not waiting.

use crate::ids::{KernelHandle, TaskId, WorkerId};

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
