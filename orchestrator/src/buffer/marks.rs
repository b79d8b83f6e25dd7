//! The quarantine marks of one buffer: views written by tasks lost without
//! a fence, refused to the driver until each loss is fenced
//! (docs/reliability.md, quarantine). A host buffer keeps them for its
//! views and byte reads; a shared device buffer shares them with every
//! mapping of it taken in this process, which outlive the buffer.
//!
//! Empty but for the rare loss: the DAG actor marks and lifts, driver
//! threads check, and a check costs one atomic load while nothing is
//! marked.

use std::sync::atomic::{AtomicBool, Ordering};

use strata_orchestrator_core::{TaskId, WorkerId};
use strata_wire::{CanonicalIdentity, Tensor};

use crate::error::QuarantinedBytes;

/// A task lost without a fence, as the quarantine of its views names it.
#[derive(Debug, Clone)]
pub(crate) struct Loss {
    pub(crate) task: TaskId,
    /// Its callable, `name@version`.
    pub(crate) callable: String,
    pub(crate) worker: WorkerId,
    /// The worker's address, when known.
    pub(crate) address: Option<String>,
}

/// A view quarantined by a lost task.
#[derive(Debug)]
struct Mark {
    view: Tensor,
    loss: Loss,
}

/// The marks of one buffer.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    list: std::sync::Mutex<Vec<Mark>>,
    /// Whether `list` holds any mark, so that the driver's checks (every
    /// `numpy()` of the Python binding among them) cost one load when
    /// nothing is quarantined. Written under the lock; a check that races
    /// a new mark may pass, as one just before the loss would.
    any: AtomicBool,
}

impl Marks {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Mark>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Quarantines `view`: the lost task writes it.
    pub(crate) fn mark(&self, view: Tensor, loss: Loss) {
        let mut list = self.list();
        list.push(Mark { view, loss });
        self.any.store(true, Ordering::Release);
    }

    /// Lifts what `task` quarantined: it can no longer write.
    pub(crate) fn lift(&self, task: TaskId) {
        let mut list = self.list();
        list.retain(|m| m.loss.task != task);
        self.any.store(!list.is_empty(), Ordering::Release);
    }

    /// Whether no byte is quarantined (no lock taken).
    pub(crate) fn none(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }

    /// Refuses an access to `view`'s bytes of `buffer` while any of them
    /// is quarantined.
    pub(crate) fn check_view(
        &self,
        buffer: &CanonicalIdentity,
        view: &Tensor,
    ) -> Result<(), QuarantinedBytes> {
        if self.none() {
            return Ok(());
        }
        let list = self.list();
        match list
            .iter()
            .find(|m| strata_wire::overlap(&m.view, view) != strata_wire::Overlap::Disjoint)
        {
            None => Ok(()),
            Some(m) => Err(m.named(buffer)),
        }
    }

    /// As [`Marks::check_view`], for `len` bytes at `offset`.
    pub(crate) fn check_range(
        &self,
        buffer: &CanonicalIdentity,
        offset: u64,
        len: u64,
    ) -> Result<(), QuarantinedBytes> {
        if self.none() {
            return Ok(());
        }
        let end = offset.saturating_add(len);
        let list = self.list();
        match list.iter().find(|m| {
            let start = m.view.byte_offset();
            start < end && offset < start.saturating_add(m.view.extent_bytes())
        }) {
            None => Ok(()),
            Some(m) => Err(m.named(buffer)),
        }
    }
}

impl Mark {
    fn named(&self, buffer: &CanonicalIdentity) -> QuarantinedBytes {
        let start = self.view.byte_offset();
        QuarantinedBytes {
            buffer: *buffer,
            bytes: start..start.saturating_add(self.view.extent_bytes()),
            task: self.loss.task,
            callable: self.loss.callable.clone(),
            worker: self.loss.worker,
            address: self.loss.address.clone(),
        }
    }
}
