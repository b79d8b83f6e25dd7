//! Cross-process tests: the real `strata` binary (and `strata-test-worker`,
//! a user-style worker binary) on private sockets.

mod access;
mod alloc;
mod bulk;
mod caps;
mod chips;
mod cluster;
mod faults;
mod fence;
mod graphs;
mod leaks;
mod orphans;
mod partial;
mod posix;
mod quarantine;
mod ring;
mod seals;
mod sessions;
mod shared;
mod timeout;
mod worker;
