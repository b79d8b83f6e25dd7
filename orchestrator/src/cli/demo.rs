//! `strata demo`: local simulated chips running real multi-chip work end
//! to end, with a check of every result.

use std::process::ExitCode;

use clap::Args;

use crate::Cluster;
use crate::demo::{JobReport, pipeline, tiled_matmul};

/// Options of `strata demo`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:
  strata demo
  strata demo --workers 2 --size 1024 --tile 128
  strata demo --device sim:mode=unified")]
pub struct DemoArgs {
    /// Local workers (simulated chips) to start.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Side of the square matrices of the tiled matmul.
    #[arg(long, default_value_t = 512)]
    pub size: u32,
    /// Side of a tile (must divide --size).
    #[arg(long, default_value_t = 64)]
    pub tile: u32,
    /// Device spec of every worker.
    #[arg(long, default_value = "sim")]
    pub device: String,
}

fn line(name: &str, r: &JobReport, ok: bool) {
    let secs = r.wall.as_secs_f64();
    println!(
        "  {name:<28} {:>6} tasks {:>9.1} ms {:>10.0} tasks/s   max |err| {:.1e}  {}",
        r.tasks,
        secs * 1e3,
        r.tasks as f64 / secs.max(1e-9),
        r.max_abs_err,
        if ok { "ok" } else { "WRONG" }
    );
}

/// Runs the demo; exit 0 when every result checks out.
pub fn run(args: &DemoArgs) -> ExitCode {
    if args.tile == 0 || args.size % args.tile != 0 {
        eprintln!(
            "strata demo: --tile {} does not divide --size {}",
            args.tile, args.size
        );
        return ExitCode::from(2);
    }
    let result = (|| -> Result<bool, crate::Error> {
        let cluster = Cluster::builder()
            .local(args.workers as usize)
            .device(&args.device)
            .start()?;
        println!(
            "strata demo: {} local workers ({})",
            cluster.workers().len(),
            cluster
                .workers()
                .first()
                .map(|w| w.device.as_str())
                .unwrap_or("?")
        );
        let mm = tiled_matmul(&cluster, args.size, args.tile, 42)?;
        let mm_ok = mm.ok(1e-3);
        line(
            &format!("matmul {0}x{0} / {1}x{1} tiles", args.size, args.tile),
            &mm,
            mm_ok,
        );
        let rows = args.size.max(args.workers);
        let pl = pipeline(&cluster, rows, 256, 7)?;
        let pl_ok = pl.ok(1e-5);
        line(&format!("pipeline {rows}x256 (device)"), &pl, pl_ok);
        let t = cluster.totals()?;
        println!(
            "  buffers passed by fd: {} bytes; bytes copied over the wire: {}; staged on devices: {}; dependency edges: {}",
            t.fd_bytes,
            t.sent_bytes + t.returned_bytes,
            t.staged_bytes,
            t.edges
        );
        cluster.shutdown()?;
        Ok(mm_ok && pl_ok)
    })();
    match result {
        Ok(true) => {
            println!("result check: passed");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("result check: FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("strata demo: {e}");
            ExitCode::FAILURE
        }
    }
}
