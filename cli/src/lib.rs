//! `strata-cli`: the `strata` command-line tool, and the graph-file format
//! it runs.
//!
//! The binary (`src/main.rs`) parses arguments and hands them to
//! [`cmd::run()`]: `strata demo` (the main job on local simulated chips),
//! `strata run GRAPH` (a job from a JSON graph file, [`graph`]), `strata
//! inspect FILE` (decode a TaskArgs blob) and `strata worker` (serve one
//! chip). The driver library itself is `strata-orchestrator`; this crate
//! is what sits on top of it for people at a shell, so the library carries
//! neither clap nor the worker's server.

#![forbid(unsafe_code)]

pub mod cmd;
/// The graph-file format, from its own crate (the Python package runs
/// graph files too).
pub use strata_graph as graph;
