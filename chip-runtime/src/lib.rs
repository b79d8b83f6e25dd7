//! `strata-chip` (package `strata-chip-runtime`) will hold the chip runtime
//! (DESIGN §6): the `Device` trait, the default simulated chip with its own
//! device-memory arena (persistent, per-run and scratch regions), the
//! materialization of wire tensors into `ChipTensor`s, and the built-in
//! kernels.
//!
//! Nothing is implemented yet; it arrives with the chip runtime (issue 3).
//! The crate has no tokio dependency, so that its shared-memory structures
//! can be model-checked with loom.
