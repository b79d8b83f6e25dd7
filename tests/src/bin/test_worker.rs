//! A worker binary built the way users build theirs: the built-in kernels
//! plus their own (`strata_tests::kernels`), served by
//! `strata_worker::cli::run`. Like `strata`, it takes an optional `worker`
//! subcommand first, so a `Cluster` can spawn it.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use strata_chip_runtime::Device;
use strata_tests::losing::Losing;
use strata_tests::runs_only::RunsOnly;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    worker: strata_worker::cli::WorkerArgs,
    /// Milliseconds every `test.hash.*` kernel sleeps between reading and
    /// writing (so a stopped worker writes late).
    #[arg(long, default_value_t = 0)]
    hash_delay_ms: u64,
    /// Comma-separated kernel names: the chip runs only these
    /// (`strata_tests::runs_only`), and the worker names the others as
    /// having no body.
    #[arg(long)]
    runs_only: Option<String>,
    /// A kernel name: launching it loses the chip, as a fault loses a
    /// GPU's context (`strata_tests::losing`).
    #[arg(long)]
    lose_on: Option<String>,
}

fn main() -> ExitCode {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "worker") {
        argv.remove(1);
    }
    let args = Args::parse_from(argv);
    match strata_tests::kernels::registry_with_hash_delay(std::time::Duration::from_millis(
        args.hash_delay_ms,
    )) {
        Ok(kernels) => match (args.runs_only, args.lose_on) {
            (None, None) => strata_worker::cli::run(args.worker, kernels),
            (runs_only, lose_on) => strata_worker::cli::run_with(args.worker, kernels, |spec| {
                let mut chip = strata_chip_runtime::open(spec)?;
                if let Some(names) = &runs_only {
                    chip = Arc::new(RunsOnly::new(chip, names));
                }
                if let Some(kernel) = &lose_on {
                    chip = Arc::new(Losing::new(chip, kernel));
                }
                Ok(chip as Arc<dyn Device>)
            }),
        },
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
