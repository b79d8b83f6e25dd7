//! Why a task, or a call about tasks, was refused.

use std::fmt;

use strata_orchestrator_core::{CancelError, ScopeError, TaskId, WorkerId};
use strata_proto::convert::Features;
use strata_wire::{BackendKind, DType};

use super::BufferError;
use crate::paths::WorkerPath;

/// Why a task, or a call about tasks, was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// A worker id the cluster does not have.
    #[error("there is no {worker}")]
    NoWorker {
        /// The id.
        worker: WorkerId,
    },
    /// `name@version` whose version is not a number.
    #[error("callable {callable:?}: the version is not a number")]
    BadVersion {
        /// The callable as named.
        callable: String,
    },
    /// A callable no worker offers.
    #[error("unknown callable {name:?}; the workers offer {}", .offered.join(", "))]
    UnknownCallable {
        /// The name.
        name: String,
        /// The names the workers offer.
        offered: Vec<String>,
    },
    /// A callable (or version) no worker the task may go to offers,
    /// registered on some whose chip has no body for it (a CUDA chip runs
    /// only kernels with a CUDA body).
    #[error("callable {callable:?} has no body for the chip of {}", .workers.join(", "))]
    NoBody {
        /// The callable as named (`name` or `name@version`).
        callable: String,
        /// The workers it is registered on without a body, each as
        /// `worker N (device spec)`.
        workers: Vec<String>,
        /// Their ids, in the same order.
        ids: Vec<WorkerId>,
    },
    /// A version of a callable no worker offers.
    #[error(
        "callable {name:?} has no version {version}; the workers offer {}",
        .offered.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    UnknownVersion {
        /// The name.
        name: String,
        /// The version asked for.
        version: u32,
        /// The versions offered.
        offered: Vec<u32>,
    },
    /// An argument's buffer cannot be used any more (its run or its scope
    /// ended, or its worker was lost).
    #[error("{callable}: argument {arg}: buffer: {source}")]
    DeadArgument {
        /// The task's callable.
        callable: String,
        /// The argument.
        arg: usize,
        /// Why (boxed: it is the largest reason, and rare).
        source: Box<BufferError>,
    },
    /// Two arguments live on different workers' devices.
    #[error(
        "{callable}: argument {first} lives on {first_worker}'s device ({first_path}) and argument {second} on {second_worker}'s ({second_path}): a task runs on one worker"
    )]
    DevicesDiffer {
        /// The task's callable.
        callable: String,
        /// The earlier argument.
        first: usize,
        /// Its worker.
        first_worker: WorkerId,
        /// That worker's path, as its buffers' descriptors name it.
        first_path: WorkerPath,
        /// The later argument.
        second: usize,
        /// Its worker.
        second_worker: WorkerId,
        /// That worker's path, as its buffers' descriptors name it.
        second_path: WorkerPath,
    },
    /// Placed on one worker with an argument on another's device.
    #[error(
        "{callable}: placed on {placed}, but argument {arg} lives on {device}'s device ({device_path})"
    )]
    PlacedAway {
        /// The task's callable.
        callable: String,
        /// Where it was placed.
        placed: WorkerId,
        /// The argument.
        arg: usize,
        /// Where that argument lives.
        device: WorkerId,
        /// That worker's path, as the buffer's descriptor names it.
        device_path: WorkerPath,
    },
    /// A shared device buffer could not be mapped on the worker a task
    /// was placed on.
    #[error(
        "{callable}: argument {arg}, shared buffer {buffer} of {owner}, could not be mapped on {worker}, where the task runs: {source}"
    )]
    SharedImport {
        /// The task's callable.
        callable: String,
        /// The argument.
        arg: usize,
        /// The buffer.
        buffer: strata_wire::CanonicalIdentity,
        /// The worker whose device it lives on.
        owner: WorkerId,
        /// The worker it was to be mapped on.
        worker: WorkerId,
        /// Why not: the exporter's or the importer's refusal.
        #[source]
        source: Box<crate::Error>,
    },
    /// No worker the member may go to can take it: one lacks the kind of
    /// buffer or the dtype of an argument, or a feature the task requires
    /// ([`crate::Task::require`]). Each [`Lack`] names the argument, what
    /// it needs and the workers without it.
    #[error(
        "member {member}: {callable}: {}: {}",
        match .placed {
            Some(w) => format!("placed on {w}, which cannot take it"),
            None => "no worker that offers it can take it".to_owned(),
        },
        .lacks.iter().map(Lack::to_string).collect::<Vec<_>>().join("; ")
    )]
    Incapable {
        /// The member.
        member: usize,
        /// Its callable.
        callable: String,
        /// The worker it was placed on, if it was (`worker N (address)`).
        placed: Option<String>,
        /// What is missing, argument by argument.
        lacks: Vec<Lack>,
    },
    /// A member placed on a worker the cluster does not have.
    #[error("{callable}: member {member}: there is no {worker} (the cluster has {workers})")]
    UnknownPlacement {
        /// The member's callable.
        callable: String,
        /// The member.
        member: usize,
        /// The worker named.
        worker: WorkerId,
        /// The cluster's workers.
        workers: usize,
    },
    /// A member placed on a worker that does not offer its callable.
    #[error("member {member}: {callable} is not registered on {worker}")]
    NotRegistered {
        /// The member.
        member: usize,
        /// Its callable.
        callable: String,
        /// The worker named.
        worker: WorkerId,
    },
    /// Two members of a group placed on one worker.
    #[error("member {member}: {worker} already runs another member of this group")]
    WorkerTaken {
        /// The later member.
        member: usize,
        /// The worker.
        worker: WorkerId,
    },
    /// No worker offers a member's callable.
    #[error("member {member}: no worker offers {callable}")]
    NotOffered {
        /// The member.
        member: usize,
        /// Its callable.
        callable: String,
    },
    /// A group of more members than the cluster has workers.
    #[error("a group of {members} members needs as many workers; there are {workers}")]
    GroupTooLarge {
        /// Members.
        members: usize,
        /// Workers.
        workers: usize,
    },
    /// The DAG's submit-time rules refused it (the rule names the member
    /// and argument).
    #[error("{}", .0.reason)]
    Rejected(#[from] strata_orchestrator_core::SubmitError),
    /// A task that cannot be cancelled.
    #[error("cannot cancel {task}: {reason}")]
    Cancel {
        /// The task.
        task: TaskId,
        /// Why.
        reason: CancelError,
    },
    /// An unknown or ended scope.
    #[error("scope: {0}")]
    Scope(#[from] ScopeError),
    /// A refusal of a job built over the cluster, in that job's words
    /// (the demos, a graph file's task), with where it was.
    #[error("{0}")]
    Job(String),
    /// A task's timeout is zero: it could never be met.
    #[error("{callable}: a timeout of zero can never be met; give a positive one, or none")]
    ZeroTimeout {
        /// The task's callable.
        callable: String,
    },
    /// A refusal of the task at `path` of a graph file.
    #[error("{path}: {error}")]
    At {
        /// Where the task is (`tasks[3]`).
        path: String,
        /// Why it was refused.
        error: Box<SubmitError>,
    },
}

/// What a task needs of the worker that runs it, one thing at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Need {
    /// An argument's buffer is of this kind.
    Backend(BackendKind),
    /// An argument has this dtype.
    DType(DType),
    /// The task requires this feature (one bit).
    Feature(Features),
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Need::Backend(k) => write!(f, "{} buffers", k.name()),
            Need::DType(d) => write!(f, "dtype {d}"),
            Need::Feature(x) => write!(f, "feature {x}"),
        }
    }
}

