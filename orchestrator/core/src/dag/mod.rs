//! The DAG builder: dependency inference from tagged views
//! (docs/scheduling.md#edges-from-bytes).
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
//! A reader is matched against writes only; readers of one footprint
//! share one read entry (its set of readers), so that N unfinished
//! readers of the same bytes cost O(1) each; a writer takes a WAR edge
//! from every reader of the entries it meets.
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
//! Quarantine (docs/reliability.md, quarantine): a running task whose worker was lost without a
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
//! - DAG-4: every task of a live index entry is a live node that lists it
//!   (a write entry has exactly one task), and every poisoned one belongs
//!   to a failed task; a lost node's entries are all poisoned
//!   writes, every other node's are live;
//! - DAG-7: a lost node's successors are all write-after-write, and an
//!   abandoned one has none;
//! - DAG-5: each index's grids hold exactly its entries' rectangles (write
//!   entries in one, read entries in the other), and every read entry is
//!   the one entry of its footprint;
//! - DAG-6: a buffer's user count equals the live nodes that touch it;
//! - DAG-8: a scope record's `held` count equals the buffers it holds, an
//!   ended record holds at least one (it goes with its last), and every
//!   held buffer of an ended scope has a live user (the others were
//!   released).

mod finish;
pub(crate) mod index;
mod invariants;
mod quarantine;
mod scope;
mod submit;

use rustc_hash::FxHashMap as HashMap;

use strata_wire::{ArgTag, CanonicalIdentity, Footprint, Overlap, Tensor};

use crate::ids::{ScopeId, TaskId};
use crate::outcome::CancelError;
use index::{BufferIndex, Kind};
pub use submit::{CheckedTask, SubmitError, SubmitReason};

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
    /// A buffer was registered in a scope while another scope holds it.
    #[error("the buffer is held by scope {}; a buffer belongs to one scope", .held.0)]
    HeldElsewhere {
        /// The scope asked to hold it.
        scope: ScopeId,
        /// The scope that holds it.
        held: ScopeId,
    },
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
    succs: Few<(TaskId, u8)>,
    entries: Few<(CanonicalIdentity, u64)>,
    buffers: Few<CanonicalIdentity>,
    /// Its arguments, kept (moved, not copied) for the rare loss: to
    /// quarantine its writes whole (later writes may have retired some of
    /// its entries) and to find the later tasks that touch them.
    members: Vec<Vec<Arg>>,
}

/// A node's edges, index entries and buffers: a few each for most tasks,
/// kept inline so that inserting a task allocates none of them.
type Few<T> = smallvec::SmallVec<[T; 4]>;

/// An open scope, or an ended one still holding buffers that live tasks
/// use: the record goes with its last buffer, so a long job of many
/// scopes keeps none of those that are done.
#[derive(Debug, Default)]
struct Scope {
    ended: bool,
    /// The buffers registered while it was open (emptied when it ends:
    /// those still held are found through `scope_of`).
    buffers: Vec<CanonicalIdentity>,
    /// Its buffers not yet released.
    held: usize,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DagStats {
    /// Tasks inserted.
    pub inserted: u64,
    /// Edges created (one per predecessor, whatever its kinds).
    pub edges: u64,
    /// Accesses retired because a newer write covered them (a read
    /// entry counts once per reader).
    pub retired: u64,
    /// Candidate entries the overlap engine confirmed.
    pub matches: u64,
}

/// The DAG builder.
#[derive(Debug, Default)]
pub struct Dag {
    last: Option<TaskId>,
    nodes: crate::ids::SeqMap<TaskId, Box<Node>>,
    index: HashMap<CanonicalIdentity, BufferIndex>,
    next_entry: u64,
    /// Tasks that failed, were skipped or cancelled, with the root cause.
    failed: HashMap<TaskId, TaskId>,
    users: HashMap<CanonicalIdentity, u32>,
    scopes: HashMap<ScopeId, Scope>,
    scope_of: HashMap<CanonicalIdentity, ScopeId>,
    next_scope: u64,
    stats: DagStats,
    /// Buffers for [`Dag::insert`], kept between calls so that the index
    /// queries of a task allocate nothing.
    scratch: Scratch,
}

/// What [`Dag::insert`] reuses.
#[derive(Debug, Default)]
struct Scratch {
    /// Index candidates (see [`BufferIndex::matches_into`]).
    candidates: Vec<u64>,
    /// Entries that share bytes with the access at hand.
    matches: Vec<(u64, Overlap)>,
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

    /// The submit-time checks of `task` that depend on nothing but the
    /// task itself (the rules in `submit.rs`, all but the increasing-id
    /// rule): made once, where the task is built; the [`CheckedTask`] is
    /// their proof, and [`Dag::insert`] takes it without checking again.
    ///
    /// # Errors
    /// [`SubmitError`] naming the member, argument and rule.
    pub fn check(task: NewTask) -> Result<CheckedTask, SubmitError> {
        submit::check(task)
    }

    /// [`Dag::check`], then [`Dag::insert`]: for a DAG used on its own.
    ///
    /// # Errors
    /// As the two.
    pub fn check_and_insert(&mut self, task: NewTask) -> Result<Inserted, SubmitError> {
        let checked = Dag::check(task)?;
        self.insert(checked)
    }

