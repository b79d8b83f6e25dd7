//! `strata run GRAPH.json`: a job from a graph file (docs/graph-format.md).

use super::{SchedulerArg, WriteBackArg};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::graph::{Callable, Graph};
use strata_orchestrator::{Cluster, Error, RunSummary};

/// Options of `strata run`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:
  strata run examples/graphs/tiled_matmul.json
  strata run job.json --local 2 --trace job-trace.json
  strata run job.json --in-process             # the --local chips inside this process
  strata run job.json --device cuda:all        # one worker per GPU
  strata run job.json --workers tcp:10.0.0.2:7420,tcp:10.0.0.3:7420 --token-file token

Exit status: 0 when every task succeeded and every output matched its
expectation; 1 when a task failed or an output did not match; 2 when the
graph file is malformed (the message names the JSON path) or an option is
wrong; nothing is started then.")]
pub struct RunArgs {
    /// The graph file (JSON).
    pub graph: PathBuf,
    /// Local workers to start (default 4 simulated chips, 1 for cuda:N,
    /// one per GPU for cuda:all).
    #[arg(long, conflicts_with = "workers",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub local: Option<u32>,
    /// Run the `--local` chips inside this process (the same worker node,
    /// reached by calls instead of gRPC; buffers still passed by fd).
    #[arg(long, conflicts_with = "workers")]
    pub in_process: bool,
    /// Running workers to use instead, comma-separated (unix:PATH or tcp:HOST:PORT).
    #[arg(long)]
    pub workers: Option<String>,
    /// How to authenticate to running TCP workers.
    #[command(flatten)]
    pub auth: super::demo::RemoteAuth,
    /// The chip of each local worker: sim[:KEY=VALUE,...], cuda:N[,KEY=VALUE,...]
    /// (GPU N) or cuda:all (one worker per GPU, worker i on GPU i); see
    /// `strata worker --help` for the keys.
    #[arg(long, default_value = "sim")]
    pub device: String,
    /// Staged chips copy every view in and out for each task instead of
    /// keeping copies between tasks (for comparison).
    #[arg(long)]
    pub no_device_cache: bool,
    /// When bytes a task writes on a local staged chip go back to host
    /// memory: when the task ends (through), or when another task, a wait
    /// or an eviction needs them (deferred; a worker lost first loses
    /// them).
    #[arg(long, value_enum, default_value = "through")]
    pub write_back: WriteBackArg,
    /// Where tasks without a named worker go: dmdas (expected finish by
    /// performance models, critical path first; the default), dmda (the
    /// same in ready order) or least-loaded.
    #[arg(long, value_enum, default_value = "dmdas")]
    pub scheduler: SchedulerArg,
    /// Keep the performance models in this JSON file across runs (loaded
    /// at the start, written at the end; delete it to start over).
    #[arg(long)]
    pub perf_models: Option<PathBuf>,
    /// Write a Chrome trace-event JSON of the run (open it in Perfetto).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write outputs with relative paths under this folder instead of the
    /// graph file's.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// Run a task again on another worker, up to N times, when its worker
    /// is lost while it runs and a rerun is safe (no INOUT argument, no
    /// device buffer, not pinned to a worker).
    #[arg(long, default_value_t = 0)]
    pub retry: u32,
    /// Restart a local worker that is lost (crashed, killed, hung), up to N
    /// times each; it rejoins on the same socket.
    #[arg(long, default_value_t = 0)]
    pub respawn: u32,
    /// What happens to tasks that need bytes written by a task lost with a
    /// worker that cannot be fenced at once (a running worker reached by
    /// Unix socket that hangs): wait up to this many milliseconds for the
    /// fence (the worker seen dead, or back proving the task ended), then
    /// fail; 0 fails them at once.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub quarantine_wait_ms: u64,
    /// No progress bar, no summary: only errors.
    #[arg(long, short)]
    pub quiet: bool,
}

