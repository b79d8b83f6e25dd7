//! Submit-time checks: refused before anything is recorded.
//!
//! All but the first depend on the task alone and are made once, by
//! [`check`] (what [`super::Dag::check`] runs where the task is built);
//! the only proof that they passed is a [`CheckedTask`], which nothing
//! else can make, so the DAG inserts one without checking it again. The
//! first depends on the DAG and is all [`super::Dag::insert`] checks.
//!
//! 1. ids increase (submission order);
//! 2. at most 256 tensors and 128 scalars per member, at least one member;
//! 3. every tag that reads needs a grant that allows reading, every tag that
//!    writes (OUTPUT included) one that allows writing;
//! 4. within a member, two arguments that share a byte where either writes
//!    are refused, whatever their order;
//! 5. `after` may only name earlier tasks.
//!
//! Members of a group are not compared with each other (docs/scheduling.md#submitting-check-then-insert): a group
//! is one node, and every member naming one buffer as its output is how a
//! group publishes a single completion token for a downstream task.
//!
//! Views are in bounds by construction (`Tensor` is validated).

use strata_wire::{Access, ArgTag, Footprint, MAX_SCALARS, MAX_TENSORS, Overlap};

use super::NewTask;
use crate::ids::TaskId;
use crate::outcome::PlacementError;

/// Why a task was refused: the task and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{task}: {reason}")]
pub struct SubmitError {
    /// The task.
    pub task: TaskId,
    /// The rule it breaks, naming the member and argument.
    pub reason: SubmitReason,
}

/// The submit-time rule a task breaks (module docs list them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitReason {
    /// Rule 1: its id is not above the last one submitted.
    #[error("ids must increase: {last} was submitted already")]
    IdsMustIncrease {
        /// The last task submitted.
        last: TaskId,
    },
    /// Rule 2: a task without members.
    #[error("a task has at least one member")]
    NoMembers,
    /// Rule 2: too many tensor arguments in one member.
    #[error("member {member}: {count} tensor arguments, at most {MAX_TENSORS}")]
    TooManyTensors {
        /// The member.
        member: usize,
        /// Its tensor arguments.
        count: usize,
    },
    /// Rule 2: too many scalars in one member.
    #[error("member {member}: {count} scalars, at most {MAX_SCALARS}")]
    TooManyScalars {
        /// The member.
        member: usize,
        /// Its scalars.
        count: usize,
    },
    /// Rule 3: the tag reads or writes what the view's grant does not allow.
    #[error("member {member} argument {arg}: tagged {tag} but the buffer grants {}", .granted.name())]
    NotGranted {
        /// The member.
        member: usize,
        /// The argument.
        arg: usize,
        /// Its tag.
        tag: ArgTag,
        /// What its view grants.
        granted: Access,
    },
    /// Rule 4: two arguments of one member share a byte and one writes it.
    #[error(
        "member {member}: arguments {first} ({first_tag}) and {second} ({second_tag}) share bytes and one of them is written"
    )]
    Aliased {
        /// The member.
        member: usize,
        /// The earlier argument.
        first: usize,
        /// Its tag.
        first_tag: ArgTag,
        /// The later argument.
        second: usize,
        /// Its tag.
        second_tag: ArgTag,
    },
    /// Rule 5: an `after` edge to a task that is not earlier.
    #[error("after names {after}, which is not an earlier task")]
    AfterNotEarlier {
        /// The task named.
        after: TaskId,
    },
    /// The engine was given a placement per member, but not as many.
    #[error("{placements} member placements for {members} members")]
    PlacementCount {
        /// Placements given.
        placements: usize,
        /// Members of the task.
        members: usize,
    },
    /// The scheduler cannot place it.
    #[error(transparent)]
    Unplaceable(#[from] PlacementError),
}

/// A task that passed the submit-time checks of the task alone, with the
/// footprint of every argument the checks computed (per member, per
/// argument), which [`super::Dag::insert`] uses instead of computing them
/// again: the checks run on the submitting thread, the insert on the
/// engine's. Only [`super::Dag::check`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedTask {
    task: NewTask,
    prints: Vec<Vec<Footprint>>,
}

impl CheckedTask {
    /// The task.
    pub fn task(&self) -> &NewTask {
        &self.task
    }

    /// Its id.
    pub fn id(&self) -> TaskId {
        self.task.id
    }

    /// The task and its arguments' footprints, member by member.
    pub(super) fn into_parts(self) -> (NewTask, Vec<Vec<Footprint>>) {
        (self.task, self.prints)
    }
}

/// Rule 1: `id` comes after `last`.
pub(super) fn check_order(id: TaskId, last: Option<TaskId>) -> Result<(), SubmitError> {
    match last {
        Some(last) if id <= last => Err(SubmitError {
            task: id,
            reason: SubmitReason::IdsMustIncrease { last },
        }),
        _ => Ok(()),
    }
}

/// Rules 2 to 5.
pub(super) fn check(task: NewTask) -> Result<CheckedTask, SubmitError> {
    let prints = check_alone(&task)?;
    Ok(CheckedTask { task, prints })
}

/// The checks; on success, the footprints of every member's arguments.
fn check_alone(task: &NewTask) -> Result<Vec<Vec<Footprint>>, SubmitError> {
    let bad = |reason: SubmitReason| SubmitError {
        task: task.id,
        reason,
    };
    if task.members.is_empty() {
        return Err(bad(SubmitReason::NoMembers));
    }
    let mut all = Vec::with_capacity(task.members.len());
    for (m, args) in task.members.iter().enumerate() {
        if args.len() > MAX_TENSORS {
            return Err(bad(SubmitReason::TooManyTensors {
                member: m,
                count: args.len(),
            }));
        }
        let scalars = task.scalars.get(m).copied().unwrap_or(0);
        if scalars > MAX_SCALARS {
            return Err(bad(SubmitReason::TooManyScalars {
                member: m,
                count: scalars,
            }));
        }
        for (i, a) in args.iter().enumerate() {
            let grant = a.tensor.buffer().access();
            if (a.tag.reads() && !grant.allows_read()) || (a.tag.writes() && !grant.allows_write())
            {
                return Err(bad(SubmitReason::NotGranted {
                    member: m,
                    arg: i,
                    tag: a.tag,
                    granted: grant,
                }));
            }
        }
        let prints: Vec<Footprint> = args.iter().map(|a| Footprint::of(&a.tensor)).collect();
        for j in 0..args.len() {
            for i in 0..j {
                let writes = args[i].tag.writes() || args[j].tag.writes();
                if writes && prints[i].overlap(&prints[j]) != Overlap::Disjoint {
                    return Err(bad(SubmitReason::Aliased {
                        member: m,
                        first: i,
                        first_tag: args[i].tag,
                        second: j,
                        second_tag: args[j].tag,
                    }));
                }
            }
        }
        all.push(prints);
    }
    for a in &task.after {
        if *a >= task.id {
            return Err(bad(SubmitReason::AfterNotEarlier { after: *a }));
        }
    }
    Ok(all)
}
