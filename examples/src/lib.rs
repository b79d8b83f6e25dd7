//! Examples of using strata. Run one with
//! `cargo run -p strata-examples --example <name>`.
//!
//! - `task_args`: builds the TaskArgs blob of a tiled matmul step with the
//!   `strata-wire` API and writes it where `strata inspect` can read it.

#![forbid(unsafe_code)]
