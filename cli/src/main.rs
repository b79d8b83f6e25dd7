//! The `strata` command: parses arguments and hands them to the library.

use clap::Parser;
use std::process::ExitCode;

/// Drivers and workers allocate per task from several threads; mimalloc
/// keeps that off the profile (glibc's malloc was its largest entry).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    strata_cli::cmd::run(strata_cli::cmd::Cli::parse())
}
