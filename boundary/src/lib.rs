//! The vocabulary every layer of strata uses for what crosses between a
//! driver and its workers, so that no layer turns it into text and back.
//!
//! Today that is why a task failed: [`FailureCause`], a [`FailureKind`]
//! a program can match on beside the words a person reads. A worker
//! sends the kind in its completion; the orchestrator's core carries it
//! in its outcomes; the driver's errors, `RunSummary`, the graph runner
//! and Python's `TaskFailed.kind` show it. Only the message is text.
//!
//! The crate is pure (no IO, no dependencies), so that the IO-free cores
//! may use it as well as the processes.

mod failure;

pub use failure::{FailureCause, FailureKind};
