//! A two-stage pipeline with device buffers: each worker squares its
//! block of rows and takes a row softmax, keeping the intermediates in
//! its device memory; checked against a host reference.
//!
//! `cargo run --release -p strata-examples --example pipeline [-- ROWS COLS WORKERS]`
//! (defaults 1024 256 4).

use std::process::ExitCode;

use strata_orchestrator::Cluster;

fn main() -> ExitCode {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .unwrap_or_else(|_| panic!("{a:?} is not a number"))
        })
        .collect();
    let rows = args.first().copied().unwrap_or(1024);
    let cols = args.get(1).copied().unwrap_or(256);
    let workers = args.get(2).copied().unwrap_or(4) as usize;
    let run = || -> Result<_, strata_orchestrator::Error> {
        let cluster = Cluster::builder().local(workers).start()?;
        let report = strata_orchestrator::demo::pipeline(&cluster, rows, cols, 7)?;
        cluster.shutdown()?;
        Ok(report)
    };
    match run() {
        Ok(r) => {
            let ok = r.ok(1e-5);
            println!(
                "pipeline {rows}x{cols} over {workers} workers: {} tasks, {:.1} ms, {} bytes staged on devices, max |err| {:.2e}: {}",
                r.tasks,
                r.wall.as_secs_f64() * 1e3,
                r.summary.staged_bytes,
                r.max_abs_err,
                if ok { "OK" } else { "WRONG" }
            );
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("pipeline: {e}");
            ExitCode::FAILURE
        }
    }
}
