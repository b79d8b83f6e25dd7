//! The DAG builder: dependency inference from tagged views (DESIGN §4).
//!
//! Contract: running the tasks in any order this DAG allows gives exactly
//! the bytes of running them one by one in submission order. Per buffer
//! identity, an index of live accesses (`index.rs`) answers "which earlier
//! accesses share a byte with this one"; a task gets an edge from
//!
//! | it | from earlier | kind |
//! |---|---|---|
//! | reads (INPUT, INOUT) | writers | RAW |
//! | writes (OUTPUT, OUTPUT_EXISTING, INOUT) | writers | WAW |
//! | writes | readers since the last write | WAR |
//! | names it in `after` | that task | explicit |
//!
//! NO_DEP arguments are neither recorded nor matched. A write retires
//! every entry it covers (later accesses to those bytes meet the write, which
//! is ordered after them), so an index holds only the latest writers and
//! the readers since. A finished task leaves the index at once.
//!
//! Failure: a task that fails, is cancelled, or is skipped never wrote its
//! outputs. Its consumers along RAW and explicit edges are skipped
//! (transitively, with the root cause); successors along WAW and WAR edges
//! only needed ordering and are released. Its write entries stay in the
//! index as *poisoned*, so a task submitted later that reads those bytes is
//! skipped at once; a later write covering them cleans them.
//!
//! Groups: the members of a task (one per worker) are inferred together as
//! one node: no edge within the node, and members are not compared with
//! each other — they may read each other's outputs (they rendezvous), and
//! several may write the same bytes: one buffer named as every member's
//! output is the group's single completion token for downstream tasks.
//!
//! Quarantine (DESIGN §7): a running task whose worker was lost without a
//! fence may still be writing. [`Dag::lose`] ends it like a failure for its
//! readers (they are skipped) and releases tasks that only read-ordered
//! after it (WAR: overwriting what it reads can only change its own,
//! discarded, result), but keeps the node *lost*: its writes stay in the
//! index as quarantined entries, and every task that writes those bytes —
//! already waiting, or submitted later — keeps an edge to it. The node goes
//! only when the caller has proof the task can no longer write
//! ([`Dag::lift`]), which releases those writers; or, when that proof is
//! given up on ([`Dag::abandon`]), the waiting writers fail and later ones
//! are refused at insert ([`Born::Quarantined`]) until a late lift.
//!
//! Scopes: buffers registered in a scope are released (a [`Transition::Release`])
//! once the scope has ended and no live task uses them.
//!
//! Invariants, checked by [`Dag::check_invariants`] after every transition
//! in debug builds and by the property tests:
//! - DAG-1: a node's `unmet` count equals its live predecessors;
//! - DAG-2: edges go from lower to higher task ids (acyclic);
//! - DAG-3: a node is Ready or Running iff its `unmet` is 0 (a dead one,
//!   skipped while predecessors were live, waits for them like a waiting
//!   one, holding no entries or buffers);
//! - DAG-4: every live index entry belongs to a live node, and every
//!   poisoned one to a failed task; a lost node's entries are all poisoned
//!   writes, every other node's are live;
//! - DAG-7: a lost node's successors are all write-after-write, and an
//!   abandoned one has none;
//! - DAG-5: each index's R-tree holds exactly its entries' rectangles;
//! - DAG-6: a buffer's user count equals the live nodes that touch it.

mod index;
mod quarantine;
mod submit;

use std::collections::{HashMap, HashSet};

use strata_wire::{ArgTag, CanonicalIdentity, Footprint, Overlap, Tensor};

use crate::ids::{ScopeId, TaskId};
use crate::sched::CancelError;
use index::{BufferIndex, Kind};
pub use submit::{SubmitError, SubmitReason};

/// Why a scope call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// No such scope was opened.
    #[error("scope {} is unknown", .0.0)]
    Unknown(ScopeId),
    /// A buffer was registered in a scope that has ended.
    #[error("scope {} has ended", .0.0)]
    Ended(ScopeId),
    /// The scope was ended twice.
    #[error("scope {} has already ended", .0.0)]
    AlreadyEnded(ScopeId),
}