    /// Records a checked task and returns its edges. Only the rule that
    /// depends on the DAG is checked here: ids increase.
    ///
    /// # Errors
    /// [`SubmitError`] for an id not above every id inserted before;
    /// nothing is recorded then.
    pub fn insert(&mut self, task: CheckedTask) -> Result<Inserted, SubmitError> {
        submit::check_order(task.id(), self.last)?;
        let (task, prints) = task.into_parts();
        let mut scratch = std::mem::take(&mut self.scratch);
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
        for (arg, &fp) in task
            .members
            .iter()
            .flatten()
            .zip(prints.iter().flatten())
            .filter(|(a, _)| a.tag != ArgTag::NoDep)
        {
            let identity = *arg.tensor.identity();
            if let Some(idx) = self.index.get(&identity) {
                // A reader meets writers only; a writer, readers too.
                idx.matches_into(
                    &fp,
                    arg.tag.writes(),
                    &mut scratch.candidates,
                    &mut scratch.matches,
                );
                for &(entry_id, _) in &scratch.matches {
                    self.stats.matches += 1;
                    let Some(e) = idx.get(entry_id) else { continue };
                    if e.poisoned {
                        let writer = e.task();
                        if arg.tag.reads() && e.kind == Kind::Write {
                            skipped_by
                                .get_or_insert(self.failed.get(&writer).copied().unwrap_or(writer));
                        } else if arg.tag.writes() {
                            // A dead task's writes stand for the writes
                            // they retired: a writer orders after it. For
                            // quarantined bytes, a writer waits for the
                            // lost task's fence (or is refused once the
                            // fence was given up on).
                            match self.nodes.get(&writer).map(|n| n.state) {
                                Some(State::Lost { abandoned: false } | State::Dead) => {
                                    preds.push((writer, edge::WAW));
                                }
                                Some(State::Lost { abandoned: true }) => {
                                    quarantined_by.get_or_insert(writer);
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
                        // A writer after N readers of these bytes: N edges,
                        // once (the readers' entry goes if it covers them).
                        preds.extend(e.tasks.iter().map(|t| (t, kind)));
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
                preds.push((a, edge::EXPLICIT));
            } else if let Some(&root) = self.failed.get(&a) {
                skipped_by.get_or_insert(root);
            }
        }

        merge_edges(&mut preds);

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
                    idx.insert_write(entry, id, fp, true);
                }
            }
            self.failed.insert(id, root);
            self.scratch = scratch;
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
            succs: Few::new(),
            entries: Few::new(),
            buffers: Few::new(),
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
            let idx = self.index.entry(identity).or_default();
            if tag.writes() && whole {
                idx.matches_into(&fp, true, &mut scratch.candidates, &mut scratch.matches);
                scratch.matches.retain(|&(eid, rel)| {
                    rel == Overlap::Covers
                        && idx.get(eid).is_some_and(|e| {
                            // Not its own, nor a lost task's quarantine.
                            let lost = e.kind == Kind::Write
                                && matches!(
                                    self.nodes.get(&e.task()).map(|n| n.state),
                                    Some(State::Lost { .. })
                                );
                            !e.tasks.contains(id) && !lost
                        })
                });
                for &(eid, _) in &scratch.matches {
                    if let Some(e) = idx.remove(eid) {
                        self.stats.retired += e.tasks.len() as u64;
                        for t in e.tasks.iter() {
                            if let Some(owner) = self.nodes.get_mut(&t) {
                                owner
                                    .entries
                                    .retain(|&mut (i, x)| !(i == identity && x == eid));
                            }
                        }
                    }
                }
            }
            if tag.writes() {
                self.next_entry += 1;
                idx.insert_write(self.next_entry, id, fp, false);
                node.entries.push((identity, self.next_entry));
            } else {
                let next = &mut self.next_entry;
                let (entry, new) = idx.add_reader(id, fp, || {
                    *next += 1;
                    *next
                });
                if new {
                    node.entries.push((identity, entry));
                }
            }
        }
        node.members = task.members;
        self.scratch = scratch;
        let born = if node.unmet == 0 {
            Born::Ready
        } else {
            Born::Waiting
        };
        self.nodes.insert(id, Box::new(node));
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
            self.remove_entry(*identity, *entry, id);
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
}

/// One edge per predecessor, with the union of its kinds, in the order
/// they were found: a scan for the few edges of most tasks, a hash for a
/// writer after many readers (a scan per edge would be quadratic in them).
fn merge_edges(preds: &mut Vec<(TaskId, u8)>) {
    const SCAN: usize = 16;
    if preds.len() <= SCAN {
        let mut n = 0;
        for i in 0..preds.len() {
            let (p, kind) = preds[i];
            match preds[..n].iter_mut().find(|(q, _)| *q == p) {
                Some((_, k)) => *k |= kind,
                None => {
                    preds[n] = (p, kind);
                    n += 1;
                }
            }
        }
        preds.truncate(n);
        return;
    }
    let mut at: HashMap<TaskId, usize> = HashMap::default();
    at.reserve(preds.len());
    let mut n = 0;
    for i in 0..preds.len() {
        let (p, kind) = preds[i];
        match at.get(&p) {
            Some(&j) => preds[j].1 |= kind,
            None => {
                at.insert(p, n);
                preds[n] = (p, kind);
                n += 1;
            }
        }
    }
    preds.truncate(n);
}
