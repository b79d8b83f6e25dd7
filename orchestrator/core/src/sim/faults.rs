//! Runs with faults: kernels that fail, a worker lost without a fence
//! whose tasks go on writing until the fence (or after it is given up
//! on), and the oracle such a run is checked against.

use std::collections::HashMap;

use strata_boundary::{FailureCause, FailureKind};
use strata_wire::check::Rng;
use strata_wire::{ArgTag, CanonicalIdentity};

use super::{Memory, Program, Writes, apply, assert_capable, compute, submission, worker_up};
use crate::dag::Arg;
use crate::engine::{Action, Engine, Event};
use crate::ids::{TaskId, WorkerId};
use crate::sched::Outcome;

/// What a run with faults ended with: the memory and every task's outcome.
#[derive(Debug, Clone)]
pub struct FaultRun {
    /// The buffers at the end.
    pub mem: Memory,
    /// How each task ended.
    pub outcomes: HashMap<TaskId, Outcome>,
    /// Tasks whose bytes were quarantined at some point.
    pub quarantined: usize,
    /// Whether the fence of the loss was given up on before it came.
    pub abandoned: bool,
}

/// The oracle for a run where some tasks did not succeed: the bytes of
/// running only the tasks that succeeded, one by one in submission order,
/// and per buffer which bytes that must match — those whose last writer in
/// submission order (over all tasks) succeeded, or that nobody writes.
/// Bytes last written by a task that failed, was skipped or was lost hold
/// whatever it left: sequential semantics say nothing about them.
///
/// # Panics
/// When a view is too large for the byte-set oracle (the generator's are
/// not).
pub fn oracle_after_faults(
    p: &Program,
    succeeded: &dyn Fn(TaskId) -> bool,
) -> (Memory, HashMap<CanonicalIdentity, Vec<bool>>) {
    let mut mem = p.initial.clone();
    let mut defined: HashMap<CanonicalIdentity, Vec<bool>> = p
        .initial
        .iter()
        .map(|(id, bytes)| (*id, vec![true; bytes.len()]))
        .collect();
    for t in &p.tasks {
        let ok = succeeded(t.id);
        for m in &t.members {
            if ok {
                let w = compute(t.id, m, &mem);
                apply(&w, &mut mem);
            }
            for a in m.iter().filter(|a| a.tag.writes()) {
                let bytes = strata_wire::check::byte_set(&a.tensor).expect("small views");
                // A sub-byte (FP4) write may leave the other nibble to an
                // earlier writer: it never makes a byte defined.
                let whole = a.tensor.dtype().bits() >= 8;
                if let Some(d) = defined.get_mut(a.tensor.identity()) {
                    for b in bytes {
                        if let Some(slot) = usize::try_from(b).ok().and_then(|b| d.get_mut(b)) {
                            *slot = ok && (whole || *slot);
                        }
                    }
                }
            }
        }
    }
    (mem, defined)
}

/// Compares a faulty run with [`oracle_after_faults`].
///
/// # Errors
/// The first byte that differs where it must not, naming the buffer.
pub fn check_after_faults(
    p: &Program,
    got: &Memory,
    succeeded: &dyn Fn(TaskId) -> bool,
) -> Result<usize, String> {
    let (want, defined) = oracle_after_faults(p, succeeded);
    let mut checked = 0usize;
    for (id, bytes) in &want {
        let g = got
            .get(id)
            .ok_or_else(|| format!("buffer {id} is missing"))?;
        let d = &defined[id];
        for (i, (w, x)) in bytes.iter().zip(g).enumerate() {
            if d[i] {
                checked += 1;
                if w != x {
                    return Err(format!(
                        "buffer {id} byte {i}: {x:#04x}, sequential execution of the tasks \
                         that succeeded gives {w:#04x}"
                    ));
                }
            }
        }
    }
    Ok(checked)
}

