//! Typed ids of the cores. A task's id and a callable's handle cross
//! process boundaries and are the wire format's ([`strata_wire::TaskId`],
//! [`strata_wire::KernelHandle`]): one type for each, from the protocol up.

use std::fmt;

pub use strata_wire::{KernelHandle, TaskId};

/// A worker endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u32);

/// A scope bounding the lifetime of intermediate buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId(pub u64);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {}", self.0)
    }
}
