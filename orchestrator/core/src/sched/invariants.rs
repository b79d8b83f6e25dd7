//! SCHED-1..5 (module docs of `sched`), checked after every event in
//! debug builds and by the property tests.

use std::collections::HashMap;

use super::{Scheduler, State};
use crate::ids::{TaskId, WorkerId};

impl Scheduler {
    pub(super) fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if let Err(e) = self.check_invariants() {
            panic!("scheduler invariant broken: {e}");
        }
    }

    /// Checks SCHED-1..4 (module docs).
    ///
    /// # Errors
    /// The first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut running_on: HashMap<WorkerId, usize> = HashMap::new();
        let mut queued_on: HashMap<WorkerId, Vec<TaskId>> = HashMap::new();
        for (id, t) in &self.tasks {
            match &t.state {
                State::Waiting => {}
                State::Fencing(_) => {
                    if t.retries == 0 || t.members.len() != 1 {
                        return Err(format!("SCHED-5: {id} waits for a fence without a retry"));
                    }
                }
                State::Queued(ws) => {
                    if ws.len() != t.members.len() {
                        return Err(format!(
                            "SCHED-2: {id} queued on {} workers for {} members",
                            ws.len(),
                            t.members.len()
                        ));
                    }
                    for w in ws {
                        queued_on.entry(*w).or_default().push(*id);
                    }
                }
                State::Running { workers, left, .. } => {
                    for (m, (w, l)) in workers.iter().zip(left).enumerate() {
                        if *l {
                            *running_on.entry(*w).or_insert(0) += 1;
                            let takes = self.workers.get(w).is_some_and(|x| x.takes(&t.members[m]));
                            if !takes {
                                return Err(format!(
                                    "SCHED-3: {id} member {m} runs on {w}, which lacks its callable or what it needs"
                                ));
                            }
                        }
                    }
                }
            }
        }
        for (id, w) in &self.workers {
            let running = running_on.get(id).copied().unwrap_or(0);
            if w.in_flight != running || w.in_flight > w.window {
                return Err(format!(
                    "SCHED-1: {id} has in_flight {} (window {}), {running} members running",
                    w.in_flight, w.window
                ));
            }
            let mut q: Vec<TaskId> = w.queue.iter().collect();
            let mut expect = queued_on.remove(id).unwrap_or_default();
            q.sort_unstable();
            expect.sort_unstable();
            if q != expect {
                return Err(format!(
                    "SCHED-2: {id} queue {q:?} differs from the tasks queued on it {expect:?}"
                ));
            }
            if !w.up && (w.in_flight > 0 || !w.queue.is_empty()) {
                return Err(format!("SCHED-4: {id} is down with work on it"));
            }
        }
        if let Some((w, _)) = queued_on.into_iter().next() {
            return Err(format!("SCHED-2: tasks queued on unknown {w}"));
        }
        Ok(())
    }
}
