//! `strata demo`: simulated chips running real multi-chip work end to
//! end, with a check of every result.

use super::{SchedulerArg, WriteBackArg};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use strata_orchestrator::demo::{JobReport, matmul_softmax_reduce};
use strata_orchestrator::{Cluster, ClusterBuilder};

/// Options of `strata demo`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:
  strata demo                                   # 4 local chips, 1024x1024 in 64x64 tiles (4,144 tasks)
  strata demo --workers 2 --size 512 --tile 32
  strata demo --in-process                      # 4 chips inside this process: no worker processes, no sockets
  strata demo --device cuda:all                 # one worker per GPU
  strata demo --trace run.json                  # then open run.json in https://ui.perfetto.dev
  strata demo --workers unix:/run/strata/chip0.sock,tcp:10.0.0.2:7420 --token-file token")]
pub struct DemoArgs {
    /// How many local workers to start (default 4 simulated chips, 1 for
    /// cuda:N, one per GPU for cuda:all), or a comma-separated list of
    /// running workers to use instead (unix:PATH or tcp:HOST:PORT).
    #[arg(long)]
    pub workers: Option<String>,
    /// Run the `--workers N` chips inside this process (the same worker
    /// node, reached by calls instead of gRPC; buffers still passed by fd).
    #[arg(long)]
    pub in_process: bool,
    /// How to authenticate to running TCP workers.
    #[command(flatten)]
    pub auth: RemoteAuth,
    /// Side of the square matrices.
    #[arg(long, default_value_t = 1024)]
    pub size: u32,
    /// Side of a tile (must divide --size).
    #[arg(long, default_value_t = 64)]
    pub tile: u32,
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
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Credentials for running TCP workers: a bearer token and/or TLS with a
/// client certificate.
#[derive(Debug, Clone, Default, Args)]
pub struct RemoteAuth {
    /// File holding the bearer token the TCP workers require.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) the workers' certificates chain to: speak TLS.
    #[arg(long, requires_all = ["tls_cert", "tls_key", "tls_domain"])]
    pub tls_ca: Option<PathBuf>,
    /// This driver's client certificate (PEM).
    #[arg(long, requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,
    /// This driver's private key (PEM).
    #[arg(long, requires = "tls_ca")]
    pub tls_key: Option<PathBuf>,
    /// The DNS name in the workers' certificates.
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
}

impl RemoteAuth {
    fn tls(&self) -> Result<Option<strata_orchestrator::ClientTls>, String> {
        let (Some(ca), Some(cert), Some(key), Some(domain)) = (
            &self.tls_ca,
            &self.tls_cert,
            &self.tls_key,
            &self.tls_domain,
        ) else {
            return Ok(None);
        };
        let read = |p: &PathBuf, what: &str| {
            std::fs::read(p).map_err(|e| format!("--{what} {}: {e}", p.display()))
        };
        Ok(Some(strata_orchestrator::ClientTls {
            ca_pem: read(ca, "tls-ca")?,
            cert_pem: read(cert, "tls-cert")?,
            key_pem: read(key, "tls-key")?,
            domain: domain.clone(),
        }))
    }
}

/// Where the workers come from, from `--workers` (and credentials):
/// `n` local workers (processes, or inside this one with `in_process`),
/// or running ones by address.
pub(crate) fn builder(
    workers: &str,
    in_process: bool,
    auth: &RemoteAuth,
    device: &str,
) -> Result<ClusterBuilder, String> {
    let token_file = auth.token_file.as_ref();
    let b = Cluster::builder().device(device);
    if let Ok(n) = workers.parse::<usize>() {
        if !(1..=64).contains(&n) {
            return Err(format!("--workers {n}: between 1 and 64 local workers"));
        }
        return Ok(if in_process {
            b.in_process(n)
        } else {
            b.local(n)
        });
    }
    if in_process {
        return Err(format!(
            "--in-process runs a number of chips in this process, not running workers ({workers})"
        ));
    }
    let token = match token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| format!("--token-file {}: {e}", p.display()))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let tls = auth.tls()?;
    let mut b = b;
    for addr in workers.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        b = match &tls {
            Some(t) if addr.starts_with("tcp:") => b.connect_tls(addr, token.as_deref(), t.clone()),
            _ => b.connect(addr, token.as_deref()),
        }
        .map_err(|e| format!("--workers: {e}"))?;
    }
    Ok(b)
}

