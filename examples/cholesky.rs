//! A tiled Cholesky factorization over local simulated chips with the
//! built-in `potrf`, `trsm`, `syrk` and `gemm` kernels, checked by a
//! matrix-vector residual.
//!
//! `cargo run --release -p strata-examples --example cholesky [-- N TILE WORKERS f32|f64 RUNS host|device]`
//! (defaults 2048 256 2 f32 3 host: the first run maps the matrix into the
//! workers and calibrates the performance models; each run is printed).
//! `device` keeps the matrix in a device buffer of worker 0's chip, as a
//! GPU library keeps it in GPU memory: loaded before each run and read
//! back after it, outside the timed part, every task on that worker (so
//! it takes one worker). `host` keeps it in a host buffer whose tiles
//! go to the chips and back inside the run. With `STRATA_TRACE=FILE` set, writes the
//! run's trace there (Chrome trace-event JSON, for Perfetto); with
//! `STRATA_DEVICE=SPEC`, the workers' chips are `SPEC` (such as
//! `sim:mode=unified`) instead of the default `sim`; with
//! `STRATA_SCHEDULER=least-loaded|dmda|dmdas`, tasks are placed by that
//! policy (default dmdas). Needs the `strata` binary built
//! (`cargo build --release`), or `STRATA_BIN` pointing at one.

use std::process::ExitCode;

use strata_orchestrator::Cluster;
use strata_orchestrator::WorkerId;
use strata_orchestrator::demo::{JobReport, MatrixHome, cholesky_runs_in};

/// The driver allocates per task from several threads, as the `strata`
/// binary's and the Python package's do: the same allocator here, so the
/// figures are the ones those drivers get (glibc's malloc was a quarter of
/// this driver's instructions per task).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: u32| {
        args.get(i).map_or(default, |a| {
            a.parse()
                .unwrap_or_else(|_| panic!("{a:?} is not a number"))
        })
    };
    let (n, tile, workers) = (num(0, 2048), num(1, 256), num(2, 2) as usize);
    let dtype = args.get(3).map_or("f32", String::as_str).to_owned();
    let runs = num(4, 3).max(1) as usize;
    let home = match args.get(5).map_or("host", String::as_str) {
        "host" => MatrixHome::Host,
        "device" if workers == 1 => MatrixHome::Device(WorkerId(0)),
        "device" => {
            eprintln!(
                "cholesky: a device matrix lives on worker 0's chip and every task runs there: ask for 1 worker, not {workers}"
            );
            return ExitCode::FAILURE;
        }
        other => {
            eprintln!("cholesky: {other:?} is not host or device");
            return ExitCode::FAILURE;
        }
    };
    let run = || -> Result<Vec<JobReport>, strata_orchestrator::Error> {
        let trace = std::env::var_os("STRATA_TRACE");
        let mut builder = Cluster::builder().local(workers).trace(trace.is_some());
        if let Ok(spec) = std::env::var("STRATA_DEVICE") {
            builder = builder.device(spec);
        }
        if let Ok(name) = std::env::var("STRATA_SCHEDULER") {
            match strata_orchestrator::SchedulerPolicy::from_name(&name) {
                Ok(p) => builder = builder.scheduler(p),
                Err(e) => {
                    eprintln!("cholesky: STRATA_SCHEDULER: {e}");
                    std::process::exit(2);
                }
            }
        }
        let cluster = builder.start()?;
        let report = match dtype.as_str() {
            "f64" => cholesky_runs_in::<f64>(&cluster, n, tile, runs, home)?,
            _ => cholesky_runs_in::<f32>(&cluster, n, tile, runs, home)?,
        };
        if let Some(path) = trace {
            if let Some(t) = cluster.take_trace()? {
                t.write_chrome(path, cluster.workers())?;
            }
        }
        cluster.shutdown()?;
        Ok(report)
    };
    if !matches!(dtype.as_str(), "f32" | "f64") {
        eprintln!("cholesky: dtype {dtype:?} is not f32 or f64");
        return ExitCode::FAILURE;
    }
    let where_ = if home == MatrixHome::Host {
        "host memory"
    } else {
        "device memory"
    };
    match run() {
        Ok(reports) => {
            let tol = if dtype == "f64" { 1e-12 } else { 1e-5 };
            let mut ok = true;
            for (i, r) in reports.iter().enumerate() {
                ok &= r.ok(tol);
                let gflops = f64::from(n).powi(3) / 3.0 / r.wall.as_secs_f64() / 1e9;
                println!(
                    "cholesky {n}x{n} {dtype} in {tile}x{tile} tiles over {workers} workers, matrix in {where_}, run {}: {} tasks, {:.1} ms, {gflops:.1} GFlop/s, {} B host->device, {} B device->host, {} B copied on chip, residual {:.2e}: {}",
                    i + 1,
                    r.tasks,
                    r.wall.as_secs_f64() * 1e3,
                    r.summary.to_device_bytes,
                    r.summary.from_device_bytes,
                    r.summary.on_chip_bytes,
                    r.max_abs_err,
                    if r.ok(tol) { "OK" } else { "WRONG" }
                );
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("cholesky: {e}");
            ExitCode::FAILURE
        }
    }
}
