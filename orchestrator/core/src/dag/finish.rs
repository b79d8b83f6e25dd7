//! How a node leaves: entries retired, successors released or skipped
//! (with the root cause), failed writes poisoned, buffers let go.

use strata_wire::CanonicalIdentity;

use super::{Dag, Kind, Node, State, Transition, edge};
use crate::ids::TaskId;

impl Dag {
    pub(super) fn new_entry(&mut self) -> u64 {
        self.next_entry += 1;
        self.next_entry
    }

    pub(super) fn take_runnable(&mut self, id: TaskId) -> Result<Box<Node>, String> {
        match self.nodes.get(&id).map(|n| n.state) {
            Some(State::Ready | State::Running) => self
                .nodes
                .remove(&id)
                .ok_or_else(|| format!("{id} is not live")),
            Some(State::Waiting) => Err(format!("{id} is still waiting for its predecessors")),
            Some(State::Lost { .. }) => Err(format!("{id} was lost with its worker")),
            Some(State::Dead) | None => Err(format!("{id} is not live")),
        }
    }

    /// Takes `task` out of an index entry (the entry goes with its last
    /// task).
    pub(super) fn remove_entry(&mut self, identity: CanonicalIdentity, entry: u64, task: TaskId) {
        if let Some(idx) = self.index.get_mut(&identity) {
            idx.leave(entry, task);
            if idx.is_empty() {
                self.index.remove(&identity);
            }
        }
    }

    /// A predecessor of `s` finished without blocking it.
    pub(super) fn release_one(&mut self, s: TaskId, out: &mut Vec<Transition>) {
        self.release(vec![s], out);
    }

    /// A predecessor of each of `tasks` finished without blocking it: a
    /// waiting task with nothing left to wait for becomes ready; a dead one
    /// goes, and releases in turn what ordered after it.
    pub(super) fn release(&mut self, mut tasks: Vec<TaskId>, out: &mut Vec<Transition>) {
        while let Some(s) = tasks.pop() {
            let Some(n) = self.nodes.get_mut(&s) else {
                continue;
            };
            n.unmet -= 1;
            if n.unmet > 0 {
                continue;
            }
            match n.state {
                State::Waiting => {
                    n.state = State::Ready;
                    out.push(Transition::Ready(s));
                }
                State::Dead => {
                    if let Some(dead) = self.nodes.remove(&s) {
                        tasks.extend(dead.succs.iter().map(|&(t, _)| t));
                    }
                }
                _ => {}
            }
        }
    }

    /// A predecessor of `s` failed: a data consumer is skipped (a dead one
    /// only counts the predecessor as finished).
    pub(super) fn skip(&mut self, root: TaskId, s: TaskId, out: &mut Vec<Transition>) {
        match self.nodes.get(&s).map(|n| n.state) {
            Some(State::Dead) => self.release(vec![s], out),
            Some(_) => {
                if let Some(mut sn) = self.nodes.remove(&s) {
                    sn.unmet -= 1;
                    out.push(Transition::Skipped {
                        task: s,
                        because: root,
                    });
                    self.finish_bad(root, s, sn, out);
                }
            }
            None => {}
        }
    }

    /// Leaves the writes of `node` (task `id`) in the index as poisoned
    /// entries and drops its reads.
    pub(super) fn poison(&mut self, id: TaskId, node: &Node) {
        for &(identity, entry) in &node.entries {
            let write = self
                .index
                .get(&identity)
                .and_then(|idx| idx.get(entry))
                .is_some_and(|e| e.kind == Kind::Write);
            match self.index.get_mut(&identity) {
                Some(idx) if write => idx.poison(entry),
                _ => self.remove_entry(identity, entry, id),
            }
        }
    }

    /// Finishes `node` (task `id`) without its outputs: poisons its writes,
    /// skips its data consumers, and releases the others — at once when it
    /// has no live predecessor, otherwise it stays *dead* until they finish,
    /// so that what ordered after it keeps their order too.
    pub(super) fn finish_bad(
        &mut self,
        root: TaskId,
        id: TaskId,
        mut node: Box<Node>,
        out: &mut Vec<Transition>,
    ) {
        self.failed.insert(id, root);
        self.poison(id, &node);
        node.entries.clear();
        let mut keep = super::Few::new();
        for (s, kind) in std::mem::take(&mut node.succs) {
            if kind & edge::PROPAGATES_FAILURE != 0 {
                self.skip(root, s, out);
            } else {
                keep.push((s, kind));
            }
        }
        self.drop_users(&node, out);
        node.buffers.clear();
        if node.unmet == 0 {
            self.release(keep.into_iter().map(|(s, _)| s).collect(), out);
        } else {
            node.succs = keep;
            node.state = State::Dead;
            self.nodes.insert(id, node);
        }
    }

    pub(super) fn drop_users(&mut self, node: &Node, out: &mut Vec<Transition>) {
        for b in &node.buffers {
            let left = self.users.get_mut(b).map(|u| {
                *u -= 1;
                *u
            });
            if left == Some(0) {
                self.users.remove(b);
                let ended = self
                    .scope_of
                    .get(b)
                    .and_then(|s| self.scopes.get(s))
                    .is_some_and(|s| s.ended);
                if ended {
                    self.release_buffer(*b, out);
                }
            }
        }
    }

    pub(super) fn release_buffer(&mut self, b: CanonicalIdentity, out: &mut Vec<Transition>) {
        if let Some(scope) = self.scope_of.remove(&b) {
            self.forget_buffer(&b);
            out.push(Transition::Release(b));
            if let Some(s) = self.scopes.get_mut(&scope) {
                s.held = s.held.saturating_sub(1);
                if s.ended && s.held == 0 {
                    self.scopes.remove(&scope);
                }
            }
        }
    }
}