/// The local workers' callables: this binary's built-in kernels.
fn builtin_signature(name: &str) -> Result<Callable, String> {
    let registry = strata_chip_runtime::Registry::with_builtins();
    let (base, version) = match name.split_once('@') {
        Some((n, v)) => (
            n,
            Some(
                v.parse::<u32>()
                    .map_err(|_| format!("{name:?}: the version is not a number"))?,
            ),
        ),
        None => (name, None),
    };
    let mut found: Vec<_> = registry
        .descriptors()
        .filter(|d| d.name == base && version.is_none_or(|v| d.version == v))
        .collect();
    found.sort_by_key(|d| d.version);
    match found.last() {
        Some(d) => Ok(match registry.get(d.handle()) {
            Ok(k) => Callable::of_kernel(k),
            Err(_) => Callable::of(d),
        }),
        None => {
            let mut names: Vec<String> =
                registry.descriptors().map(|d| d.qualified_name()).collect();
            names.sort();
            Err(format!(
                "unknown callable {name:?}; the workers offer {}",
                names.join(", ")
            ))
        }
    }
}

/// Runs a graph file.
pub fn run(args: &RunArgs) -> ExitCode {
    let shown = args.graph.display().to_string();
    let graph = match Graph::load_with(&args.graph, args.out_dir.as_deref()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("strata run: {shown}: {e}");
            return ExitCode::from(2);
        }
    };
    let builder = match &args.workers {
        None => {
            let local = match super::local_workers(&args.device, args.local.map(|n| n as usize)) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("strata run: {e}");
                    return ExitCode::FAILURE;
                }
            };
            if let Err(e) = graph.check_callables(local, &builtin_signature) {
                eprintln!("strata run: {shown}: {e}");
                return ExitCode::from(2);
            }
            let b = Cluster::builder().device(&args.device);
            if args.in_process {
                b.in_process(local)
            } else {
                b.local(local)
            }
        }
        Some(list) => match super::demo::builder(list, false, &args.auth, &args.device) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("strata run: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let builder = builder
        .trace(args.trace.is_some())
        .device_cache(!args.no_device_cache)
        .write_back(args.write_back.into())
        .scheduler(args.scheduler.into())
        .retry(args.retry)
        .respawn(args.respawn)
        .quarantine(match args.quarantine_wait_ms {
            0 => strata_orchestrator::Quarantine::FailAtOnce,
            ms => strata_orchestrator::Quarantine::Wait(std::time::Duration::from_millis(ms)),
        });
    let builder = match &args.perf_models {
        Some(path) => builder.perf_models(path),
        None => builder,
    };
    let cluster = match builder.start() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("strata run: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.workers.is_some() {
        let lookup = |name: &str| -> Result<Callable, String> {
            let sig = cluster.callable_signature(name).map_err(|e| match e {
                Error::Submit(m) => m.to_string(),
                other => other.to_string(),
            })?;
            Ok(Callable::of(&sig))
        };
        if let Err(e) = graph.check_callables(cluster.workers().len(), &lookup) {
            eprintln!("strata run: {shown}: {e}");
            return ExitCode::from(2);
        }
    }
    let progress = super::progress::wanted(args.quiet);
    let started = std::time::Instant::now();
    let around = |job: &mut dyn FnMut() -> Result<RunSummary, Error>| {
        super::progress::around(&cluster, progress, job)
    };
    let result = graph.run(&cluster, &around);
    let wall = started.elapsed();
    let code = match &result {
        Ok(r) => {
            if !args.quiet {
                let s = &r.summary;
                say!(
                    "strata run: {shown}: {} tasks on {} workers in {:.1} ms ({:.0} tasks/s); {} edges inferred; {} bytes passed by fd, {} copied",
                    s.submitted,
                    cluster.workers().len(),
                    wall.as_secs_f64() * 1e3,
                    s.submitted as f64 / wall.as_secs_f64().max(1e-9),
                    s.edges,
                    s.fd_bytes,
                    s.sent_bytes + s.returned_bytes + s.staged_bytes
                );
                for line in super::transfer_lines(s)
                    .into_iter()
                    .chain(super::bounce_line(&cluster))
                {
                    say!("  {line}");
                }
                for o in &r.outputs {
                    say!("  wrote {}", o.display());
                }
            }
            for m in &r.mismatches {
                eprintln!("strata run: {shown}: {m}");
            }
            if r.mismatches.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(Error::Submit(m)) => {
            eprintln!("strata run: {shown}: {m}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("strata run: {shown}: {e}");
            ExitCode::FAILURE
        }
    };
    if let Some(path) = &args.trace {
        match cluster.take_trace() {
            Ok(Some(t)) => {
                if let Err(e) = t.write_chrome(path, cluster.workers()) {
                    eprintln!("strata run: {e}");
                    return ExitCode::FAILURE;
                }
            }
            Ok(None) => {}
            Err(e) => eprintln!("strata run: {e}"),
        }
    }
    code
}
