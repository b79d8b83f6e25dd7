//! Oracles and generators for testing the wire format, shared by the unit
//! tests, the property tests, the benchmarks and the fuzz targets.
//!
//! - [`byte_set`] / [`overlap_by_bytes`]: the brute-force overlap oracle.
//! - [`ViewClass`] / [`view_pair`]: random view pairs by class, from a seed.
//! - [`reference_tensor_valid`]: an independent, deliberately plain reading
//!   of the rules of docs/wire-format.md §3 and §4, to cross-check the real validator.
//! - [`check_tensor_bytes`], [`check_task_args_bytes`], [`check_overlap_seed`]:
//!   the fuzz oracles. They panic when an invariant is broken; that is their
//!   job (a fuzzer reports the panic as a crash).
//! - [`HOSTILE_WORDS`] / [`hostile_variants`]: boundary values for every
//!   4-byte word of a record.

// Test support: panics are how an oracle reports, and casts of small
// generator values are in range by construction.
#![allow(
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod fuzz;
mod oracle;
mod views;

pub use fuzz::{
    HOSTILE_WORDS, check_descriptor_bytes, check_overlap_seed, check_task_args_bytes,
    check_tensor_bytes, hostile_variants, reference_descriptor_valid, reference_tensor_valid,
};
pub use oracle::{ORACLE_MAX_ELEMENTS, byte_set, check_answer, overlap_by_bytes};
pub use views::{Rng, ViewClass, random_factorization, row_major_strides, test_buffer, view_pair};