/// Edge kinds, as bits.
pub mod edge {
    /// Read after write.
    pub const RAW: u8 = 1;
    /// Write after write.
    pub const WAW: u8 = 2;
    /// Write after read.
    pub const WAR: u8 = 4;
    /// An explicit `after` edge.
    pub const EXPLICIT: u8 = 8;
    /// Kinds along which a failure makes the consumer skip.
    pub const PROPAGATES_FAILURE: u8 = RAW | EXPLICIT;
}

/// One tensor argument of a task member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arg {
    /// The view.
    pub tensor: Tensor,
    /// How the member touches it.
    pub tag: ArgTag,
}

/// A task as the DAG sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    /// Its id, greater than every id inserted before.
    pub id: TaskId,
    /// One argument list per member (one member for a plain task).
    pub members: Vec<Vec<Arg>>,
    /// Scalars per member, counted for the 128 limit.
    pub scalars: Vec<usize>,
    /// Tasks it must run after, whatever their bytes.
    pub after: Vec<TaskId>,
}

impl NewTask {
    /// A single-member task.
    pub fn single(id: TaskId, args: Vec<Arg>) -> Self {
        NewTask {
            id,
            members: vec![args],
            scalars: vec![0],
            after: Vec::new(),
        }
    }
}

/// Where an inserted task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Born {
    /// It can run now.
    Ready,
    /// It waits for predecessors.
    Waiting,
    /// It reads bytes a failed task never wrote (or follows one
    /// explicitly): skipped at once, with the root cause.
    Skipped {
        /// The task that failed.
        because: TaskId,
    },
    /// It writes bytes quarantined by a lost task whose fence was given
    /// up on ([`Dag::abandon`]): refused at once, never run.
    Quarantined {
        /// The lost task.
        lost: TaskId,
    },
}

/// The result of [`Dag::insert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inserted {
    /// Predecessors with the kinds of each edge (bits of [`edge`]).
    pub edges: Vec<(TaskId, u8)>,
    /// Where it stands.
    pub born: Born,
}

/// Something that happened to other tasks or buffers because of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The task became ready.
    Ready(TaskId),
    /// The task will not run: it depends on `because`, which failed.
    Skipped {
        /// The skipped task.
        task: TaskId,
        /// The failed task at the root.
        because: TaskId,
    },
    /// A scoped buffer is no longer used and may be released.
    Release(CanonicalIdentity),
    /// The task waited on bytes quarantined by `lost`, whose fence was
    /// given up on: it fails without running.
    Quarantined {
        /// The failed task.
        task: TaskId,
        /// The lost task that holds the bytes.
        lost: TaskId,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Ready,
    Running,
    /// Lost without a fence: its writes are quarantined.
    Lost {
        abandoned: bool,
    },
    /// Skipped or cancelled while predecessors were still live: it will
    /// not run, but what ordered after it (WAW, WAR) still waits for
    /// those predecessors, as it would have.
    Dead,
}

#[derive(Debug)]
struct Node {
    state: State,
    unmet: u32,
    succs: Vec<(TaskId, u8)>,
    entries: Vec<(CanonicalIdentity, u64)>,
    buffers: Vec<CanonicalIdentity>,
    /// Its arguments, kept (moved, not copied) for the rare loss: to
    /// quarantine its writes whole (later writes may have retired some of
    /// its entries) and to find the later tasks that touch them.
    members: Vec<Vec<Arg>>,
}

