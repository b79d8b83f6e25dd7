//! The actors over in-process workers, without spawning a process: each
//! test runs in well under a second.

mod actors;
mod alloc;
mod bodies;
mod caps;
mod errors;
mod grants;
mod posix;
mod priority;
