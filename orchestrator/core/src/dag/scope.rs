//! Scopes: buffers registered in one are released once it has ended and
//! no live task uses them.

use strata_wire::CanonicalIdentity;

use super::{Dag, Scope, ScopeError, Transition};
use crate::ids::ScopeId;

impl Dag {
    /// Opens a scope.
    pub fn open_scope(&mut self) -> ScopeId {
        self.next_scope += 1;
        let id = ScopeId(self.next_scope);
        self.scopes.insert(id, Scope::default());
        id
    }

    /// Registers a buffer as an intermediate of `scope`.
    ///
    /// # Errors
    /// When the scope is unknown or has ended.
    pub fn scope_buffer(
        &mut self,
        scope: ScopeId,
        identity: CanonicalIdentity,
    ) -> Result<(), ScopeError> {
        match self.scope_of.get(&identity) {
            Some(&held) if held == scope => return Ok(()),
            Some(&held) => return Err(ScopeError::HeldElsewhere { scope, held }),
            None => {}
        }
        match self.scopes.get_mut(&scope) {
            Some(s) if !s.ended => {
                s.buffers.push(identity);
                s.held += 1;
                self.scope_of.insert(identity, scope);
                self.debug_check();
                Ok(())
            }
            Some(_) => Err(ScopeError::Ended(scope)),
            None => Err(self.gone(scope, ScopeError::Ended)),
        }
    }

    /// Why `scope`, which has no record, was refused: a scope opened here
    /// whose record went with its last buffer has ended (`ended`);
    /// anything else was never opened.
    fn gone(&self, scope: ScopeId, ended: fn(ScopeId) -> ScopeError) -> ScopeError {
        if scope.0 >= 1 && scope.0 <= self.next_scope {
            ended(scope)
        } else {
            ScopeError::Unknown(scope)
        }
    }

    /// Scope records kept: the open scopes, and the ended ones whose
    /// buffers live tasks still use.
    pub fn scopes(&self) -> usize {
        self.scopes.len()
    }

    /// Ends a scope; its buffers that no live task uses are released now,
    /// the others when their last user finishes.
    ///
    /// # Errors
    /// When the scope is unknown or already ended.
    pub fn end_scope(&mut self, scope: ScopeId) -> Result<Vec<Transition>, ScopeError> {
        let Some(s) = self.scopes.get_mut(&scope) else {
            return Err(self.gone(scope, ScopeError::AlreadyEnded));
        };
        if s.ended {
            return Err(ScopeError::AlreadyEnded(scope));
        }
        s.ended = true;
        let buffers = std::mem::take(&mut s.buffers);
        let mut out = Vec::new();
        for b in buffers {
            if self.users.get(&b).copied().unwrap_or(0) == 0 {
                self.release_buffer(b, &mut out);
            }
        }
        if self.scopes.get(&scope).is_some_and(|s| s.held == 0) {
            self.scopes.remove(&scope);
        }
        self.debug_check();
        Ok(out)
    }

    /// Forgets everything about a buffer the caller released (its index,
    /// poisoned entries included).
    pub fn forget_buffer(&mut self, identity: &CanonicalIdentity) {
        if let Some(idx) = self.index.remove(identity) {
            for (eid, e) in idx.entries() {
                for t in e.tasks.iter() {
                    if let Some(n) = self.nodes.get_mut(&t) {
                        n.entries
                            .retain(|&mut (i, x)| !(i == *identity && x == *eid));
                    }
                }
            }
        }
    }
}
