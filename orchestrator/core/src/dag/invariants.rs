//! DAG-1..8 (module docs of `dag`), checked after every transition in
//! debug builds and by the property tests.

use std::collections::{HashMap, HashSet};

use strata_wire::CanonicalIdentity;

use super::{Dag, Kind, State, edge};
use crate::ids::TaskId;

impl Dag {
    pub(super) fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if let Err(e) = self.check_invariants() {
            panic!("DAG invariant broken: {e}");
        }
    }

    /// Checks DAG-1..8 (module docs).
    ///
    /// # Errors
    /// The first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut incoming: HashMap<TaskId, u32> = HashMap::new();
        for (&id, n) in &self.nodes {
            for &(s, kind) in &n.succs {
                if s <= id {
                    return Err(format!("DAG-2: edge {id} -> {s} goes backwards"));
                }
                if kind == 0 {
                    return Err(format!("DAG-2: edge {id} -> {s} has no kind"));
                }
                if self.nodes.contains_key(&s) {
                    *incoming.entry(s).or_insert(0) += 1;
                }
            }
        }
        for (&id, n) in &self.nodes {
            let live_preds = incoming.get(&id).copied().unwrap_or(0);
            if n.unmet != live_preds {
                return Err(format!(
                    "DAG-1: {id} has unmet {} but {live_preds} live predecessors",
                    n.unmet
                ));
            }
            let lost = matches!(n.state, State::Lost { .. });
            let waits = matches!(n.state, State::Waiting | State::Dead);
            if !lost && waits != (n.unmet > 0) {
                return Err(format!(
                    "DAG-3: {id} is {:?} with unmet {}",
                    n.state, n.unmet
                ));
            }
            if n.state == State::Dead && !(n.entries.is_empty() && n.buffers.is_empty()) {
                return Err(format!("DAG-4: dead {id} still holds entries or buffers"));
            }
            if let State::Lost { abandoned } = n.state {
                if n.succs.iter().any(|&(_, k)| k != edge::WAW)
                    || (abandoned && !n.succs.is_empty())
                {
                    return Err(format!("DAG-7: lost {id} has successors {:?}", n.succs));
                }
                if !self.failed.contains_key(&id) {
                    return Err(format!("DAG-4: lost {id} is not recorded as failed"));
                }
            }
            for (identity, entry) in &n.entries {
                match self.index.get(identity).and_then(|i| i.get(*entry)) {
                    Some(e)
                        if e.tasks.contains(id)
                            && e.poisoned == lost
                            && (!lost || e.kind == Kind::Write) => {}
                    _ => {
                        return Err(format!(
                            "DAG-4: {id} lists entry {entry} that is not its live entry"
                        ));
                    }
                }
            }
        }
        let mut users: rustc_hash::FxHashMap<CanonicalIdentity, u32> = Default::default();
        for n in self.nodes.values() {
            for b in &n.buffers {
                *users.entry(*b).or_insert(0) += 1;
            }
        }
        if users != self.users {
            return Err("DAG-6: buffer user counts differ from the live nodes".into());
        }
        let mut held: rustc_hash::FxHashMap<crate::ids::ScopeId, usize> = Default::default();
        for (b, s) in &self.scope_of {
            *held.entry(*s).or_insert(0) += 1;
            let Some(scope) = self.scopes.get(s) else {
                return Err(format!(
                    "DAG-8: {b} is held by scope {}, which has no record",
                    s.0
                ));
            };
            if scope.ended && !self.users.contains_key(b) {
                return Err(format!(
                    "DAG-8: {b} of ended scope {} has no live user but was not released",
                    s.0
                ));
            }
        }
        for (id, s) in &self.scopes {
            let n = held.get(id).copied().unwrap_or(0);
            if s.held != n || (s.ended && n == 0) {
                return Err(format!(
                    "DAG-8: scope {} (ended: {}) counts {} held buffers, holds {n}",
                    id.0, s.ended, s.held
                ));
            }
        }
        let mut seen: HashSet<u64> = HashSet::new();
        for idx in self.index.values() {
            idx.check().map_err(|e| format!("DAG-5: {e}"))?;
            for (eid, e) in idx.entries() {
                seen.insert(*eid);
                if e.kind == Kind::Write && e.tasks.len() != 1 {
                    return Err(format!(
                        "DAG-4: write entry {eid} has {} tasks",
                        e.tasks.len()
                    ));
                }
                for t in e.tasks.iter() {
                    let ok = if e.poisoned {
                        self.failed.contains_key(&t)
                    } else {
                        self.nodes
                            .get(&t)
                            .is_some_and(|n| !matches!(n.state, State::Lost { .. }))
                    };
                    // A live task lists its entries (a failed one's
                    // poisoned writes outlive its node).
                    let listed = ok
                        && (e.poisoned
                            || self
                                .nodes
                                .get(&t)
                                .is_some_and(|n| n.entries.iter().any(|&(_, x)| x == *eid)));
                    if !listed {
                        return Err(format!("DAG-4: entry {eid} of {t} outlives its task"));
                    }
                }
            }
        }
        Ok(())
    }
}
