//! The one place this crate takes its synchronization primitives from: std
//! normally, loom's model-checked versions under `--cfg loom`. Code that
//! shares memory between threads imports from here, never from `std::sync`
//! directly, so that every such structure can be model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
