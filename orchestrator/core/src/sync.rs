//! std normally, loom under `--cfg loom`: the shared structures of this
//! crate take their primitives from here.

#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex};

#[cfg(all(loom, test))]
pub(crate) use loom::sync::Arc;
