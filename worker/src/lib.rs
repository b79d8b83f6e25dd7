//! `strata-worker`: the worker node, one process per chip (docs/worker.md).
//!
//! A worker serves the orchestrator over gRPC (`strata-proto`), receives
//! buffer fds over a Unix side channel ([`fdchan`]), maps each imported
//! buffer once by identity (the import registry of `strata-worker-core`),
//! and runs tasks on its chip (`strata-chip`): decode and validate the
//! blob, resolve and materialize every argument, launch, complete. A bad
//! task fails with a precise cause; the worker keeps serving.
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
//! or embed one: `Worker::new(config).kernel(k)?.bind().await?.serve(shutdown).await`;
//! or run one inside your process without any socket: [`InProcessWorker`].
//!
//! # Features
//!
//! `server` (on by default) builds the gRPC server side: [`Worker`],
//! [`BoundWorker`], the listeners, the token check, the fd channel's
//! server end and [`cli`]. Without it the crate is the in-process worker
//! and what it runs on (node, execution, imports), which is all an
//! orchestrator that only talks to workers needs. The client lives in
//! `strata-client`; it is re-exported here under its old paths.

// `unsafe` lives in three places only, each allowed where it is: taking
// ownership of fds the kernel installed (fdchan.rs), the `HostMemory`
// contract of a mapped import (imports.rs), and `_exit` when the driver
// is gone (orphan.rs: neither std nor nix offers it safely).
#![deny(unsafe_code)]

#[cfg(feature = "server")]
mod auth;
#[cfg(feature = "server")]
mod bulk;
#[cfg(feature = "server")]
pub mod cli;
pub mod config;
mod exec;
#[cfg(feature = "server")]
pub mod fdchan;
mod imports;
mod inproc;
#[cfg(feature = "server")]
mod listen;
mod node;
mod ops;
#[cfg(feature = "server")]
mod orphan;
#[cfg(feature = "server")]
mod ring;
#[cfg(feature = "server")]
mod server;
#[cfg(feature = "server")]
mod service;
#[cfg_attr(not(feature = "server"), allow(dead_code))]
mod staging;
mod tombstones;

pub use config::{Auth, DRIVER_MARKER, Endpoint, TlsFiles, WorkerConfig};
pub use imports::HostMapping;
pub use inproc::{InProcessSession, InProcessWorker};
pub use ops::NodeError;
#[cfg(feature = "server")]
pub use server::{BoundWorker, Worker};
/// The worker client, now the `strata-client` crate: re-exported so that
/// `strata_worker::client::…` paths keep compiling. New code imports
/// `strata_client` directly.
pub use strata_client as client;
pub use strata_client::{ClientError, ClientTls, Handshake, HealthWatch, TaskStream, WorkerClient};
pub use strata_proto::convert::{InstanceId, SessionState};
pub use strata_worker_core::SessionId;

/// Why a worker could not start or serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A setting is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// A socket could not be bound.
    #[error("cannot listen on {0}")]
    Bind(String),
    /// The server failed.
    #[error("server: {0}")]
    Serve(String),
    /// The thread that watches stdin for the driver's exit
    /// (`--exit-with-stdin`) could not be started.
    #[error("cannot watch stdin for the driver's exit: {0}")]
    StdinWatch(#[source] std::io::Error),
}
