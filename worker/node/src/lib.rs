//! `strata-worker-node`: one chip's worker node, without any server
//! (docs/worker.md).
//!
//! A [`Node`] holds the chip, the callables it runs, the buffers its
//! sessions imported (mapped once by identity: the import registry of
//! `strata-worker-core`) and the device buffers they allocated, and runs
//! their tasks: decode and validate the blob, resolve and materialize
//! every argument, launch, complete. A bad task fails with a precise cause;
//! the node keeps serving its other sessions.
//!
//! Two things drive a node, in two different processes:
//!
//! - the worker process (`strata-worker`: its gRPC service, fd channel,
//!   ring reader and data connections), one per chip;
//! - an [`InProcessWorker`], reached by calls from the driver's own
//!   process, with no socket and no encoding.
//!
//! Both reach the node through the same calls ([`NodeError`] says why one
//! was refused) and hand tasks to a session's [`Intake`], naming where
//! its completions go with a [`CompletionSink`]; so a worker behaves the
//! same whichever way it is reached.

// `unsafe` lives in one place only: the `HostMemory` contract of a mapped
// import (imports.rs).
#![deny(unsafe_code)]

mod exec;
mod imports;
mod inproc;
mod intake;
mod node;
mod ops;
pub mod staging;
#[cfg(test)]
mod tests;
mod tombstones;

pub use imports::{CopiedImport, HostMapping, IMPORTED_KINDS, Import, check_arrival};
pub use inproc::{InProcessSession, InProcessWorker};
pub use intake::{CompletionSink, Intake};
pub use node::{DEFAULT_MAX_IN_FLIGHT, Limits, Node, Session};
pub use ops::NodeError;
pub use strata_worker_core::SessionId;
