//! `strata-proto` will hold the gRPC service between the orchestrator and a
//! worker (DESIGN §5): the `.proto` files, the code generated from them in
//! `build.rs` by a pure-Rust protobuf compiler, and the checked conversions
//! between prost types and the domain types of `strata-wire`.
//!
//! Nothing is implemented yet; it arrives with the worker node (issue 4).
//! The crate exists now so the workspace has its final shape.

#![forbid(unsafe_code)]
