//! `strata-tests` will hold strata's cross-process tests: end-to-end runs
//! of the real `strata` binary (workers, driver, fault injection) on
//! temporary socket paths and port 0.
//!
//! There are no cross-process parts yet; the first arrive with the worker
//! node (issue 4). The CLI's own tests live with the CLI in
//! `strata-orchestrator`'s integration tests.

#![forbid(unsafe_code)]
