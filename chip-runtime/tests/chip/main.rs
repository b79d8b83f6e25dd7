//! Integration tests of `strata-chip`: built-in kernels (and the tiled
//! factorization kernels) against naive references on strided views in both modes, staging that touches only the
//! written views' bytes, the arena under random allocation sequences, and
//! failure behaviour.
//!
//! The tests written against `&dyn Device` are a conformance suite: they
//! run on every chip of a list (the simulated chips, and `cuda:0` where a
//! GPU is there), with the same expected results; `conformance.rs` holds
//! the list, `STRATA_CHIPS` and `STRATA_REQUIRE_CUDA`, and says which
//! tests stay on simulated chips.

mod arena;
mod cache;
mod common;
mod complex;
mod conformance;
mod cuda;
mod cuda_host;
mod dense;
mod failures;
mod isolation;
mod kernels;
mod nvrtc;
mod shared;
mod staging;
mod timing;
