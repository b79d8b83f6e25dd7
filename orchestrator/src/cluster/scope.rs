//! Scopes and runtime-managed buffers: [`Cluster::alloc`], the scope
//! calls, and [`ScopeGuard`], a scope that ends when it is dropped.
//!
//! A scope holds buffers until it has ended and no unfinished task uses
//! them (the DAG's scope records decide when: `Dag::end_scope`). The
//! driver keeps its own record of the open scopes beside the DAG's: which
//! scope each was opened in, so that ending a scope ends the scopes
//! opened in it first, and each one's [`ScopeLife`], so that the handles
//! of its buffers are refused from the moment it ends.

use std::sync::Arc;

use strata_orchestrator_core::{ScopeError, ScopeId};
use strata_wire::{Access, DType};

use super::Cluster;
use crate::actors::Cmd;
use crate::buffer::{Buffer, HostShared, Lease, PoolStats, ScopeLife};
use crate::error::{BufferError, Error, SubmitError};
use crate::{Scope, View};

/// The bytes of a row-major `shape` of `dtype`.
///
/// # Errors
/// [`BufferError::Shape`]: no axes or too many, an empty axis, or more
/// bytes than a `u64` counts.
fn nbytes_of(shape: &[u32], dtype: DType) -> Result<u64, BufferError> {
    let bad = |why: String| BufferError::Shape {
        shape: shape.to_vec(),
        dtype,
        why,
    };
    if shape.is_empty() || shape.len() > strata_wire::MAX_DIMS {
        return Err(bad(format!(
            "{} axes; a view has 1 to {}",
            shape.len(),
            strata_wire::MAX_DIMS
        )));
    }
    if let Some(axis) = shape.iter().position(|&d| d == 0) {
        return Err(bad(format!(
            "axis {axis} is 0: every axis needs at least one element"
        )));
    }
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(u64::from(d)))
        .and_then(|n| dtype.bytes_for(n))
        .ok_or_else(|| bad("its size in bytes overflows 64 bits".into()))
}

impl Cluster {
    /// A zeroed host buffer from the cluster's pool, as a row-major view
    /// of `shape` and `dtype`: memory the runtime recycles. It is owned
    /// like any buffer (by its handles and the tasks that use it) and,
    /// once they have all let go and the workers have released it, goes
    /// back to the pool zeroed, to be handed out again under a new
    /// identity. Its buffer may be larger than the view (the pool's size
    /// classes are powers of two, at least a page). For temporaries
    /// reclaimed without dropping handles, allocate in a scope
    /// ([`Cluster::scope`], [`ScopeGuard::alloc`]).
    ///
    /// # Errors
    /// [`BufferError::Shape`] for a shape with no or too many axes, an
    /// empty axis, or a size past 64 bits; the memfd cannot be made.
    pub fn alloc(&self, shape: &[u32], dtype: DType) -> Result<View, Error> {
        let host = self.take_pooled(shape, dtype)?;
        Buffer::owning(crate::buffer::Backing::Host(host)).tensor(shape, dtype)
    }

    /// A host buffer from the pool (not yet anyone's but the caller's).
    fn take_pooled(&self, shape: &[u32], dtype: DType) -> Result<Arc<HostShared>, Error> {
        let nbytes = nbytes_of(shape, dtype)?;
        let taken = self.pool.take(nbytes, &self.mint)?;
        Ok(Arc::new(HostShared::over(
            taken.identity,
            taken.mem,
            Access::ReadWrite,
            Some(Arc::clone(&self.pool)),
            self.released.clone(),
        )?))
    }