/// Runs `p` like [`super::run_engine`], with faults: about one task in 30 fails
/// in its kernel, and worker 0 is lost without a fence part-way through.
/// The tasks it was running go on writing — part of their writes land
/// later, the rest later still — until the fence, which comes after all
/// of them (a worker that proved its tasks ended); sometimes the fence is
/// first given up on, and the late writes land after that. Worker 0 comes
/// back up at some point and takes work again. On half the runs the loss
/// is a timeout's: one member in flight there is reported
/// [`Event::TimedOut`] first (as an endpoint does), and must end with
/// TASK_FAILURE (its own cause for a plain task), never succeed.
///
/// # Panics
/// When the engine refuses a task or a task never ends.
pub fn run_engine_with_faults(p: &Program, workers: u32, rng: &mut Rng) -> FaultRun {
    let mut engine = Engine::with_policy(super::any_policy(rng));
    let workers = workers.max(2).max(
        p.tasks
            .iter()
            .map(|t| t.members.len() as u32)
            .max()
            .unwrap_or(1),
    );
    let mut pending = Vec::new();
    for w in 0..workers {
        pending.extend(engine.on_event(worker_up(w, workers, rng.range(1, 4) as usize)));
    }
    let members: HashMap<TaskId, Vec<Vec<Arg>>> =
        p.tasks.iter().map(|t| (t.id, t.members.clone())).collect();
    let mut mem = p.initial.clone();
    // (task, member, worker, writes)
    let mut in_flight: Vec<(TaskId, usize, WorkerId, Writes)> = Vec::new();
    let mut outcomes: HashMap<TaskId, Outcome> = HashMap::new();
    let mut quarantined = 0usize;
    let mut late: Vec<Writes> = Vec::new();
    let loss_at = rng.range(1, p.tasks.len() as u32 / 2 + 2) as usize;
    let mut lost = false;
    let mut fenced = false;
    let mut back = false;
    let mut abandoned = false;
    let mut timed_out: Option<(TaskId, bool)> = None;
    let fail_rate = 30;
    let mut next = 0usize;
    let mut steps = 0usize;
    let handle = |actions: Vec<Action>,
                  mem: &Memory,
                  in_flight: &mut Vec<(TaskId, usize, WorkerId, Writes)>,
                  outcomes: &mut HashMap<TaskId, Outcome>,
                  quarantined: &mut usize| {
        for a in actions {
            match a {
                Action::Dispatch {
                    task,
                    member,
                    worker,
                    ..
                } => {
                    assert_capable(task, member, &members[&task], worker, workers);
                    let w = compute(task, &members[&task][member], mem);
                    in_flight.push((task, member, worker, w));
                }
                Action::Done { task, outcome } => {
                    assert!(
                        outcomes.insert(task, outcome).is_none(),
                        "{task} finished twice"
                    );
                }
                Action::Quarantined { .. } => *quarantined += 1,
                Action::Release(_) | Action::Lifted { .. } | Action::Accepted { .. } => {}
                Action::Refused(r) => panic!("refused: {r}"),
                Action::ScopeOpened(_) => unreachable!("the run opens no scope"),
            }
        }
    };
    handle(
        std::mem::take(&mut pending),
        &mem,
        &mut in_flight,
        &mut outcomes,
        &mut quarantined,
    );
    while outcomes.len() < p.tasks.len() || (!fenced && lost) {
        steps += 1;
        assert!(steps < 1_000_000, "the run does not end");
        let submitted = next;
        let actions = if !lost && submitted >= loss_at {
            lost = true;
            // Its in-flight members keep running: their writes land late.
            let (gone, stay): (Vec<_>, Vec<_>) =
                in_flight.drain(..).partition(|m| m.2 == WorkerId(0));
            in_flight = stay;
            let mut actions = Vec::new();
            if let Some(m) = gone.first().filter(|_| rng.range(0, 2) == 0) {
                timed_out = Some((m.0, members[&m.0].len() == 1));
                actions.extend(engine.on_event(Event::TimedOut {
                    task: m.0,
                    member: m.1,
                    cause: "timed out".into(),
                }));
            }
            late = gone.into_iter().map(|m| m.3).collect();
            actions.extend(engine.on_event(Event::WorkerLost {
                worker: WorkerId(0),
                cause: "stopped".into(),
                fenced: false,
            }));
            actions
        } else if lost && !fenced && rng.range(0, 8) == 0 {
            // Part of a late write lands.
            if let Some(w) = late.pop() {
                let cut = rng.range(0, w.0.len() as u32) as usize;
                apply(&Writes(w.0[..cut].to_vec()), &mut mem);
                late.push(Writes(w.0[cut..].to_vec()));
                if cut == 0 {
                    apply(&late.pop().unwrap_or(Writes(Vec::new())), &mut mem);
                }
            }
            Vec::new()
        } else if lost && !fenced && !abandoned && rng.range(0, 40) == 0 {
            abandoned = true;
            engine.on_event(Event::Abandoned {
                worker: WorkerId(0),
                epoch: 1,
                why: "gave up".into(),
            })
        } else if lost && !fenced && late.is_empty() && rng.range(0, 10) == 0 {
            fenced = true;
            engine.on_event(Event::Fenced {
                worker: WorkerId(0),
                epoch: 1,
            })
        } else if lost && !back && rng.range(0, 20) == 0 {
            back = true;
            engine.on_event(worker_up(0, workers, 2))
        } else if next < p.tasks.len() && (in_flight.is_empty() || rng.range(0, 2) > 0) {
            let t = &p.tasks[next];
            next += 1;
            let retry = rng.range(0, 4) == 0
                && t.members.len() == 1
                && t.members[0]
                    .iter()
                    .all(|a| !matches!(a.tag, ArgTag::InOut | ArgTag::NoDep));
            engine.on_event(submission(t, u32::from(retry)))
        } else if !in_flight.is_empty() {
            let i = (rng.next_u64() % in_flight.len() as u64) as usize;
            let (task, member, _, writes) = in_flight.swap_remove(i);
            let result = if rng.range(0, fail_rate) == 0 {
                Err(FailureCause::new(FailureKind::Kernel, "kernel failed"))
            } else {
                apply(&writes, &mut mem);
                super::observe(&mut engine, task, member, rng);
                Ok(())
            };
            engine.on_event(Event::Finished {
                task,
                member,
                result,
            })
        } else {
            Vec::new()
        };
        handle(
            actions,
            &mem,
            &mut in_flight,
            &mut outcomes,
            &mut quarantined,
        );
    }
    engine.dag().check_invariants().expect("dag invariants");
    engine
        .scheduler()
        .check_invariants()
        .expect("scheduler invariants");
    assert_eq!(engine.dag().live(), 0, "tasks left in the DAG");
    if let Some((task, plain)) = timed_out {
        let outcome = &outcomes[&task];
        assert!(
            matches!(outcome, Outcome::TaskFailure(c)
                if !plain || (c.kind == FailureKind::TimedOut && c.message == "timed out")),
            "timed-out {task} ended {outcome:?}"
        );
    }
    FaultRun {
        mem,
        outcomes,
        quarantined,
        abandoned,
    }
}
