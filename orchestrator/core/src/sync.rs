//! std normally, loom under `--cfg loom`: the shared structures of this
//! crate take their primitives from here.

#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

#[cfg(all(loom, test))]
pub(crate) use loom::sync::Arc;
