//! Quarantine of a task lost without a fence (module docs of `dag`):
//! [`Dag::lose`] ends it for its readers and keeps its writes quarantined,
//! [`Dag::lift`] ends the quarantine once fenced, [`Dag::abandon`] gives up
//! on the fence.

use std::collections::HashSet;

use strata_wire::{ArgTag, CanonicalIdentity, Footprint, Overlap};

use super::{Dag, Node, State, Transition, edge};
use crate::ids::TaskId;

impl Dag {
    /// Ends a running task whose worker was lost without a fence (it may
    /// still write): its readers are skipped, tasks that only ordered
    /// after its reads are released, and its writes stay quarantined —
    /// writers of those bytes wait for [`Dag::lift`] (module docs).
    ///
    /// # Errors
    /// When the task is not live and ready or running.
    pub fn lose(&mut self, id: TaskId) -> Result<Vec<Transition>, String> {
        let mut node = self.take_runnable(id)?;
        let mut out = Vec::new();
        self.failed.insert(id, id);
        // Its whole writes become quarantined entries (some of its own may
        // have been retired by covering writes, which order after it).
        for (identity, entry) in std::mem::take(&mut node.entries) {
            self.remove_entry(identity, entry, id);
        }
        let writes: Vec<(CanonicalIdentity, Footprint)> = node
            .members
            .iter()
            .flatten()
            .filter(|a| a.tag.writes())
            .map(|a| (*a.tensor.identity(), Footprint::of(&a.tensor)))
            .collect();
        self.link_conflicts(&mut node, &writes);
        for tensor in node
            .members
            .iter()
            .flatten()
            .filter(|a| a.tag.writes())
            .map(|a| a.tensor)
        {
            let identity = *tensor.identity();
            let entry = self.new_entry();
            let idx = self.index.entry(identity).or_default();
            idx.insert_write(entry, id, Footprint::of(&tensor), true);
            node.entries.push((identity, entry));
        }
        let mut waiting = super::Few::new();
        for (s, kind) in std::mem::take(&mut node.succs) {
            if kind & edge::WAW != 0 {
                // It writes bytes this task may still write: it waits for
                // the fence (skipped first if it also reads them).
                waiting.push((s, edge::WAW));
                if kind & edge::PROPAGATES_FAILURE != 0 {
                    if let Some(sn) = self.nodes.remove(&s) {
                        if sn.state == State::Dead {
                            self.nodes.insert(s, sn);
                        } else {
                            out.push(Transition::Skipped {
                                task: s,
                                because: id,
                            });
                            self.finish_bad(id, s, sn, &mut out);
                        }
                    }
                }
            } else if kind & edge::PROPAGATES_FAILURE != 0 {
                self.skip(id, s, &mut out);
            } else {
                self.release(vec![s], &mut out);
            }
        }
        node.succs = waiting;
        node.state = State::Lost { abandoned: false };
        self.nodes.insert(id, node);
        self.debug_check();
        Ok(out)
    }

    /// Gives the lost task in `node` a direct edge to every live task after
    /// it that touches a byte it writes (`writes`). Those are all
    /// reachable from it (the DAG orders every later conflicting access
    /// after it), but possibly only through writers that retired its
    /// entries; once such a writer fails or is released, the direct edge
    /// is what keeps them from running while the lost task may still
    /// write.
    fn link_conflicts(&mut self, node: &mut Node, writes: &[(CanonicalIdentity, Footprint)]) {
        let mut seen: HashSet<TaskId> = HashSet::new();
        let mut stack: Vec<TaskId> = node.succs.iter().map(|&(s, _)| s).collect();
        let mut conflicts = Vec::new();
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            let Some(nn) = self.nodes.get(&n) else {
                continue;
            };
            stack.extend(nn.succs.iter().map(|&(s, _)| s));
            if nn.state == State::Dead {
                continue;
            }
            let mut kind = 0;
            for a in nn
                .members
                .iter()
                .flatten()
                .filter(|a| a.tag != ArgTag::NoDep)
            {
                let hit = writes.iter().any(|(identity, fp)| {
                    identity == a.tensor.identity()
                        && fp.overlap(&Footprint::of(&a.tensor)) != Overlap::Disjoint
                });
                if hit {
                    kind |= if a.tag.reads() { edge::RAW } else { 0 };
                    kind |= if a.tag.writes() { edge::WAW } else { 0 };
                }
            }
            if kind != 0 {
                conflicts.push((n, kind));
            }
        }
        for (n, kind) in conflicts {
            match node.succs.iter_mut().find(|(s, _)| *s == n) {
                Some((_, k)) => *k |= kind,
                None => {
                    node.succs.push((n, kind));
                    if let Some(nn) = self.nodes.get_mut(&n) {
                        nn.unmet += 1;
                    }
                }
            }
        }
    }

    /// Lifts the quarantine of a lost task: it can no longer write (its
    /// worker was seen dead, or proved the task ended). The writers that
    /// waited are released; its bytes stay poisoned for readers, like any
    /// failed task's.
    ///
    /// # Errors
    /// When the task is not lost.
    pub fn lift(&mut self, id: TaskId) -> Result<Vec<Transition>, String> {
        if !self.is_lost(id) {
            return Err(format!("{id} is not lost"));
        }
        let Some(mut node) = self.nodes.remove(&id) else {
            return Err(format!("{id} is not live"));
        };
        let mut out = Vec::new();
        let succs: Vec<TaskId> = node.succs.drain(..).map(|(s, _)| s).collect();
        self.release(succs, &mut out);
        self.drop_users(&node, &mut out);
        self.debug_check();
        Ok(out)
    }

    /// Gives up waiting for a lost task's fence: the writers waiting on its
    /// bytes fail ([`Transition::Quarantined`]; what ordered after them
    /// follows the usual failure rules), and later writers of its bytes are
    /// refused at insert, until [`Dag::lift`]. The bytes stay quarantined.
    ///
    /// # Errors
    /// When the task is not lost.
    pub fn abandon(&mut self, id: TaskId) -> Result<Vec<Transition>, String> {
        let succs = match self.nodes.get_mut(&id) {
            Some(n) if matches!(n.state, State::Lost { .. }) => {
                n.state = State::Lost { abandoned: true };
                std::mem::take(&mut n.succs)
            }
            _ => return Err(format!("{id} is not lost")),
        };
        let mut out = Vec::new();
        for (s, _) in succs {
            match self.nodes.get(&s).map(|n| n.state) {
                Some(State::Dead) => self.release(vec![s], &mut out),
                Some(_) => {
                    if let Some(mut sn) = self.nodes.remove(&s) {
                        sn.unmet -= 1;
                        out.push(Transition::Quarantined { task: s, lost: id });
                        self.finish_bad(s, s, sn, &mut out);
                    }
                }
                None => {}
            }
        }
        self.debug_check();
        Ok(out)
    }

    /// Whether `id` is lost and its bytes quarantined.
    pub fn is_lost(&self, id: TaskId) -> bool {
        matches!(
            self.nodes.get(&id).map(|n| n.state),
            Some(State::Lost { .. })
        )
    }
}
