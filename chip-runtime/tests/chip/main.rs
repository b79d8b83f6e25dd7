//! Integration tests of `strata-chip`: built-in kernels (and the tiled
//! factorization kernels) against naive references on strided views in both modes, staging that touches only the
//! written views' bytes, the arena under random allocation sequences, and
//! failure behaviour.

mod arena;
mod cache;
mod common;
mod complex;
mod cuda;
mod cuda_host;
mod dense;
mod failures;
mod isolation;
mod kernels;
mod nvrtc;
mod staging;
mod timing;