#[derive(Debug, Default)]
struct Scope {
    ended: bool,
    buffers: Vec<CanonicalIdentity>,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DagStats {
    /// Tasks inserted.
    pub inserted: u64,
    /// Edges created (one per predecessor, whatever its kinds).
    pub edges: u64,
    /// Index entries retired because a newer write covered them.
    pub retired: u64,
    /// Candidate entries the overlap engine confirmed.
    pub matches: u64,
}

/// The DAG builder.
#[derive(Debug, Default)]
pub struct Dag {
    last: Option<TaskId>,
    nodes: HashMap<TaskId, Node>,
    index: HashMap<CanonicalIdentity, BufferIndex>,
    next_entry: u64,
    /// Tasks that failed, were skipped or cancelled, with the root cause.
    failed: HashMap<TaskId, TaskId>,
    users: HashMap<CanonicalIdentity, u32>,
    scopes: HashMap<ScopeId, Scope>,
    scope_of: HashMap<CanonicalIdentity, ScopeId>,
    next_scope: u64,
    stats: DagStats,
}

impl Dag {
    /// An empty DAG.
    pub fn new() -> Self {
        Dag::default()
    }

    /// Counters.
    pub fn stats(&self) -> DagStats {
        self.stats
    }

    /// Tasks inserted and not yet finished.
    pub fn live(&self) -> usize {
        self.nodes.len()
    }

    /// Live index entries over all buffers.
    pub fn entries(&self) -> usize {
        self.index.values().map(BufferIndex::len).sum()
    }

    /// Whether a task is live (inserted, not finished).
    pub fn is_live(&self, id: TaskId) -> bool {
        self.nodes.contains_key(&id)
    }

    /// Checks a task (the rules in `submit.rs`) and, if it passes, records it and
    /// returns its edges.
    ///
    /// # Errors
    /// [`SubmitError`] naming the member, argument and rule; nothing is
    /// recorded then.
    pub fn insert(&mut self, task: NewTask) -> Result<Inserted, SubmitError> {
        self.insert_checked(task)
    }

    /// The submit-time checks of `task` that depend on nothing but the
    /// task itself (all but the increasing-id rule): what
    /// [`Dag::insert`] would refuse it for, without a DAG. A driver runs
    /// them where the task is submitted, so that it can hand the task on
    /// without waiting for the DAG's answer.
    ///
    /// # Errors
    /// As [`Dag::insert`].
    pub fn check(task: &NewTask) -> Result<(), SubmitError> {
        submit::check(task, None)
    }

