//! `strata-worker`: the worker process, one per chip (docs/worker.md).
//!
//! A worker process serves one chip's node (`strata-worker-node`) to the
//! orchestrators that connect: the gRPC service (`strata-proto`), the Unix
//! side channel that receives buffer fds and ring memfds ([`fdchan`]), the
//! shared-memory ring's reader and completion flusher, and the TCP data
//! connections of remote sessions. Each turns what arrived into calls on
//! the node and hands tasks to the session's intake; everything that
//! arrives is checked before the node sees it, so a bad client fails its
//! own call and the worker keeps serving the others.
//!
//! Build a worker binary with your own kernels:
//!
//! ```no_run
//! use std::sync::Arc;
//! use strata_chip_runtime::Registry;
//! # fn my_kernel() -> Arc<dyn strata_chip_runtime::Kernel> { unimplemented!() }
//! let mut kernels = Registry::with_builtins();
//! kernels.register(my_kernel()).unwrap();
//! // In main: parse `strata_worker::cli::WorkerArgs` with clap, then
//! // std::process::exit(... strata_worker::cli::run(args, kernels) ...)
//! ```
//!
//! or embed one: `Worker::new(config).kernel(k)?.bind().await?.serve(shutdown).await`.
//! A worker inside the driver's own process, with no socket at all, is
//! `strata_worker_node::InProcessWorker`; the client side of the protocol
//! is `strata-client`.

// `unsafe` lives in two places only, each allowed where it is: taking
// ownership of fds the kernel installed (fdchan.rs) and `_exit` when the driver
// is gone (orphan.rs: neither std nor nix offers it safely).
#![deny(unsafe_code)]

mod auth;
mod bulk;
pub mod cli;
pub mod config;
pub mod fdchan;
mod listen;
mod orphan;
mod ring;
mod server;
mod service;

pub use config::{Auth, DRIVER_MARKER, Endpoint, TlsFiles, WorkerConfig};
pub use server::{BoundWorker, Worker};

/// Why a worker could not start or serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A setting is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// The chip could not be opened: a bad device spec, or a chip that is
    /// not there (a CUDA chip names the library or device it lacks).
    #[error("chip {chip}: {source}")]
    Device {
        /// The chip this worker was to own (`--chip`).
        chip: u32,
        /// Why.
        source: strata_chip_runtime::Error,
    },
    /// A socket could not be bound.
    #[error("cannot listen on {0}")]
    Bind(String),
    /// The server failed.
    #[error("server: {0}")]
    Serve(String),
    /// The chip can run nothing more (a GPU whose context a fault lost):
    /// the worker finished what was in flight (each failed with that
    /// cause), stopped, and exits so that it can be replaced.
    #[error("chip lost: {0}; exiting so that the worker can be replaced")]
    ChipLost(String),
    /// The thread that watches stdin for the driver's exit
    /// (`--exit-with-stdin`) could not be started.
    #[error("cannot watch stdin for the driver's exit: {0}")]
    StdinWatch(#[source] std::io::Error),
}
