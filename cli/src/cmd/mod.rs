//! The `strata` command line: argument definitions and dispatch.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `println!` that ignores a closed stdout (`strata demo | head` must not
/// panic): the work goes on, its report is simply not read.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod demo;
pub mod devices;
pub mod inspect;
mod progress;
pub mod run;

/// `--write-back`: when written bytes go back to host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WriteBackArg {
    /// When each task ends.
    Through,
    /// When something needs them.
    Deferred,
}

impl From<WriteBackArg> for strata_orchestrator::WriteBack {
    fn from(w: WriteBackArg) -> Self {
        match w {
            WriteBackArg::Through => strata_orchestrator::WriteBack::Through,
            WriteBackArg::Deferred => strata_orchestrator::WriteBack::Deferred,
        }
    }
}

/// `--scheduler`: where tasks without a named worker go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulerArg {
    /// The worker with the least outstanding work, queues in ready order.
    LeastLoaded,
    /// The worker where the task is expected to finish first, by
    /// performance models learned from the run (as StarPU's dmda).
    Dmda,
    /// As dmda, with each worker's queue ordered by the critical path
    /// (upward rank) first.
    Dmdas,
}

impl From<SchedulerArg> for strata_orchestrator::SchedulerPolicy {
    fn from(s: SchedulerArg) -> Self {
        match s {
            SchedulerArg::LeastLoaded => strata_orchestrator::SchedulerPolicy::LeastLoaded,
            SchedulerArg::Dmda => strata_orchestrator::SchedulerPolicy::Dmda,
            SchedulerArg::Dmdas => strata_orchestrator::SchedulerPolicy::Dmdas,
        }
    }
}

/// Where a run's bytes went, as lines: copies between host and device
/// memory and on the chips, bytes to and from remote workers, and the
/// device caches' hits, misses, write-backs and evictions (that line only
/// when some chip cached), and how well the performance models predicted
/// the kernels' times (only when they predicted some).
fn transfer_lines(s: &strata_orchestrator::RunSummary) -> Vec<String> {
    let mut lines = vec![format!(
        "bytes host->device {} ({} ahead of their task), device->host {}, on chips {}",
        s.to_device_bytes, s.prefetched_bytes, s.from_device_bytes, s.on_chip_bytes
    )];
    if s.sent_bytes + s.returned_bytes + s.held_bytes > 0 {
        lines.push(format!(
            "remote workers: {} bytes sent, {} returned, {} left out as held on their chips ({} tasks resent)",
            s.sent_bytes, s.returned_bytes, s.held_bytes, s.resent
        ));
    }
    if s.cache_hits + s.cache_misses > 0 {
        lines.push(format!(
            "device cache: {} hits, {} misses, {} write-backs, {} evictions",
            s.cache_hits, s.cache_misses, s.write_backs, s.evictions
        ));
    }
    if let Some(e) = s.prediction_error() {
        lines.push(format!(
            "performance models: {} kernel times predicted, {:.0}% off in all",
            s.predicted,
            e * 100.0
        ));
    }
    lines
}

/// A line saying how many bytes went through staging buffers on the
/// workers' chips because their host memory could not be page-locked in
/// place for DMA (a CUDA chip's fallback), when any did.
fn bounce_line(cluster: &strata_orchestrator::Cluster) -> Option<String> {
    let bounced: u64 = cluster
        .workers()
        .iter()
        .filter_map(|w| cluster.worker_stats(w.id).ok())
        .map(|s| s.bounced)
        .sum();
    (bounced > 0).then(|| {
        format!(
            "bytes staged through staging buffers {bounced} (host memory that could not be page-locked in place for DMA)"
        )
    })
}

