//! Why a cluster could not start, or be used from here.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::link::LinkError;

/// Why a cluster could not start, or could not be used from here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The performance models' file exists but cannot be used.
    #[error("performance models {}: {reason}", .path.display())]
    PerfModels {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The builder asked for no worker at all.
    #[error("no workers: ask for local or in-process workers, or connect to some")]
    NoWorkers,
    /// The device spec of the local and in-process workers is not one a
    /// worker accepts, or names a chip that is not here (a CUDA driver or
    /// GPU missing); checked before any worker is started.
    #[error("local workers' device: {source}")]
    Device {
        /// Why (it names the spec and the device kinds there are).
        source: strata_chip_runtime::Error,
    },
    /// `cuda:all` with a number of workers other than the GPUs'.
    #[error(
        "cuda:all starts one worker per GPU: {asked} {kind} workers were asked for and the CUDA driver sees {gpus} GPUs (ask for {gpus}, or leave the number out)"
    )]
    GpuCount {
        /// The workers asked for.
        asked: usize,
        /// `local` or `in-process`.
        kind: &'static str,
        /// The GPUs the driver sees.
        gpus: u32,
    },
    /// `cuda:all` with both local and in-process workers.
    #[error(
        "cuda:all gives each GPU one worker: {local} local and {in_process} in-process workers were asked for; ask for one kind"
    )]
    GpusTwice {
        /// Local workers asked for.
        local: usize,
        /// In-process workers asked for.
        in_process: usize,
    },
    /// A worker address is malformed.
    #[error("{reason}")]
    Address {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// More workers than ids.
    #[error("too many workers")]
    TooManyWorkers,
    /// The cluster's tokio runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] io::Error),
    /// No `strata` binary to spawn local workers with.
    #[error(
        "cannot find the strata binary to spawn workers: set STRATA_BIN or use ClusterBuilder::worker_binary"
    )]
    NoBinary,
    /// The private directory of the local workers' sockets and logs.
    #[error("temporary directory: {0}")]
    TempDir(#[source] io::Error),
    /// The marker naming this driver could not be written in the private
    /// directory of its local workers.
    #[error("driver marker {}: {source}", .path.display())]
    DriverMarker {
        /// The marker file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A local worker's log file could not be opened.
    #[error("{}: {source}", .path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A local worker process could not be spawned.
    #[error("cannot start {}: {source}", .binary.display())]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A local worker exited, or was not ready in time.
    #[error(
        "local worker {chip} ({}) {}; its log:\n{log}",
        .binary.display(),
        not_ready(.exited, .timeout)
    )]
    NotReady {
        /// Its chip.
        chip: usize,
        /// The binary.
        binary: PathBuf,
        /// How it exited, if it did.
        exited: Option<ExitStatus>,
        /// How long it was waited for.
        timeout: Duration,
        /// The last lines of its log.
        log: String,
    },
    /// A local worker's ready line does not name where it listens.
    #[error("local worker {chip}: unexpected ready line {line:?}")]
    ReadyLine {
        /// Its chip.
        chip: usize,
        /// The line.
        line: String,
    },
    /// The cluster's local workers were shut down (no restart).
    #[error("the cluster's workers were shut down")]
    WorkersShutDown,
    /// A restarted local worker has no process.
    #[error("local worker {chip}: no process")]
    NoProcess {
        /// Its chip.
        chip: usize,
    },
    /// An in-process worker could not start.
    #[error("in-process worker {index}: {source}")]
    InProcess {
        /// Its index among the in-process workers.
        index: usize,
        /// Why.
        source: strata_worker_node::NodeError,
    },
    /// A worker could not be reached at the start.
    #[error(
        "worker {index} ({address}): {error}{}",
        .log.as_ref().map(|l| format!("; its log:\n{l}")).unwrap_or_default()
    )]
    Unreachable {
        /// Its index (the id it would have had).
        index: usize,
        /// Where it was dialed.
        address: String,
        /// Why the link did not open.
        error: LinkError,
        /// The end of its log, for a worker this cluster spawned.
        log: Option<String>,
    },
    /// A blocking cluster call was made inside an async runtime.
    #[error(
        "Cluster calls block: call them from a plain thread (or tokio's spawn_blocking), not inside an async runtime"
    )]
    InsideAsync,
}

fn not_ready(exited: &Option<ExitStatus>, timeout: &Duration) -> String {
    match exited {
        Some(st) => format!("exited ({st}) before it was ready"),
        None => format!("was not ready within {timeout:?}"),
    }
}