/// One thing a member needs that workers it may go to lack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lack {
    /// The argument that needs it; `None` for a feature the task requires.
    pub arg: Option<usize>,
    /// What it needs.
    pub need: Need,
    /// The workers without it: id and address.
    pub workers: Vec<(WorkerId, String)>,
}

impl fmt::Display for Lack {
    /// `argument 1 needs dtype C128, which worker 0 (unix:/…) and worker 2
    /// (tcp:…) lack`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.arg {
            Some(i) => write!(f, "argument {i} needs {}", self.need)?,
            None => write!(f, "the task requires {}", self.need)?,
        }
        let names: Vec<String> = self
            .workers
            .iter()
            .map(|(w, at)| format!("{w} ({at})"))
            .collect();
        let verb = if names.len() == 1 { "lacks" } else { "lack" };
        let list = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => names.concat(),
        };
        write!(f, ", which {list} {verb}")
    }
}

impl From<strata_orchestrator_core::Refusal> for SubmitError {
    fn from(r: strata_orchestrator_core::Refusal) -> Self {
        match r {
            strata_orchestrator_core::Refusal::Submit(e) => SubmitError::Rejected(e),
            strata_orchestrator_core::Refusal::Cancel(reason) => SubmitError::Cancel {
                task: reason.task(),
                reason,
            },
            strata_orchestrator_core::Refusal::Scope(e) => SubmitError::Scope(e),
            // Refusal is non-exhaustive; every kind the engine has today
            // is above.
            other => SubmitError::Job(other.to_string()),
        }
    }
}

impl From<strata_orchestrator_core::Refusal> for super::Error {
    fn from(r: strata_orchestrator_core::Refusal) -> Self {
        super::Error::Submit(r.into())
    }
}