/// strata: an async, multi-process task dispatcher for accelerator chips.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Decode a TaskArgs blob or a single 144-byte tensor record and print it as JSON.
    ///
    /// The file is read as one tensor record when it is exactly 144 bytes
    /// (and not a blob of 17 scalars), as a TaskArgs blob
    /// `[i32 T][i32 S][Tensor × T][u64 × S]` otherwise. Invalid input is
    /// reported with the validator's message, naming the field, and exit
    /// status 2.
    #[command(
        after_help = "Examples:\n  strata inspect examples/wire/matmul_tile.args\n  strata inspect --compact args.bin | jq .tensors[0].shape"
    )]
    Inspect {
        /// The file to decode.
        file: PathBuf,
        /// Print the JSON on one line.
        #[arg(long)]
        compact: bool,
    },
    /// Start local simulated chips and run real work on them end to end,
    /// checking every result.
    ///
    /// Runs C = A·B in tiles accumulated in device memory (one block of
    /// rows per worker), then a row softmax and row sums: 4,144 tasks at
    /// the default size, their dependencies inferred from the bytes they
    /// touch. Checks the results against single-threaded references and
    /// exits 0 when they match.
    Demo(demo::DemoArgs),
    /// Run a job described by a graph file (JSON): buffers, views, tasks,
    /// outputs written as .npy.
    ///
    /// The whole file is checked before anything starts; a problem is
    /// reported with its JSON path (such as `tasks[3].args[1].view:
    /// unknown view "c0"`) and exit status 2. The format is documented in
    /// docs/graph-format.md.
    Run(run::RunArgs),
    /// Serve one chip: run tasks for an orchestrator over gRPC.
    ///
    /// Listens on a Unix socket (with a second socket for buffer fds) or on
    /// TCP (with a bearer token and/or TLS client certificates). Prints one
    /// ready line to stdout once serving; stops on SIGTERM after finishing
    /// the tasks in flight.
    Worker(strata_worker::cli::WorkerArgs),
    /// List the chips this machine offers: the simulated chip, and CUDA's
    /// driver, GPUs (memory, compute capability, compute mode) and
    /// libraries (NVRTC, cuBLAS, cuSOLVER), each with its version and the
    /// file loaded, or what is missing.
    ///
    /// Exits 0 when a cuda:N chip opens here, 1 when a piece CUDA needs is
    /// missing.
    Devices,
}

/// Runs a parsed command line and returns the process exit status.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Inspect { file, compact } => inspect::run(&file, compact),
        Command::Demo(args) => {
            init_logging();
            demo::run(&args)
        }
        Command::Run(args) => {
            init_logging();
            run::run(&args)
        }
        Command::Worker(args) => {
            strata_worker::cli::run(args, strata_chip_runtime::Registry::with_builtins())
        }
        Command::Devices => devices::run(),
    }
}

/// `RUST_LOG`-style logging to stderr (default: warnings and errors).
fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// How many local workers `strata run` and `strata demo` start on
/// `device` when `asked` is not given: 4 simulated chips, 1 worker for
/// `cuda:N`, one per GPU for `cuda:all`. A number asked for is kept
/// (`cuda:all` checks it against the GPUs). For `cuda:all` this asks the
/// CUDA driver for its GPUs, and the cluster's start asks again: the
/// count is needed before the start (for the graph's worker numbers and
/// for in-process workers), and a second `cuInit` costs little.
///
/// # Errors
/// A spec no worker accepts; for `cuda:all`, no CUDA driver or GPU, or
/// a number that is not the GPUs'.
pub(crate) fn local_workers(
    device: &str,
    asked: Option<usize>,
) -> Result<usize, strata_orchestrator::ClusterError> {
    use strata_chip_runtime::{ChipSpec, CudaOrdinal};
    match device.parse::<ChipSpec>() {
        Ok(ChipSpec::Sim(_)) => Ok(asked.unwrap_or(4)),
        Ok(ChipSpec::Cuda(c)) if c.ordinal != CudaOrdinal::All => Ok(asked.unwrap_or(1)),
        // cuda:all, and a spec that does not parse (the error says why).
        _ => strata_orchestrator::worker_chips(device, asked.unwrap_or(0)).map(|v| v.len()),
    }
}
