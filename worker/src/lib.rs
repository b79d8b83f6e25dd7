//! `strata-worker` will hold the worker node (DESIGN §5): the gRPC service a
//! worker serves to the orchestrator, the Unix-socket fd side channel, the
//! import registry that maps each buffer once by identity, and task
//! execution on the chip runtime. The `strata worker` subcommand and
//! user-built worker binaries will both be thin shells over it.
//!
//! Nothing is implemented yet; it arrives with the worker node (issue 4).
