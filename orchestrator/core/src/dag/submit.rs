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
//! Members of a group are not compared with each other (DESIGN §4): a group
//! is one node, and every member naming one buffer as its output is how a
//! group publishes a single completion token for a downstream task.
//!
//! Views are in bounds by construction (`Tensor` is validated).

use strata_wire::{Footprint, MAX_SCALARS, MAX_TENSORS, Overlap};

use super::NewTask;
use crate::ids::TaskId;

/// Why a task was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{task}: {what}")]
pub struct SubmitError {
    /// The task.
    pub task: TaskId,
    /// What is wrong, naming the member and argument.
    pub what: String,
}

/// A task that passed the submit-time checks of the task alone. Only
/// [`super::Dag::check`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedTask(NewTask);

impl CheckedTask {
    /// The task.
    pub fn task(&self) -> &NewTask {
        &self.0
    }

    /// Its id.
    pub fn id(&self) -> TaskId {
        self.0.id
    }

    pub(super) fn into_inner(self) -> NewTask {
        self.0
    }
}

/// Rule 1: `id` comes after `last`.
pub(super) fn check_order(id: TaskId, last: Option<TaskId>) -> Result<(), SubmitError> {
    match last {
        Some(last) if id <= last => Err(SubmitError {
            task: id,
            what: format!("ids must increase: {last} was submitted already"),
        }),
        _ => Ok(()),
    }
}

/// Rules 2 to 5.
pub(super) fn check(task: NewTask) -> Result<CheckedTask, SubmitError> {
    check_alone(&task)?;
    Ok(CheckedTask(task))
}

fn check_alone(task: &NewTask) -> Result<(), SubmitError> {
    let bad = |what: String| SubmitError {
        task: task.id,
        what,
    };
    if task.members.is_empty() {
        return Err(bad("a task has at least one member".into()));
    }
    for (m, args) in task.members.iter().enumerate() {
        if args.len() > MAX_TENSORS {
            return Err(bad(format!(
                "member {m}: {} tensor arguments, at most {MAX_TENSORS}",
                args.len()
            )));
        }
        let scalars = task.scalars.get(m).copied().unwrap_or(0);
        if scalars > MAX_SCALARS {
            return Err(bad(format!(
                "member {m}: {scalars} scalars, at most {MAX_SCALARS}"
            )));
        }
        for (i, a) in args.iter().enumerate() {
            let grant = a.tensor.buffer().access();
            if a.tag.reads() && !grant.allows_read() {
                return Err(bad(format!(
                    "member {m} argument {i}: tagged {} but the buffer grants {}",
                    a.tag,
                    grant.name()
                )));
            }
            if a.tag.writes() && !grant.allows_write() {
                return Err(bad(format!(
                    "member {m} argument {i}: tagged {} but the buffer grants {}",
                    a.tag,
                    grant.name()
                )));
            }
        }
        let prints: Vec<Footprint> = args.iter().map(|a| Footprint::of(&a.tensor)).collect();
        for j in 0..args.len() {
            for i in 0..j {
                let writes = args[i].tag.writes() || args[j].tag.writes();
                if writes && prints[i].overlap(&prints[j]) != Overlap::Disjoint {
                    return Err(bad(format!(
                        "member {m}: arguments {i} ({}) and {j} ({}) share bytes and one of them is written",
                        args[i].tag, args[j].tag
                    )));
                }
            }
        }
    }
    for a in &task.after {
        if *a >= task.id {
            return Err(bad(format!(
                "after names {a}, which is not an earlier task"
            )));
        }
    }
    Ok(())
}
