//! The `strata` command: parses arguments and hands them to the library.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    strata_orchestrator::cli::run(strata_orchestrator::cli::Cli::parse())
}