    fn insert_checked(&mut self, task: NewTask) -> Result<Inserted, SubmitError> {
        submit::check(&task, self.last)?;
        let id = task.id;
        self.last = Some(id);
        self.stats.inserted += 1;

        // 1. Edges, against the index as it was before this task.
        let mut preds: Vec<(TaskId, u8)> = Vec::new();
        let mut skipped_by: Option<TaskId> = None;
        let mut quarantined_by: Option<TaskId> = None;
        // (identity, footprint, tag, whether a write sets every bit of the
        // bytes it covers: a sub-byte view leaves the other nibble, so it
        // retires nothing — a lost task's late nibble would otherwise hide
        // behind it).
        let mut accesses: Vec<(CanonicalIdentity, Footprint, ArgTag, bool)> = Vec::new();
        for arg in task
            .members
            .iter()
            .flatten()
            .filter(|a| a.tag != ArgTag::NoDep)
        {
            let fp = Footprint::of(&arg.tensor);
            let identity = *arg.tensor.identity();
            if let Some(idx) = self.index.get(&identity) {
                for (entry_id, _) in idx.matches(&fp) {
                    self.stats.matches += 1;
                    let Some(e) = idx.get(entry_id) else { continue };
                    if e.poisoned {
                        if arg.tag.reads() && e.kind == Kind::Write {
                            skipped_by
                                .get_or_insert(self.failed.get(&e.task).copied().unwrap_or(e.task));
                        } else if arg.tag.writes() {
                            // A dead task's writes stand for the writes
                            // they retired: a writer orders after it. For
                            // quarantined bytes, a writer waits for the
                            // lost task's fence (or is refused once the
                            // fence was given up on).
                            match self.nodes.get(&e.task).map(|n| n.state) {
                                Some(State::Lost { abandoned: false } | State::Dead) => {
                                    add_edge(&mut preds, e.task, edge::WAW);
                                }
                                Some(State::Lost { abandoned: true }) => {
                                    quarantined_by.get_or_insert(e.task);
                                }
                                _ => {}
                            }
                        }
                        continue;
                    }
                    let kind = match (e.kind, arg.tag.reads(), arg.tag.writes()) {
                        (Kind::Write, true, true) => edge::RAW | edge::WAW,
                        (Kind::Write, true, false) => edge::RAW,
                        (Kind::Write, false, true) => edge::WAW,
                        (Kind::Read, _, true) => edge::WAR,
                        _ => 0,
                    };
                    if kind != 0 {
                        add_edge(&mut preds, e.task, kind);
                    }
                }
            }
            accesses.push((identity, fp, arg.tag, arg.tensor.dtype().bits() >= 8));
        }
        for &a in &task.after {
            let lost = matches!(
                self.nodes.get(&a).map(|n| n.state),
                Some(State::Lost { .. } | State::Dead)
            );
            if self.nodes.contains_key(&a) && !lost {
                add_edge(&mut preds, a, edge::EXPLICIT);
            } else if let Some(&root) = self.failed.get(&a) {
                skipped_by.get_or_insert(root);
            }
        }

        // 2. A task born skipped (or refused by a quarantine) never runs:
        //    record its writes as poisoned (without retiring anything: it
        //    orders after nothing).
        let refused = match (skipped_by, quarantined_by) {
            (Some(because), _) => Some((because, Born::Skipped { because })),
            (None, Some(lost)) => Some((id, Born::Quarantined { lost })),
            (None, None) => None,
        };
        if let Some((root, born)) = refused {
            for (identity, fp, tag, _) in accesses {
                if tag.writes() {
                    let entry = self.new_entry();
                    let idx = self.index.entry(identity).or_default();
                    idx.insert(entry, id, Kind::Write, fp);
                    if let Some(e) = idx.get_mut(entry) {
                        e.poisoned = true;
                    }
                }
            }
            self.failed.insert(id, root);
            self.debug_check();
            return Ok(Inserted {
                edges: Vec::new(),
                born,
            });
        }

        // 3. Record the node and its edges.
        let mut node = Node {
            state: if preds.is_empty() {
                State::Ready
            } else {
                State::Waiting
            },
            unmet: u32::try_from(preds.len()).unwrap_or(u32::MAX),
            succs: Vec::new(),
            entries: Vec::new(),
            buffers: Vec::new(),
            members: Vec::new(),
        };
        for &(p, kind) in &preds {
            if let Some(pn) = self.nodes.get_mut(&p) {
                pn.succs.push((id, kind));
            }
        }
        self.stats.edges += preds.len() as u64;

        // 4. Update the index: writes retire what they cover, then every
        //    access is recorded.
        for (identity, fp, tag, whole) in accesses {
            if !node.buffers.contains(&identity) {
                node.buffers.push(identity);
                *self.users.entry(identity).or_insert(0) += 1;
            }
            let entry = self.new_entry();
            let idx = self.index.entry(identity).or_default();
            if tag.writes() && whole {
                let covered: Vec<u64> = idx
                    .matches(&fp)
                    .into_iter()
                    .filter(|(eid, rel)| {
                        *rel == Overlap::Covers
                            && idx.get(*eid).is_some_and(|e| {
                                e.task != id
                                    && !matches!(
                                        self.nodes.get(&e.task).map(|n| n.state),
                                        Some(State::Lost { .. })
                                    )
                            })
                    })
                    .map(|(eid, _)| eid)
                    .collect();
                for eid in covered {
                    if let Some(e) = idx.remove(eid) {
                        self.stats.retired += 1;
                        if let Some(owner) = self.nodes.get_mut(&e.task) {
                            owner.entries.retain(|&(i, x)| !(i == identity && x == eid));
                        }
                    }
                }
            }
            let kind = if tag.writes() {
                Kind::Write
            } else {
                Kind::Read
            };
            idx.insert(entry, id, kind, fp);
            node.entries.push((identity, entry));
        }
        node.members = task.members;
        let born = if node.unmet == 0 {
            Born::Ready
        } else {
            Born::Waiting
        };
        self.nodes.insert(id, node);
        self.debug_check();
        Ok(Inserted { edges: preds, born })
    }

