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
pub mod inspect;
mod progress;
pub mod run;

/// The device caches' figures summed over the workers, as one line; `None`
/// when no worker cached anything (unified or remote chips, or the cache
/// turned off).
fn cache_line(cluster: &strata_orchestrator::Cluster) -> Option<String> {
    // hits, bytes hit, misses, bytes loaded, on-chip bytes, written back,
    // evictions
    let mut t = [0u64; 7];
    for w in cluster.workers() {
        let c = cluster.worker_stats(w.id).ok()?.cache;
        let add = [
            c.hits,
            c.hit_bytes,
            c.misses,
            c.loaded,
            c.device_to_device,
            c.written_back,
            c.evictions,
        ];
        for (sum, v) in t.iter_mut().zip(add) {
            *sum += v;
        }
    }
    let [
        hits,
        hit_bytes,
        misses,
        loaded,
        on_chip,
        written_back,
        evictions,
    ] = t;
    (hits + misses > 0).then(|| {
        format!(
            "device cache: {hits} hits ({hit_bytes} bytes found on chips), {misses} misses ({loaded} bytes copied in), {on_chip} bytes copied on chips, {written_back} bytes written back, {evictions} evictions"
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
            strata_worker::cli::run(args, strata_chip::Registry::with_builtins())
        }
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