    /// The pool's figures: pooled buffers out and idle, memfds made,
    /// reused and discarded.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Opens a scope, ended when the guard is dropped (or by
    /// [`ScopeGuard::end`]).
    ///
    /// ```no_run
    /// # use strata_orchestrator::{Cluster, Task};
    /// # use strata_wire::DType;
    /// # fn main() -> Result<(), strata_orchestrator::Error> {
    /// let cluster = Cluster::builder().local(2).start()?;
    /// let x = cluster.alloc(&[64, 64], DType::F32)?;
    /// for _ in 0..1000 {
    ///     let s = cluster.scope()?;
    ///     let t = s.alloc(&[64, 64], DType::F32)?;
    ///     cluster.submit(Task::new("copy").input(&x).output(&t))?;
    ///     cluster.submit(Task::new("axpy").input(&t).inout(&x).scalar_f64(0.5))?;
    /// } // each scope ends here: `t` is reclaimed once its tasks are done
    /// cluster.wait_all()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Closed`].
    pub fn scope(&self) -> Result<ScopeGuard<'_>, Error> {
        Ok(ScopeGuard {
            cluster: self,
            scope: self.open_scope()?,
            ended: false,
        })
    }

    /// Opens a scope.
    ///
    /// # Errors
    /// [`Error::Closed`].
    pub fn open_scope(&self) -> Result<Scope, Error> {
        self.open(None)
    }

    /// Opens a scope inside `parent`: ending `parent` ends it too (first),
    /// and ending it reclaims its own buffers only.
    ///
    /// # Errors
    /// [`SubmitError::Scope`] when `parent` has ended or is unknown.
    pub fn open_scope_in(&self, parent: Scope) -> Result<Scope, Error> {
        self.open(Some(parent.0))
    }

    fn open(&self, parent: Option<ScopeId>) -> Result<Scope, Error> {
        let mut open = self.open_scopes();
        if let Some(p) = parent {
            if !open.contains_key(&p) {
                drop(open);
                return Err(SubmitError::Scope(self.not_open(p)).into());
            }
        }
        // Opened under the lock, so that an inner scope is never opened
        // in one another thread is ending.
        let id = self.ask(|reply| Cmd::OpenScope { reply })?;
        self.last_scope
            .fetch_max(id.0, std::sync::atomic::Ordering::AcqRel);
        open.insert(id, Arc::new(ScopeLife::new(id, parent)));
        Ok(Scope(id))
    }

    fn open_scopes(
        &self,
    ) -> std::sync::MutexGuard<'_, rustc_hash::FxHashMap<ScopeId, Arc<ScopeLife>>> {
        self.scopes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why `scope`, not open here, cannot take anything: a scope opened
    /// here has ended; any other was never opened.
    fn not_open(&self, scope: ScopeId) -> ScopeError {
        let last = self.last_scope.load(std::sync::atomic::Ordering::Acquire);
        if scope.0 >= 1 && scope.0 <= last {
            ScopeError::Ended(scope)
        } else {
            ScopeError::Unknown(scope)
        }
    }

    /// Whether `scope` is open (not ended, itself or by the scope it was
    /// opened in).
    pub fn scope_is_open(&self, scope: Scope) -> bool {
        self.open_scopes().contains_key(&scope.0)
    }

    /// A zeroed host buffer from the pool, held by `scope` (as
    /// [`ScopeGuard::alloc`]).
    ///
    /// # Errors
    /// [`BufferError::AllocScope`] when `scope` has ended or is unknown;
    /// as [`Cluster::alloc`].
    pub fn alloc_in(&self, scope: Scope, shape: &[u32], dtype: DType) -> Result<View, Error> {
        let life = self
            .open_scopes()
            .get(&scope.0)
            .cloned()
            .ok_or_else(|| BufferError::AllocScope(self.not_open(scope.0)))?;
        let host = self.take_pooled(shape, dtype)?;
        let lease = Lease::new(&host, life);
        // The scope takes the buffer, with no answer awaited: the scope
        // was open a moment ago, and one ended meanwhile refuses the
        // buffer (back to the pool it goes) while its end refuses this
        // handle too. Commands from one thread reach the DAG actor in
        // order, so the scope holds the buffer before any task of it.
        self.tell(Cmd::ScopeBuffer {
            scope: scope.0,
            buffer: Buffer::owning(crate::buffer::Backing::Host(host)),
            reply: None,
        })?;
        Buffer::scoped(lease).tensor(shape, dtype)
    }

    /// Registers `buffer` in `scope`: the scope holds it until the scope
    /// has ended and no unfinished task uses it.
    ///
    /// # Errors
    /// An unknown or ended scope, or another scope holding the buffer.
    pub fn scope_buffer(&self, scope: Scope, buffer: &Buffer) -> Result<(), Error> {
        let buffer = Buffer::owning(buffer.backing()?);
        self.ask(|reply| Cmd::ScopeBuffer {
            scope: scope.0,
            buffer,
            reply: Some(reply),
        })?
    }

    /// Ends `scope`, after the scopes opened in it that are still open
    /// (innermost first). Its buffers are reclaimed once no unfinished
    /// task uses them; from now on the handles of buffers allocated in it
    /// are refused.
    ///
    /// # Errors
    /// An unknown or ended scope.
    pub fn end_scope(&self, scope: Scope) -> Result<(), Error> {
        let ending = {
            let mut open = self.open_scopes();
            let inside: Vec<ScopeId> = open
                .keys()
                .copied()
                .filter(|&s| within(&open, s, scope.0))
                .collect();
            let mut ending: Vec<Arc<ScopeLife>> =
                inside.iter().filter_map(|s| open.remove(s)).collect();
            for l in &ending {
                l.end();
            }
            // Inner scopes were opened after their parents: highest first.
            ending.sort_by_key(|l| std::cmp::Reverse(l.id.0));
            ending
        };
        if ending.is_empty() {
            // Not open here: ended already (by itself or the scope it was
            // opened in), or never opened.
            let last = self.last_scope.load(std::sync::atomic::Ordering::Acquire);
            let why = if scope.0.0 >= 1 && scope.0.0 <= last {
                ScopeError::AlreadyEnded(scope.0)
            } else {
                ScopeError::Unknown(scope.0)
            };
            return Err(SubmitError::Scope(why).into());
        }
        // Open in the driver's table, hence in the DAG: no answer needed.
        for l in &ending {
            self.tell(Cmd::EndScope {
                scope: l.id,
                reply: None,
            })?;
        }
        Ok(())
    }
}