    /// Marks a ready task as running (dispatched): it can no longer be
    /// cancelled.
    ///
    /// # Errors
    /// When the task is not live and ready.
    pub fn start(&mut self, id: TaskId) -> Result<(), String> {
        match self.nodes.get_mut(&id) {
            Some(n) if n.state == State::Ready => {
                n.state = State::Running;
                Ok(())
            }
            Some(n) => Err(format!("{id} is {:?}, not ready", n.state)),
            None => Err(format!("{id} is not live")),
        }
    }

    /// Retires a task that ran to success; returns what became ready (and
    /// scoped buffers that may now be released).
    ///
    /// # Errors
    /// When the task is not live and ready or running.
    pub fn complete(&mut self, id: TaskId) -> Result<Vec<Transition>, String> {
        let node = self.take_runnable(id)?;
        let mut out = Vec::new();
        for (identity, entry) in &node.entries {
            self.remove_entry(*identity, *entry);
        }
        for &(s, _) in &node.succs {
            self.release_one(s, &mut out);
        }
        self.drop_users(&node, &mut out);
        self.debug_check();
        Ok(out)
    }

    /// Retires a task that failed; its data consumers are skipped.
    ///
    /// # Errors
    /// When the task is not live and ready or running.
    pub fn fail(&mut self, id: TaskId) -> Result<Vec<Transition>, String> {
        let node = self.take_runnable(id)?;
        let mut out = Vec::new();
        self.finish_bad(id, id, node, &mut out);
        self.debug_check();
        Ok(out)
    }

    /// Cancels a task that has not started; its data consumers are skipped.
    ///
    /// # Errors
    /// When the task is not live, or already running.
    pub fn cancel(&mut self, id: TaskId) -> Result<Vec<Transition>, CancelError> {
        match self.nodes.get(&id).map(|n| n.state) {
            Some(State::Running) => return Err(CancelError::Running(id)),
            Some(State::Lost { .. }) => return Err(CancelError::Lost(id)),
            Some(State::Dead) | None => return Err(CancelError::NotLive(id)),
            _ => {}
        }
        let Some(node) = self.nodes.remove(&id) else {
            return Err(CancelError::NotLive(id));
        };
        let mut out = Vec::new();
        self.finish_bad(id, id, node, &mut out);
        self.debug_check();
        Ok(out)
    }

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
        match self.scopes.get_mut(&scope) {
            Some(s) if !s.ended => {
                s.buffers.push(identity);
                self.scope_of.insert(identity, scope);
                Ok(())
            }
            Some(_) => Err(ScopeError::Ended(scope)),
            None => Err(ScopeError::Unknown(scope)),
        }
    }

    /// Ends a scope; its buffers that no live task uses are released now,
    /// the others when their last user finishes.
    ///
    /// # Errors
    /// When the scope is unknown or already ended.
    pub fn end_scope(&mut self, scope: ScopeId) -> Result<Vec<Transition>, ScopeError> {
        let s = self
            .scopes
            .get_mut(&scope)
            .ok_or(ScopeError::Unknown(scope))?;
        if s.ended {
            return Err(ScopeError::AlreadyEnded(scope));
        }
        s.ended = true;
        let buffers = s.buffers.clone();
        let mut out = Vec::new();
        for b in buffers {
            if self.users.get(&b).copied().unwrap_or(0) == 0 {
                self.release_buffer(b, &mut out);
            }
        }
        Ok(out)
    }

    /// Forgets everything about a buffer the caller released (its index,
    /// poisoned entries included).
    pub fn forget_buffer(&mut self, identity: &CanonicalIdentity) {
        if let Some(idx) = self.index.remove(identity) {
            for (eid, e) in idx.entries() {
                if let Some(n) = self.nodes.get_mut(&e.task) {
                    n.entries.retain(|&(i, x)| !(i == *identity && x == *eid));
                }
            }
        }
    }

