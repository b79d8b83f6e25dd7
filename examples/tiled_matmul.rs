//! A tiled F32 matmul over local simulated chips, checked against a
//! single-threaded reference.
//!
//! `cargo run --release -p strata-examples --example tiled_matmul [-- N TILE WORKERS]`
//! (defaults 512 64 4). Needs the `strata` binary built
//! (`cargo build --release`), or `STRATA_BIN` pointing at one.

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
    let n = args.first().copied().unwrap_or(512);
    let tile = args.get(1).copied().unwrap_or(64);
    let workers = args.get(2).copied().unwrap_or(4) as usize;
    let run = || -> Result<_, strata_orchestrator::Error> {
        let cluster = Cluster::builder().local(workers).start()?;
        let report = strata_orchestrator::demo::tiled_matmul(&cluster, n, tile, 42)?;
        cluster.shutdown()?;
        Ok(report)
    };
    match run() {
        Ok(r) => {
            let ok = r.ok(1e-3);
            println!(
                "tiled matmul {n}x{n} in {tile}x{tile} tiles over {workers} workers: {} tasks, {} edges, {:.1} ms, max |err| {:.2e}: {}",
                r.tasks,
                r.summary.edges,
                r.wall.as_secs_f64() * 1e3,
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
            eprintln!("tiled_matmul: {e}");
            ExitCode::FAILURE
        }
    }
}