/// Whether `s` is `scope` or was opened inside it (through open scopes).
fn within(
    open: &rustc_hash::FxHashMap<ScopeId, Arc<ScopeLife>>,
    mut s: ScopeId,
    scope: ScopeId,
) -> bool {
    loop {
        if s == scope {
            return true;
        }
        match open.get(&s).and_then(|l| l.parent) {
            Some(p) => s = p,
            None => return false,
        }
    }
}

/// An open scope that ends when dropped: what [`Cluster::scope`] and
/// [`ScopeGuard::scope`] give. Buffers allocated in it
/// ([`ScopeGuard::alloc`]) are held by the scope, not by their handles:
/// once it has ended and no unfinished task uses them, their memory goes
/// back to the cluster's pool, and their handles are refused
/// ([`BufferError::ScopeEnded`]).
#[derive(Debug)]
pub struct ScopeGuard<'c> {
    cluster: &'c Cluster,
    scope: Scope,
    ended: bool,
}

impl ScopeGuard<'_> {
    /// The scope, for [`Cluster::scope_buffer`], [`Cluster::alloc_in`]
    /// and [`Cluster::open_scope_in`].
    pub fn id(&self) -> Scope {
        self.scope
    }

    /// A zeroed row-major view of `shape` and `dtype` over a buffer from
    /// the cluster's pool, held by this scope.
    ///
    /// # Errors
    /// [`BufferError::Shape`] for a shape with no or too many axes, an
    /// empty axis, or a size past 64 bits; [`BufferError::AllocScope`]
    /// when the scope was ended (by the scope it was opened in).
    pub fn alloc(&self, shape: &[u32], dtype: DType) -> Result<View, Error> {
        self.cluster.alloc_in(self.scope, shape, dtype)
    }

    /// Has this scope hold `buffer` too (as [`Cluster::scope_buffer`]).
    ///
    /// # Errors
    /// As [`Cluster::scope_buffer`].
    pub fn add(&self, buffer: &Buffer) -> Result<(), Error> {
        self.cluster.scope_buffer(self.scope, buffer)
    }

    /// A scope inside this one: it ends when dropped, and it borrows this
    /// guard, so it ends first.
    ///
    /// # Errors
    /// As [`Cluster::open_scope_in`].
    pub fn scope(&self) -> Result<ScopeGuard<'_>, Error> {
        Ok(ScopeGuard {
            cluster: self.cluster,
            scope: self.cluster.open_scope_in(self.scope)?,
            ended: false,
        })
    }

    /// Ends the scope now, reporting what dropping the guard would not.
    ///
    /// # Errors
    /// As [`Cluster::end_scope`].
    pub fn end(mut self) -> Result<(), Error> {
        self.ended = true;
        self.cluster.end_scope(self.scope)
    }
}

impl Drop for ScopeGuard<'_> {
    fn drop(&mut self) {
        if !self.ended {
            if let Err(e) = self.cluster.end_scope(self.scope) {
                tracing::debug!(scope = self.scope.0.0, error = %e, "scope not ended on drop");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_that_cannot_be_allocated_name_what_is_wrong() {
        let e = |shape: &[u32], d| nbytes_of(shape, d).unwrap_err().to_string();
        assert_eq!(nbytes_of(&[64, 64], DType::F32).unwrap(), 16384);
        assert_eq!(nbytes_of(&[3], DType::Fp4E2M1).unwrap(), 2);
        assert_eq!(
            e(&[4, 0], DType::F32),
            "shape [4, 0] of F32: axis 1 is 0: every axis needs at least one element"
        );
        assert!(e(&[], DType::F32).contains("0 axes; a view has 1 to 5"));
        assert!(e(&[1; 6], DType::F32).contains("6 axes"));
        assert!(
            e(&[u32::MAX; 5], DType::C128).contains("overflows 64 bits"),
            "{}",
            e(&[u32::MAX; 5], DType::C128)
        );
    }
}