/// Runs the demo; exit 0 when every result checks out, 1 when one does
/// not or the run failed, 2 for bad options.
pub fn run(args: &DemoArgs) -> ExitCode {
    if args.tile == 0 || args.size % args.tile != 0 {
        eprintln!(
            "strata demo: --tile {} does not divide --size {}",
            args.tile, args.size
        );
        return ExitCode::from(2);
    }
    let workers = match &args.workers {
        Some(w) => w.clone(),
        None => match super::local_workers(&args.device, None) {
            Ok(n) => n.to_string(),
            Err(e) => {
                eprintln!("strata demo: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let builder = match builder(&workers, args.in_process, &args.auth, &args.device) {
        Ok(b) => b
            .trace(args.trace.is_some())
            .device_cache(!args.no_device_cache)
            .write_back(args.write_back.into())
            .scheduler(args.scheduler.into()),
        Err(e) => {
            eprintln!("strata demo: {e}");
            return ExitCode::from(2);
        }
    };
    let builder = match &args.perf_models {
        Some(path) => builder.perf_models(path),
        None => builder,
    };
    let result = (|| -> Result<(JobReport, bool), strata_orchestrator::Error> {
        let cluster = builder.start()?;
        let w = cluster.workers();
        // Each distinct chip once, in worker order (cuda:all: one a GPU).
        let mut devices: Vec<&str> = Vec::new();
        for d in w.iter().map(|w| w.device.as_str()) {
            if !devices.contains(&d) {
                devices.push(d);
            }
        }
        say!(
            "strata demo: {} worker{} ({}), C = A·B for {n}x{n} F32 in {t}x{t} tiles, then row softmax and row sums",
            w.len(),
            if w.len() == 1 { "" } else { "s" },
            if devices.is_empty() {
                "?".to_owned()
            } else {
                devices.join("; ")
            },
            n = args.size,
            t = args.tile,
        );
        let report =
            super::progress::around(&cluster, super::progress::wanted(args.quiet), || {
                matmul_softmax_reduce(&cluster, args.size, args.tile, 42)
            })?;
        let ok = report.ok(1e-3);
        let s = &report.summary;
        let secs = report.wall.as_secs_f64();
        say!(
            "  tasks {:>8}   workers {}   wall {:.1} ms   {:.0} tasks/s",
            report.tasks,
            w.len(),
            secs * 1e3,
            report.tasks as f64 / secs.max(1e-9)
        );
        say!(
            "  bytes passed by fd {:>12}   bytes copied {:>12} (sent {}, returned {}, staged on devices {})",
            s.fd_bytes,
            s.sent_bytes + s.returned_bytes + s.staged_bytes,
            s.sent_bytes,
            s.returned_bytes,
            s.staged_bytes
        );
        for line in super::transfer_lines(s)
            .into_iter()
            .chain(super::bounce_line(&cluster))
        {
            say!("  {line}");
        }
        say!(
            "  dependency edges inferred {}   max |error| vs reference {:.2e}",
            s.edges,
            report.max_abs_err
        );
        if let Some(path) = &args.trace {
            if let Some(trace) = cluster.take_trace()? {
                trace.write_chrome(path, cluster.workers())?;
                say!(
                    "  trace: {} ({} tasks; open in https://ui.perfetto.dev)",
                    path.display(),
                    trace.tasks.len()
                );
            }
        }
        cluster.shutdown()?;
        Ok((report, ok))
    })();
    match result {
        Ok((_, true)) => {
            say!("result check: passed");
            ExitCode::SUCCESS
        }
        Ok((_, false)) => {
            say!("result check: FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("strata demo: {e}");
            ExitCode::FAILURE
        }
    }
}