    fn new_entry(&mut self) -> u64 {
        self.next_entry += 1;
        self.next_entry
    }

    fn take_runnable(&mut self, id: TaskId) -> Result<Node, String> {
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

    fn remove_entry(&mut self, identity: CanonicalIdentity, entry: u64) {
        if let Some(idx) = self.index.get_mut(&identity) {
            idx.remove(entry);
            if idx.is_empty() {
                self.index.remove(&identity);
            }
        }
    }

    /// A predecessor of `s` finished without blocking it.
    fn release_one(&mut self, s: TaskId, out: &mut Vec<Transition>) {
        self.release(vec![s], out);
    }

    /// A predecessor of each of `tasks` finished without blocking it: a
    /// waiting task with nothing left to wait for becomes ready; a dead one
    /// goes, and releases in turn what ordered after it.
    fn release(&mut self, mut tasks: Vec<TaskId>, out: &mut Vec<Transition>) {
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
    fn skip(&mut self, root: TaskId, s: TaskId, out: &mut Vec<Transition>) {
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

    /// Leaves `node`'s writes in the index as poisoned entries and drops
    /// its reads.
    fn poison(&mut self, node: &Node) {
        for &(identity, entry) in &node.entries {
            let poison = self
                .index
                .get_mut(&identity)
                .and_then(|idx| idx.get_mut(entry))
                .map(|e| {
                    if e.kind == Kind::Write {
                        e.poisoned = true;
                    }
                    e.kind == Kind::Write
                })
                .unwrap_or(false);
            if !poison {
                self.remove_entry(identity, entry);
            }
        }
    }

    /// Finishes `node` (task `id`) without its outputs: poisons its writes,
    /// skips its data consumers, and releases the others — at once when it
    /// has no live predecessor, otherwise it stays *dead* until they finish,
    /// so that what ordered after it keeps their order too.
    fn finish_bad(&mut self, root: TaskId, id: TaskId, mut node: Node, out: &mut Vec<Transition>) {
        self.failed.insert(id, root);
        self.poison(&node);
        node.entries.clear();
        let mut keep = Vec::new();
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

    fn drop_users(&mut self, node: &Node, out: &mut Vec<Transition>) {
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

    fn release_buffer(&mut self, b: CanonicalIdentity, out: &mut Vec<Transition>) {
        if self.scope_of.remove(&b).is_some() {
            self.forget_buffer(&b);
            out.push(Transition::Release(b));
        }
    }

    fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if let Err(e) = self.check_invariants() {
            panic!("DAG invariant broken: {e}");
        }
    }

    /// Checks DAG-1..6 (module docs).
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
                        if e.task == id
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
        let mut users: HashMap<CanonicalIdentity, u32> = HashMap::new();
        for n in self.nodes.values() {
            for b in &n.buffers {
                *users.entry(*b).or_insert(0) += 1;
            }
        }
        if users != self.users {
            return Err("DAG-6: buffer user counts differ from the live nodes".into());
        }
        let mut seen: HashSet<u64> = HashSet::new();
        for idx in self.index.values() {
            idx.check().map_err(|e| format!("DAG-5: {e}"))?;
            for (eid, e) in idx.entries() {
                seen.insert(*eid);
                let ok = if e.poisoned {
                    self.failed.contains_key(&e.task)
                } else {
                    self.nodes
                        .get(&e.task)
                        .is_some_and(|n| !matches!(n.state, State::Lost { .. }))
                };
                if !ok {
                    return Err(format!(
                        "DAG-4: entry {eid} of {} outlives its task",
                        e.task
                    ));
                }
            }
        }
        Ok(())
    }
}

fn add_edge(preds: &mut Vec<(TaskId, u8)>, from: TaskId, kind: u8) {
    match preds.iter_mut().find(|(p, _)| *p == from) {
        Some((_, k)) => *k |= kind,
        None => preds.push((from, kind)),
    }
}
