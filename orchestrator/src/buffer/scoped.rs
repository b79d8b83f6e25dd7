//! Handles of scope buffers ([`crate::ScopeGuard::alloc`]): the scope
//! holds the memory, the handle only names it.
//!
//! A driver handle of an ordinary buffer keeps its memory alive; a handle
//! of a scope buffer must not, or memory would be reclaimed only when the
//! program happens to drop its last handle (a Python variable outliving
//! the block, a view kept in a list). So the scope (the DAG actor's
//! record of it) holds the buffer, tasks hold it while they run, and the
//! handle holds a [`Lease`]: the buffer's descriptor, a weak reference
//! and the scope's [`ScopeLife`]. Every use of the handle — a submit, a
//! read, a write, handing out its address — first asks whether the scope
//! has ended, and refuses once it has, whether or not the memory is still
//! there: a use after the end is a mistake, and it fails the same way
//! every time rather than when a race is lost. The memory cannot be
//! recycled under a use that passed the check: the use holds the buffer
//! (as a task's argument, or through [`Scoped::pin`]) until it is done.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use strata_orchestrator_core::ScopeId;
use strata_wire::BufferDescriptor;

use super::HostShared;
use crate::error::BufferError;

/// A scope as the driver's handles see it: whether it has ended.
#[derive(Debug)]
pub(crate) struct ScopeLife {
    pub(crate) id: ScopeId,
    /// The scope it was opened in, if any.
    pub(crate) parent: Option<ScopeId>,
    ended: AtomicBool,
}

impl ScopeLife {
    pub(crate) fn new(id: ScopeId, parent: Option<ScopeId>) -> Self {
        ScopeLife {
            id,
            parent,
            ended: AtomicBool::new(false),
        }
    }

    /// Marks it ended: every handle of its buffers is refused from now on.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }
}

/// What a scope buffer's handle holds.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) desc: BufferDescriptor,
    host: Weak<HostShared>,
    pub(crate) scope: Arc<ScopeLife>,
}

impl Lease {
    pub(crate) fn new(host: &Arc<HostShared>, scope: Arc<ScopeLife>) -> Self {
        Lease {
            desc: *host.descriptor(),
            host: Arc::downgrade(host),
            scope,
        }
    }
}

/// A scope buffer's handle: its lease, and the memory itself once pinned.
#[derive(Debug, Clone)]
pub(crate) struct Scoped {
    pub(crate) lease: Arc<Lease>,
    /// Set on a pinned handle ([`crate::Buffer::pinned`]): it holds the
    /// memory, so an address taken from it stays good while it lives.
    pub(crate) pin: Option<Arc<HostShared>>,
}

impl Scoped {
    /// The memory, while the scope is open.
    ///
    /// # Errors
    /// [`BufferError::ScopeEnded`] once the scope has ended (or the
    /// cluster holding it has stopped).
    pub(crate) fn live(&self) -> Result<Arc<HostShared>, BufferError> {
        let ended = || BufferError::ScopeEnded {
            buffer: *self.lease.desc.identity(),
            scope: self.lease.scope.id.0,
        };
        if self.lease.scope.is_ended() {
            return Err(ended());
        }
        match &self.pin {
            Some(h) => Ok(Arc::clone(h)),
            None => self.lease.host.upgrade().ok_or_else(ended),
        }
    }

    /// A handle that holds the memory too.
    ///
    /// # Errors
    /// As [`Scoped::live`].
    pub(crate) fn pin(&self) -> Result<Scoped, BufferError> {
        Ok(Scoped {
            lease: Arc::clone(&self.lease),
            pin: Some(self.live()?),
        })
    }
}
