//! `strata-core`: the IO-free heart of the orchestrator
//! (docs/scheduling.md).
//!
//! - [`Dag`]: dependency inference. From tasks with tagged tensor
//!   arguments it builds the DAG whose every schedule gives the bytes of
//!   running the tasks one by one in submission order (RAW, WAW, WAR per
//!   byte, through a per-buffer index and the overlap engine).
//! - [`Scheduler`]: placement, ready queues, bounded in-flight windows,
//!   groups, completions, failures, endpoint loss.
//! - [`Engine`]: the two composed, as the orchestrator's DAG/scheduler actor
//!   owns them.
//! - [`Directory`]: the versions of bytes workers' device caches hold.
//! - [`sim`]: random programs, a sequential oracle and a simulated
//!   executor, for the differential tests and benchmarks.
//!
//! No IO, no channels, no clocks: calls in, actions out, invariants
//! checked after every transition in debug builds.
//!
//! ```
//! use strata_orchestrator_core::dag::{Arg, NewTask};
//! use strata_orchestrator_core::{Dag, TaskId};
//! use strata_wire::{check::test_buffer, ArgTag, DType, Tensor};
//!
//! let buf = test_buffer(256);
//! let row = |r: u64| Tensor::new(buf, r * 16, &[16], &[1], DType::U8).unwrap();
//! let mut dag = Dag::new();
//! let w = |id, r| NewTask::single(TaskId(id), vec![Arg { tensor: row(r), tag: ArgTag::Output }]);
//! let r = |id, r| NewTask::single(TaskId(id), vec![Arg { tensor: row(r), tag: ArgTag::Input }]);
//! dag.check_and_insert(w(1, 0)).unwrap();
//! dag.check_and_insert(w(2, 1)).unwrap();
//! let reader = dag.check_and_insert(r(3, 1)).unwrap();
//! assert_eq!(reader.edges.len(), 1, "reads row 1: after task 2 only");
//! assert_eq!(reader.edges[0].0, TaskId(2));
//! ```

#![forbid(unsafe_code)]

pub mod action;
pub mod dag;
pub mod engine;
pub mod gate;
pub mod holders;
mod ids;
mod outcome;
pub mod residency;
pub mod sched;
pub mod sim;
mod sync;

pub use action::{Action, Edges, Loss, Refusal};
pub use dag::{CheckedTask, Dag, ScopeError, SubmitError, SubmitReason};
pub use engine::{Engine, Event, Submission};
pub use gate::Gate;
pub use holders::Holders;
pub use ids::{KernelHandle, ScopeId, SeqHasher, SeqMap, TaskId, WorkerId};
pub use residency::Directory;
pub use sched::{CancelError, Outcome, Placement, PlacementError, Scheduler};
pub use strata_boundary::{Capabilities, FailureCause, FailureKind};
