//! The cores' behaviour, one rule at a time.

use strata_boundary::{BackendKinds, DTypeSet, Features};
use strata_orchestrator_core::dag::{Arg, Born, NewTask, Transition, edge};
use strata_orchestrator_core::engine::{Action, Event, Submission};
use strata_orchestrator_core::sched::{MemberInfo, Outcome, Placement};
use strata_orchestrator_core::{
    Capabilities, Dag, Engine, FailureCause, FailureKind, KernelHandle, Loss, PlacementError,
    Refusal, ScopeError, SubmitReason, TaskId, WorkerId,
};
use strata_wire::{
    Access, AddressSpace, ArgTag, BackendKind, Backing, BufferDescriptor, CanonicalIdentity, DType,
    Tensor,
};

fn buffer(id: u64, access: Access) -> BufferDescriptor {
    let identity = CanonicalIdentity::new(*b"coretest", id, 1).unwrap();
    BufferDescriptor::new(
        identity,
        1024,
        AddressSpace::Host,
        access,
        Backing::Memfd {
            st_dev: 0,
            st_ino: id,
        },
    )
    .unwrap()
}

/// Row `r` (16 bytes) of a 64×16 U8 buffer.
fn row(b: BufferDescriptor, r: u64) -> Tensor {
    Tensor::new(b, r * 16, &[16], &[1], DType::U8).unwrap()
}

fn rows(b: BufferDescriptor, r0: u64, n: u32) -> Tensor {
    Tensor::new(b, r0 * 16, &[n, 16], &[16, 1], DType::U8).unwrap()
}

fn task(id: u64, args: &[(Tensor, ArgTag)]) -> NewTask {
    NewTask::single(
        TaskId(id),
        args.iter()
            .map(|&(tensor, tag)| Arg { tensor, tag })
            .collect(),
    )
}

fn preds(dag: &mut Dag, t: NewTask) -> Vec<(u64, u8)> {
    let mut e: Vec<(u64, u8)> = dag
        .check_and_insert(t)
        .unwrap()
        .edges
        .into_iter()
        .map(|(p, k)| (p.0, k))
        .collect();
    e.sort_unstable();
    e
}

#[test]
fn raw_waw_war_and_output_orders_after_readers() {
    let b = buffer(1, Access::ReadWrite);
    let mut dag = Dag::new();
    assert_eq!(
        preds(&mut dag, task(1, &[(row(b, 0), ArgTag::Output)])),
        vec![]
    );
    assert_eq!(
        preds(&mut dag, task(2, &[(row(b, 0), ArgTag::Input)])),
        vec![(1, edge::RAW)]
    );
    assert_eq!(
        preds(&mut dag, task(3, &[(row(b, 0), ArgTag::Input)])),
        vec![(1, edge::RAW)],
        "readers do not order among themselves"
    );
    // OUTPUT orders after the earlier writer and both readers.
    assert_eq!(
        preds(&mut dag, task(4, &[(row(b, 0), ArgTag::Output)])),
        vec![(1, edge::WAW), (2, edge::WAR), (3, edge::WAR)]
    );
    // The new write covered them all: a reader now meets only task 4.
    assert_eq!(
        preds(&mut dag, task(5, &[(row(b, 0), ArgTag::Input)])),
        vec![(4, edge::RAW)]
    );
    assert_eq!(
        preds(&mut dag, task(6, &[(row(b, 0), ArgTag::OutputExisting)])),
        vec![(4, edge::WAW), (5, edge::WAR)]
    );
    assert_eq!(
        preds(&mut dag, task(7, &[(row(b, 0), ArgTag::InOut)])),
        vec![(6, edge::RAW | edge::WAW)]
    );
    // Other rows and other buffers: no edges. NO_DEP: no edges either way.
    assert_eq!(
        preds(&mut dag, task(8, &[(row(b, 1), ArgTag::InOut)])),
        vec![]
    );
    assert_eq!(
        preds(
            &mut dag,
            task(9, &[(row(buffer(2, Access::ReadWrite), 0), ArgTag::InOut)])
        ),
        vec![]
    );
    assert_eq!(
        preds(&mut dag, task(10, &[(row(b, 0), ArgTag::NoDep)])),
        vec![]
    );
    // A partial write does not retire: a reader of both rows meets 7 and 8.
    assert_eq!(
        preds(&mut dag, task(11, &[(rows(b, 0, 2), ArgTag::Input)])),
        vec![(7, edge::RAW), (8, edge::RAW)]
    );
    // Explicit edges.
    let mut t = task(12, &[(row(b, 5), ArgTag::Input)]);
    t.after = vec![TaskId(9)];
    assert_eq!(preds(&mut dag, t), vec![(9, edge::EXPLICIT)]);
    dag.check_invariants().unwrap();
    assert_eq!(
        dag.stats().retired,
        6,
        "4 retires 1-3, 6 retires 4-5, 7 retires 6"
    );
}

#[test]
fn completion_releases_and_leaves_the_index() {
    let b = buffer(1, Access::ReadWrite);
    let mut dag = Dag::new();
    dag.check_and_insert(task(1, &[(row(b, 0), ArgTag::Output)]))
        .unwrap();
    assert_eq!(
        dag.check_and_insert(task(2, &[(row(b, 0), ArgTag::Input)]))
            .unwrap()
            .born,
        Born::Waiting
    );
    assert_eq!(
        dag.check_and_insert(task(3, &[(row(b, 1), ArgTag::Input)]))
            .unwrap()
            .born,
        Born::Ready
    );
    assert_eq!(
        dag.complete(TaskId(1)).unwrap(),
        vec![Transition::Ready(TaskId(2))]
    );
    assert!(dag.complete(TaskId(1)).is_err(), "not live any more");
    dag.complete(TaskId(2)).unwrap();
    dag.complete(TaskId(3)).unwrap();
    assert_eq!((dag.live(), dag.entries()), (0, 0));
    // A finished writer adds no edge.
    assert_eq!(
        dag.check_and_insert(task(4, &[(row(b, 0), ArgTag::Input)]))
            .unwrap()
            .edges,
        vec![]
    );
}

#[test]
fn failure_skips_data_consumers_and_poisons_later_readers() {
    let b = buffer(1, Access::ReadWrite);
    let mut dag = Dag::new();
    dag.check_and_insert(task(1, &[(row(b, 0), ArgTag::Output)]))
        .unwrap();
    dag.check_and_insert(task(
        2,
        &[(row(b, 0), ArgTag::Input), (row(b, 1), ArgTag::Output)],
    ))
    .unwrap(); // RAW on 1
    dag.check_and_insert(task(3, &[(row(b, 1), ArgTag::Input)]))
        .unwrap(); // RAW on 2
    dag.check_and_insert(task(4, &[(rows(b, 0, 1), ArgTag::OutputExisting)]))
        .unwrap(); // WAW on 1, WAR on 2
    dag.start(TaskId(1)).unwrap();
    let t = dag.fail(TaskId(1)).unwrap();
    assert!(t.contains(&Transition::Skipped {
        task: TaskId(2),
        because: TaskId(1)
    }));
    assert!(
        t.contains(&Transition::Skipped {
            task: TaskId(3),
            because: TaskId(1)
        }),
        "transitively"
    );
    assert!(
        t.contains(&Transition::Ready(TaskId(4))),
        "a write after the failed write only needed ordering"
    );
    // Task 4 rewrites row 0 and runs; a reader of row 1 (written by the
    // skipped task 2) is skipped at once, a reader of row 0 is not.
    dag.complete(TaskId(4)).unwrap();
    assert_eq!(
        dag.check_and_insert(task(5, &[(row(b, 1), ArgTag::Input)]))
            .unwrap()
            .born,
        Born::Skipped { because: TaskId(1) }
    );
    assert_eq!(
        dag.check_and_insert(task(6, &[(row(b, 0), ArgTag::Input)]))
            .unwrap()
            .born,
        Born::Ready
    );
    // A write covering the poisoned row cleans it.
    dag.check_and_insert(task(7, &[(row(b, 1), ArgTag::Output)]))
        .unwrap();
    assert_eq!(
        dag.check_and_insert(task(8, &[(row(b, 1), ArgTag::Input)]))
            .unwrap()
            .born,
        Born::Waiting
    );
    // Explicit edges to a failed task skip too.
    let mut t = task(9, &[(row(b, 9), ArgTag::Input)]);
    t.after = vec![TaskId(2)];
    assert_eq!(
        dag.check_and_insert(t).unwrap().born,
        Born::Skipped { because: TaskId(1) }
    );
    dag.check_invariants().unwrap();
}

#[test]
fn cancel_only_before_running() {
    let b = buffer(1, Access::ReadWrite);
    let mut dag = Dag::new();
    dag.check_and_insert(task(1, &[(row(b, 0), ArgTag::Output)]))
        .unwrap();
    dag.check_and_insert(task(2, &[(row(b, 0), ArgTag::Input)]))
        .unwrap();
    dag.start(TaskId(1)).unwrap();
    let e = dag.cancel(TaskId(1)).unwrap_err();
    assert_eq!(e, strata_orchestrator_core::CancelError::Running(TaskId(1)));
    assert!(e.to_string().contains("already running"));
    let t = dag.cancel(TaskId(2)).unwrap();
    assert!(t.is_empty());
    assert!(dag.cancel(TaskId(2)).is_err());
    dag.complete(TaskId(1)).unwrap();
    assert_eq!(dag.live(), 0);
}

#[test]
fn submit_checks_refuse_before_recording() {
    let b = buffer(1, Access::ReadWrite);
    let ro = buffer(2, Access::Read);
    let wo = buffer(3, Access::Write);
    let mut dag = Dag::new();
    let err = |dag: &mut Dag, t: NewTask| dag.check_and_insert(t).unwrap_err().to_string();
    assert!(
        err(&mut dag, task(1, &[(row(ro, 0), ArgTag::Output)]))
            .contains("tagged OUTPUT but the buffer grants READ")
    );
    assert!(
        err(&mut dag, task(1, &[(row(wo, 0), ArgTag::InOut)]))
            .contains("tagged INOUT but the buffer grants WRITE")
    );
    assert!(err(&mut dag, task(1, &[(row(wo, 0), ArgTag::Input)])).contains("grants WRITE"));
    // Overlapping arguments where one writes, in either order.
    for (first, second) in [
        (ArgTag::Input, ArgTag::Output),
        (ArgTag::Output, ArgTag::Input),
    ] {
        let e = err(
            &mut dag,
            task(1, &[(rows(b, 0, 2), first), (row(b, 1), second)]),
        );
        assert!(
            e.contains("arguments 0") && e.contains("share bytes"),
            "{e}"
        );
    }
    // Two reads of the same bytes are fine.
    dag.check_and_insert(task(
        1,
        &[(rows(b, 0, 2), ArgTag::Input), (row(b, 1), ArgTag::Input)],
    ))
    .unwrap();
    assert!(err(&mut dag, task(1, &[])).contains("ids must increase"));
    let mut t = task(5, &[]);
    t.after = vec![TaskId(5)];
    assert!(err(&mut dag, t).contains("not an earlier task"));
    let too_many: Vec<(Tensor, ArgTag)> = (0..257).map(|_| (row(b, 3), ArgTag::Input)).collect();
    assert!(err(&mut dag, task(6, &too_many)).contains("257 tensor arguments"));
    let mut t = task(7, &[]);
    t.scalars = vec![129];
    assert!(err(&mut dag, t).contains("129 scalars"));
    assert_eq!(dag.live(), 1, "nothing refused was recorded");
    // Group members are not compared: several may write the same bytes
    // (the group's completion token).
    let g = NewTask {
        id: TaskId(8),
        members: vec![
            vec![Arg {
                tensor: row(b, 4),
                tag: ArgTag::Output,
            }],
            vec![Arg {
                tensor: row(b, 4),
                tag: ArgTag::Output,
            }],
        ],
        scalars: vec![0, 0],
        after: vec![],
    };
    dag.check_and_insert(g).unwrap();
    assert_eq!(dag.live(), 2);
}

#[test]
fn scopes_release_when_ended_and_unused() {
    let b = buffer(1, Access::ReadWrite);
    let c = buffer(2, Access::ReadWrite);
    let mut dag = Dag::new();
    let s = dag.open_scope();
    dag.scope_buffer(s, *b.identity()).unwrap();
    dag.scope_buffer(s, *c.identity()).unwrap();
    dag.check_and_insert(task(1, &[(row(b, 0), ArgTag::Output)]))
        .unwrap();
    assert_eq!(
        dag.end_scope(s).unwrap(),
        vec![Transition::Release(*c.identity())],
        "c is unused"
    );
    assert!(dag.scope_buffer(s, *c.identity()).is_err());
    assert_eq!(
        dag.complete(TaskId(1)).unwrap(),
        vec![Transition::Release(*b.identity())]
    );
}

#[test]
fn an_ended_scope_is_forgotten_with_its_last_buffer() {
    let mut dag = Dag::new();
    // Many scopes, each with a buffer a task uses past the scope's end:
    // the records go as the tasks finish, so a long job keeps none.
    for i in 0..1_000u64 {
        let b = buffer(i + 10, Access::ReadWrite);
        let s = dag.open_scope();
        dag.scope_buffer(s, *b.identity()).unwrap();
        dag.scope_buffer(s, *b.identity()).unwrap();
        dag.check_and_insert(task(i + 1, &[(row(b, 0), ArgTag::Output)]))
            .unwrap();
        assert_eq!(dag.end_scope(s).unwrap(), vec![], "its task still uses it");
        assert_eq!(dag.scopes(), 1);
        assert_eq!(
            dag.complete(TaskId(i + 1)).unwrap(),
            vec![Transition::Release(*b.identity())],
            "registered twice in one scope, released once"
        );
        assert_eq!(dag.scopes(), 0, "the record went with its last buffer");
        dag.check_invariants().unwrap();
        // Its id still answers as an ended scope, not an unknown one.
        assert_eq!(dag.end_scope(s), Err(ScopeError::AlreadyEnded(s)));
        assert_eq!(
            dag.scope_buffer(s, *buffer(5_000, Access::ReadWrite).identity()),
            Err(ScopeError::Ended(s))
        );
    }
    let empty = dag.open_scope();
    assert_eq!(dag.end_scope(empty).unwrap(), vec![]);
    assert_eq!(dag.scopes(), 0, "an empty scope goes when it ends");
    let never = strata_orchestrator_core::ScopeId(empty.0 + 1);
    assert_eq!(dag.end_scope(never), Err(ScopeError::Unknown(never)));
}

#[test]
fn a_buffer_belongs_to_one_scope() {
    let b = buffer(1, Access::ReadWrite);
    let mut dag = Dag::new();
    let (s, t) = (dag.open_scope(), dag.open_scope());
    dag.scope_buffer(s, *b.identity()).unwrap();
    assert_eq!(
        dag.scope_buffer(t, *b.identity()),
        Err(ScopeError::HeldElsewhere { scope: t, held: s })
    );
    assert_eq!(dag.end_scope(t).unwrap(), vec![]);
    assert_eq!(
        dag.end_scope(s).unwrap(),
        vec![Transition::Release(*b.identity())]
    );
    dag.check_invariants().unwrap();
}

const K: KernelHandle = KernelHandle([1; 16]);
const OTHER: KernelHandle = KernelHandle([2; 16]);

fn submission(id: u64, args: &[(Tensor, ArgTag)], placement: Placement) -> Sub {
    Sub {
        task: task(id, args),
        members: vec![MemberInfo {
            callable: K,
            placement,
            device_buffers: vec![],
            needs: Capabilities::NONE,
            work: Default::default(),
        }],
        retries: 0,
    }
}

/// Every kind, dtype and feature: what the tests' workers have unless one
/// says otherwise.
fn everything() -> Capabilities {
    Capabilities {
        backends: BackendKinds::of(BackendKind::ALL),
        dtypes: DTypeSet::ALL,
        features: Features::KNOWN,
    }
}

/// `s`, allowed to run again elsewhere up to `n` times.
fn retrying(mut s: Sub, n: u32) -> Sub {
    s.retries = n;
    s
}

/// A submission as these tests write it: the task unchecked, checked on
/// its way in as a driver checks it.
struct Sub {
    task: NewTask,
    members: Vec<MemberInfo>,
    retries: u32,
}

/// The engine driven through its one door, [`Engine::on_event`], in the
/// shapes these tests read best.
trait Drive {
    fn submit(&mut self, s: Sub) -> Result<Vec<Action>, Refusal>;
    fn cancel(&mut self, task: TaskId) -> Result<Vec<Action>, Refusal>;
    fn worker_up(
        &mut self,
        worker: WorkerId,
        callables: impl IntoIterator<Item = KernelHandle>,
        window: usize,
    ) -> Vec<Action> {
        self.worker_up_with(worker, callables, everything(), window)
    }
    fn worker_up_with(
        &mut self,
        worker: WorkerId,
        callables: impl IntoIterator<Item = KernelHandle>,
        capabilities: Capabilities,
        window: usize,
    ) -> Vec<Action>;
    fn worker_lost(&mut self, worker: WorkerId, cause: &str, fenced: bool) -> Vec<Action>;
    fn finished(&mut self, task: TaskId, member: usize, result: Result<(), String>) -> Vec<Action>;
    fn fence(&mut self, worker: WorkerId, epoch: u64) -> Vec<Action>;
    fn abandon(&mut self, worker: WorkerId, epoch: u64, why: &str) -> Vec<Action>;
    fn device_buffer(&mut self, worker: WorkerId, identity: CanonicalIdentity, present: bool);
}

/// An answer without its `Accepted` (these tests read edges from the
/// DAG), or the refusal it holds.
fn answer(mut actions: Vec<Action>) -> Result<Vec<Action>, Refusal> {
    match actions.first() {
        Some(Action::Refused(r)) => Err(r.clone()),
        Some(Action::Accepted { .. }) => {
            actions.remove(0);
            Ok(actions)
        }
        _ => Ok(actions),
    }
}

impl Drive for Engine {
    fn submit(&mut self, s: Sub) -> Result<Vec<Action>, Refusal> {
        let task = Dag::check(s.task)?;
        answer(self.on_event(Event::Submit(Submission {
            task,
            members: s.members,
            retries: s.retries,
        })))
    }
    fn cancel(&mut self, task: TaskId) -> Result<Vec<Action>, Refusal> {
        answer(self.on_event(Event::Cancel(task)))
    }
    fn worker_up_with(
        &mut self,
        worker: WorkerId,
        callables: impl IntoIterator<Item = KernelHandle>,
        capabilities: Capabilities,
        window: usize,
    ) -> Vec<Action> {
        self.on_event(Event::WorkerUp {
            worker,
            callables: callables.into_iter().collect(),
            capabilities,
            window,
        })
    }
    fn worker_lost(&mut self, worker: WorkerId, cause: &str, fenced: bool) -> Vec<Action> {
        self.on_event(Event::WorkerLost {
            worker,
            cause: cause.into(),
            fenced,
        })
    }
    /// A member's report; an error is the kernel's.
    fn finished(&mut self, task: TaskId, member: usize, result: Result<(), String>) -> Vec<Action> {
        self.on_event(Event::Finished {
            task,
            member,
            result: result.map_err(|m| FailureCause::new(FailureKind::Kernel, m)),
        })
    }
    fn fence(&mut self, worker: WorkerId, epoch: u64) -> Vec<Action> {
        self.on_event(Event::Fenced { worker, epoch })
    }
    fn abandon(&mut self, worker: WorkerId, epoch: u64, why: &str) -> Vec<Action> {
        self.on_event(Event::Abandoned {
            worker,
            epoch,
            why: why.into(),
        })
    }
    fn device_buffer(&mut self, worker: WorkerId, identity: CanonicalIdentity, present: bool) {
        self.on_event(Event::DeviceBuffer {
            worker,
            identity,
            present,
        });
    }
}

fn dispatched(actions: &[Action]) -> Vec<(u64, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch { task, worker, .. } => Some((task.0, worker.0)),
            _ => None,
        })
        .collect()
}

#[test]
fn placement_windows_and_directed_tasks() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 1);
    e.worker_up(WorkerId(1), [K, OTHER], 2);
    let mut all = Vec::new();
    for i in 0..5 {
        all.extend(
            e.submit(submission(
                i + 1,
                &[(row(b, i), ArgTag::Output)],
                Placement::Any,
            ))
            .unwrap(),
        );
    }
    // Least outstanding work relative to the window: worker 1 (window 2)
    // first, then 0, then 1 again; 4 and 5 queue on 0 and 1.
    assert_eq!(dispatched(&all), vec![(1, 1), (2, 0), (3, 1)]);
    assert_eq!(
        (
            e.scheduler().outstanding(WorkerId(0)),
            e.scheduler().outstanding(WorkerId(1))
        ),
        (2, 3)
    );
    let more = e.finished(TaskId(2), 0, Ok(()));
    assert_eq!(
        dispatched(&more),
        vec![(4, 0)],
        "task 4 was queued on worker 0"
    );
    // Directed placement to a worker without the callable is refused.
    let mut s = submission(
        10,
        &[(row(b, 9), ArgTag::Input)],
        Placement::On(WorkerId(0)),
    );
    s.members[0].callable = OTHER;
    assert!(
        e.submit(s)
            .unwrap_err()
            .to_string()
            .contains("not registered on worker 0")
    );
    let s = submission(
        11,
        &[(row(b, 9), ArgTag::Input)],
        Placement::On(WorkerId(7)),
    );
    assert!(
        e.submit(s)
            .unwrap_err()
            .to_string()
            .contains("worker 7 is unknown")
    );
    e.scheduler().check_invariants().unwrap();
}

/// A task that needs a dtype goes only to a worker whose chip has it,
/// however much room another has; one without a need goes anywhere; a
/// task pinned to a worker without what it needs, or that no worker can
/// take, is refused at submit naming what is missing.
#[test]
fn placement_never_picks_a_worker_without_what_the_task_needs() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    let no_f64 = Capabilities {
        dtypes: DTypeSet::ALL.difference(DTypeSet::of([DType::F64])),
        ..everything()
    };
    // Worker 0 has room for many and no F64; worker 1 room for one.
    e.worker_up_with(WorkerId(0), [K], no_f64, 8);
    e.worker_up(WorkerId(1), [K], 1);
    let f64_need = Capabilities {
        dtypes: DTypeSet::of([DType::F64]),
        ..Capabilities::NONE
    };
    let mut all = Vec::new();
    for i in 0..4 {
        let mut s = submission(i + 1, &[(row(b, i), ArgTag::Output)], Placement::Any);
        s.members[0].needs = f64_need;
        all.extend(e.submit(s).unwrap());
    }
    // One runs on worker 1; the rest wait for it, never on worker 0.
    assert_eq!(dispatched(&all), vec![(1, 1)]);
    assert_eq!(e.scheduler().outstanding(WorkerId(0)), 0);
    let plain = e
        .submit(submission(
            5,
            &[(row(b, 5), ArgTag::Output)],
            Placement::Any,
        ))
        .unwrap();
    assert_eq!(
        dispatched(&plain),
        vec![(5, 0)],
        "no need: the roomy worker"
    );
    let mut ran = vec![1];
    for t in 1..4 {
        let next = e.finished(TaskId(t), 0, Ok(()));
        let d = dispatched(&next);
        assert_eq!(d.len(), 1, "{next:?}");
        assert_eq!(d[0].1, 1, "task {} on worker 0", d[0].0);
        ran.push(d[0].0);
    }
    assert_eq!(ran, vec![1, 2, 3, 4]);
    e.scheduler().check_invariants().unwrap();

    // Pinned to the worker without F64: refused, naming what it lacks.
    let mut s = submission(
        10,
        &[(row(b, 9), ArgTag::Input)],
        Placement::On(WorkerId(0)),
    );
    s.members[0].needs = f64_need;
    let r = e.submit(s).unwrap_err();
    assert!(
        matches!(
            &r,
            Refusal::Submit(strata_orchestrator_core::SubmitError {
                reason: SubmitReason::Unplaceable(PlacementError::Lacks {
                    member: 0,
                    worker: WorkerId(0),
                    missing,
                }),
                ..
            }) if *missing == f64_need
        ),
        "{r:?}"
    );
    assert!(
        r.to_string()
            .contains("worker 0 lacks what it needs: backends none; dtypes F64; features none"),
        "{r}"
    );
    // A feature no worker has: refused wherever it may go.
    let mut s = submission(11, &[(row(b, 9), ArgTag::Input)], Placement::Any);
    s.members[0].needs = Capabilities {
        features: Features::from_bits(1 << 40),
        ..Capabilities::NONE
    };
    let r = e.submit(s).unwrap_err();
    assert!(
        r.to_string()
            .contains("no worker that offers callable 01010101010101010101010101010101 has what it needs (backends none; dtypes none; features bit 40)"),
        "{r}"
    );
    e.scheduler().check_invariants().unwrap();
}

/// When the only worker with what a task needs is lost, the task is not
/// placed on one without it: it fails as unplaceable, naming the need.
#[test]
fn a_task_whose_only_capable_worker_is_down_fails_instead_of_moving() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    let cache = Capabilities {
        features: Features::DEVICE_CACHE,
        ..Capabilities::NONE
    };
    e.worker_up_with(
        WorkerId(0),
        [K],
        Capabilities {
            features: Features::HOST_BYTES,
            ..everything()
        },
        4,
    );
    e.worker_up(WorkerId(1), [K], 1);
    let mut first = submission(1, &[(row(b, 0), ArgTag::Output)], Placement::Any);
    first.members[0].needs = cache;
    assert_eq!(dispatched(&e.submit(first).unwrap()), vec![(1, 1)]);
    let mut second = submission(2, &[(row(b, 1), ArgTag::Output)], Placement::Any);
    second.members[0].needs = cache;
    assert!(dispatched(&e.submit(second).unwrap()).is_empty());
    let out = e.worker_lost(WorkerId(1), "gone", true);
    let failed: Vec<_> = out
        .iter()
        .filter_map(|a| match a {
            Action::Done { task, outcome } => Some((task.0, format!("{outcome:?}"))),
            _ => None,
        })
        .collect();
    assert!(
        failed.iter().any(|(t, o)| *t == 2
            && o.contains(
                "has what it needs (backends none; dtypes none; features DEVICE_CACHE) is up"
            )),
        "{failed:?}"
    );
    assert!(dispatched(&out).is_empty(), "nothing moved to worker 0");
    e.scheduler().check_invariants().unwrap();
}

#[test]
fn device_buffers_break_ties() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    for w in 0..3 {
        e.worker_up(WorkerId(w), [K], 4);
    }
    let dev = CanonicalIdentity::new(*b"devbuff!", 1, 1).unwrap();
    e.device_buffer(WorkerId(2), dev, true);
    let mut s = submission(1, &[(row(b, 0), ArgTag::Input)], Placement::Any);
    s.members[0].device_buffers = vec![dev];
    assert_eq!(dispatched(&e.submit(s).unwrap()), vec![(1, 2)]);
}

#[test]
fn groups_launch_all_or_nothing_on_distinct_workers() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 1);
    e.worker_up(WorkerId(1), [K], 1);
    // Worker 1 is busy with a solo task.
    let solo = e
        .submit(submission(
            1,
            &[(row(b, 0), ArgTag::Output)],
            Placement::On(WorkerId(1)),
        ))
        .unwrap();
    assert_eq!(dispatched(&solo), vec![(1, 1)]);
    let group = Sub {
        task: NewTask {
            id: TaskId(2),
            members: vec![
                vec![
                    Arg {
                        tensor: row(b, 2),
                        tag: ArgTag::Output,
                    },
                    Arg {
                        tensor: row(b, 3),
                        tag: ArgTag::Input,
                    },
                ],
                vec![
                    Arg {
                        tensor: row(b, 3),
                        tag: ArgTag::Output,
                    },
                    Arg {
                        tensor: row(b, 2),
                        tag: ArgTag::Input,
                    },
                ],
            ],
            scalars: vec![0, 0],
            after: vec![],
        },
        members: vec![
            MemberInfo {
                callable: K,
                placement: Placement::Any,
                device_buffers: vec![],
                needs: Capabilities::NONE,
                work: Default::default()
            };
            2
        ],
        retries: 0,
    };
    // Members read each other's outputs: no self-edge, ready at once, but
    // not launched while worker 1 is full.
    assert!(dispatched(&e.submit(group).unwrap()).is_empty());
    let out = e.finished(TaskId(1), 0, Ok(()));
    let mut d = dispatched(&out);
    d.sort_unstable();
    assert_eq!(d, vec![(2, 0), (2, 1)], "both members at once");
    assert!(
        e.finished(TaskId(2), 0, Ok(()))
            .iter()
            .all(|a| !matches!(a, Action::Done { .. })),
        "one member is not the task"
    );
    let out = e.finished(TaskId(2), 1, Ok(()));
    assert!(out.contains(&Action::Done {
        task: TaskId(2),
        outcome: Outcome::Success
    }));
    // Two members placed on one worker are refused, naming the later one,
    // whichever members they are; placed on distinct workers they run.
    for (places, taken) in [
        ([0, 0, 9], Some(1)),
        ([0, 1, 0], Some(2)),
        ([1, 0, 9], None),
    ] {
        let members = places.iter().filter(|&&w| w != 9).count();
        let group = Sub {
            task: NewTask {
                id: TaskId(10 + places[0] + 2 * places[1]),
                members: (0..members as u64)
                    .map(|m| {
                        vec![Arg {
                            tensor: row(b, 20 + m),
                            tag: ArgTag::Output,
                        }]
                    })
                    .collect(),
                scalars: vec![0; members],
                after: vec![],
            },
            members: places[..members]
                .iter()
                .map(|&w| MemberInfo {
                    callable: K,
                    placement: Placement::On(WorkerId(w as u32)),
                    device_buffers: vec![],
                    needs: Capabilities::NONE,
                    work: Default::default(),
                })
                .collect(),
            retries: 0,
        };
        let r = e.submit(group);
        match taken {
            Some(m) => assert!(
                matches!(
                    &r,
                    Err(Refusal::Submit(strata_orchestrator_core::SubmitError {
                        reason: SubmitReason::Unplaceable(PlacementError::WorkerTaken {
                            member,
                            worker: WorkerId(0),
                        }),
                        ..
                    })) if *member == m
                ),
                "{places:?}: {r:?}"
            ),
            None => assert!(r.is_ok(), "{places:?}: {r:?}"),
        }
    }
    e.scheduler().check_invariants().unwrap();
}

#[test]
fn endpoint_loss_fails_in_flight_and_replaces_queued() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 1);
    e.worker_up(WorkerId(1), [K], 1);
    let mut out = Vec::new();
    out.extend(
        e.submit(submission(
            1,
            &[(row(b, 0), ArgTag::Output)],
            Placement::On(WorkerId(0)),
        ))
        .unwrap(),
    );
    out.extend(
        e.submit(submission(
            2,
            &[(row(b, 1), ArgTag::Output)],
            Placement::On(WorkerId(0)),
        ))
        .unwrap(),
    );
    out.extend(
        e.submit(submission(
            3,
            &[(row(b, 2), ArgTag::Output)],
            Placement::Any,
        ))
        .unwrap(),
    );
    out.extend(
        e.submit(submission(
            4,
            &[(row(b, 3), ArgTag::Output)],
            Placement::Any,
        ))
        .unwrap(),
    );
    out.extend(
        e.submit(submission(5, &[(row(b, 0), ArgTag::Input)], Placement::Any))
            .unwrap(),
    );
    assert_eq!(dispatched(&out), vec![(1, 0), (3, 1)]);
    // Seen dead (fenced): nothing is quarantined.
    let lost = e.worker_lost(WorkerId(0), "connection reset", true);
    let done: Vec<(u64, Outcome)> = lost
        .iter()
        .filter_map(|a| match a {
            Action::Done { task, outcome } => Some((task.0, outcome.clone())),
            _ => None,
        })
        .collect();
    let lost = || {
        Outcome::EndpointFailure(FailureCause::new(
            FailureKind::WorkerLost,
            "worker 0 lost: connection reset",
        ))
    };
    assert!(done.contains(&(1, lost())));
    assert!(done.contains(&(2, lost())), "named worker 0");
    assert!(
        done.contains(&(5, Outcome::Skipped { because: TaskId(1) })),
        "read task 1's output"
    );
    let fe = e.first_error().unwrap();
    assert_eq!((fe.task, fe.worker), (TaskId(1), Some(WorkerId(0))));
    // Task 4 was queued automatically; it moves to worker 1 and runs there.
    let out = e.finished(TaskId(3), 0, Ok(()));
    assert_eq!(dispatched(&out), vec![(4, 1)]);
    // The worker comes back and takes work again.
    e.worker_up(WorkerId(0), [K], 1);
    let out = e
        .submit(submission(
            6,
            &[(row(b, 7), ArgTag::Output)],
            Placement::On(WorkerId(0)),
        ))
        .unwrap();
    assert_eq!(dispatched(&out), vec![(6, 0)]);
    e.scheduler().check_invariants().unwrap();
    e.dag().check_invariants().unwrap();
}

#[test]
fn kernel_failure_is_the_first_error_and_cancel_works_through_the_engine() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 1);
    e.submit(submission(
        1,
        &[(row(b, 0), ArgTag::Output)],
        Placement::Any,
    ))
    .unwrap();
    e.submit(submission(2, &[(row(b, 0), ArgTag::Input)], Placement::Any))
        .unwrap();
    e.submit(submission(
        3,
        &[(row(b, 5), ArgTag::Output)],
        Placement::Any,
    ))
    .unwrap();
    let out = e.cancel(TaskId(3)).unwrap();
    assert!(out.contains(&Action::Done {
        task: TaskId(3),
        outcome: Outcome::Cancelled
    }));
    assert!(e.cancel(TaskId(1)).is_err(), "running");
    let out = e.finished(TaskId(1), 0, Err("kernel add@1 failed: boom".into()));
    assert!(out.contains(&Action::Done {
        task: TaskId(1),
        outcome: Outcome::TaskFailure(FailureCause::new(
            FailureKind::Kernel,
            "kernel add@1 failed: boom"
        ))
    }));
    assert!(out.contains(&Action::Done {
        task: TaskId(2),
        outcome: Outcome::Skipped { because: TaskId(1) }
    }));
    let fe = e.first_error().unwrap();
    assert_eq!(
        (fe.task, fe.callable, fe.worker),
        (TaskId(1), K, Some(WorkerId(0)))
    );
}

#[test]
fn a_task_allowed_to_retry_runs_again_elsewhere_only_when_fenced() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 1);
    e.worker_up(WorkerId(1), [K], 1);
    // Task 1 goes to worker 0, task 2 to worker 1; both may retry once.
    let mut out = e
        .submit(retrying(
            submission(1, &[(row(b, 0), ArgTag::Output)], Placement::Any),
            1,
        ))
        .unwrap();
    out.extend(
        e.submit(retrying(
            submission(2, &[(row(b, 1), ArgTag::Output)], Placement::Any),
            1,
        ))
        .unwrap(),
    );
    assert_eq!(dispatched(&out), vec![(1, 0), (2, 1)]);
    // Worker 0 is lost and known dead: task 1 is queued on worker 1,
    // behind task 2 (window 1), and nothing fails.
    let lost = e.worker_lost(WorkerId(0), "killed", true);
    assert!(
        lost.iter().all(|a| !matches!(a, Action::Done { .. })),
        "{lost:?}"
    );
    e.scheduler().check_invariants().unwrap();
    let out = e.finished(TaskId(2), 0, Ok(()));
    assert_eq!(
        dispatched(&out),
        vec![(1, 1)],
        "task 1 runs again on worker 1"
    );
    let out = e.finished(TaskId(1), 0, Ok(()));
    assert!(out.contains(&Action::Done {
        task: TaskId(1),
        outcome: Outcome::Success
    }));
    assert!(e.first_error().is_none());
    // Its one retry is spent... and a loss that is not fenced (a hung
    // worker that may still write) never reruns anything.
    e.worker_up(WorkerId(0), [K], 1);
    let out = e
        .submit(retrying(
            submission(3, &[(row(b, 2), ArgTag::Output)], Placement::Any),
            5,
        ))
        .unwrap();
    let w = dispatched(&out)[0].1;
    let lost = e.worker_lost(WorkerId(w), "no health beat", false);
    assert_eq!(
        lost,
        vec![Action::Quarantined {
            task: TaskId(3),
            loss: Loss {
                worker: WorkerId(w),
                epoch: 1 + u64::from(w == 0),
            }
        }],
        "it waits for the fence, neither failed nor placed again"
    );
    // Given up on: it fails naming the loss.
    let out = e.abandon(WorkerId(w), e.losses(WorkerId(w)), "deadline passed");
    assert!(
        out.iter().any(|a| matches!(
            a,
            Action::Done { task: TaskId(3), outcome: Outcome::EndpointFailure(c) }
                if c.kind == FailureKind::WorkerLost
                    && c.message.contains("never proved it ended")
                    && c.message.contains("deadline passed")
        )),
        "{out:?}"
    );
    // A task named to a worker is never moved.
    let out = e
        .submit(retrying(
            submission(
                4,
                &[(row(b, 3), ArgTag::Output)],
                Placement::On(WorkerId(1 - w)),
            ),
            5,
        ))
        .unwrap();
    assert_eq!(dispatched(&out), vec![(4, 1 - w)]);
    e.worker_up(WorkerId(w), [K], 1);
    let lost = e.worker_lost(WorkerId(1 - w), "killed", true);
    assert!(lost.iter().any(|a| matches!(
        a,
        Action::Done {
            task: TaskId(4),
            outcome: Outcome::EndpointFailure(_)
        }
    )));
}

fn done_with(actions: &[Action], id: u64) -> Option<Outcome> {
    actions.iter().find_map(|a| match a {
        Action::Done { task, outcome } if task.0 == id => Some(outcome.clone()),
        _ => None,
    })
}

/// The quarantine scenario: a task lost without a fence must not have its
/// bytes overwritten (or read) until the fence.
#[test]
fn a_loss_without_a_fence_quarantines_the_written_bytes_until_fenced() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 4);
    e.worker_up(WorkerId(1), [K], 4);
    let on = |w| Placement::On(WorkerId(w));
    // 1 (worker 0) reads row 0 and writes rows 1..3.
    let out = e
        .submit(submission(
            1,
            &[(row(b, 0), ArgTag::Input), (rows(b, 1, 2), ArgTag::Output)],
            on(0),
        ))
        .unwrap();
    assert_eq!(dispatched(&out), vec![(1, 0)]);
    // Its successors on worker 1: 2 overwrites row 1 (WAW), 3 reads row 2
    // (RAW), 4 overwrites row 0, which 1 reads (WAR).
    for (id, args) in [
        (2, vec![(row(b, 1), ArgTag::Output)]),
        (
            3,
            vec![(row(b, 2), ArgTag::Input), (row(b, 9), ArgTag::Output)],
        ),
        (4, vec![(row(b, 0), ArgTag::Output)]),
    ] {
        assert!(e.submit(submission(id, &args, on(1))).unwrap().is_empty());
    }
    // Worker 0 is lost without a fence.
    let out = e.worker_lost(WorkerId(0), "no health beat", false);
    let loss = Loss {
        worker: WorkerId(0),
        epoch: 1,
    };
    assert_eq!(
        out.first(),
        Some(&Action::Quarantined {
            task: TaskId(1),
            loss
        })
    );
    assert!(
        matches!(done_with(&out, 1), Some(Outcome::EndpointFailure(c))
            if c.kind == FailureKind::WorkerLost && c.message.contains("quarantined"))
    );
    assert_eq!(
        done_with(&out, 3),
        Some(Outcome::Skipped { because: TaskId(1) })
    );
    assert_eq!(dispatched(&out), vec![(4, 1)], "WAR only: released");
    assert_eq!(done_with(&out, 2), None, "WAW: waits for the fence");
    assert!(e.dag().is_lost(TaskId(1)));
    assert_eq!(e.quarantined(), 1);
    // A later writer of quarantined bytes waits too; a later reader is
    // skipped; bytes it does not write are free.
    assert!(
        e.submit(submission(5, &[(rows(b, 0, 3), ArgTag::Output)], on(1)))
            .unwrap()
            .is_empty()
    );
    let out = e
        .submit(submission(
            6,
            &[(row(b, 2), ArgTag::Input), (row(b, 10), ArgTag::Output)],
            on(1),
        ))
        .unwrap();
    assert_eq!(
        done_with(&out, 6),
        Some(Outcome::Skipped { because: TaskId(1) })
    );
    let out = e
        .submit(submission(7, &[(row(b, 20), ArgTag::Output)], on(1)))
        .unwrap();
    assert_eq!(dispatched(&out), vec![(7, 1)]);
    // Cancel cannot release what is lost.
    assert!(e.cancel(TaskId(1)).is_err());
    // A fence of another loss does nothing; this one lifts it: 2 runs,
    // then 5 after 2 (and 4).
    assert!(e.fence(WorkerId(0), 7).is_empty());
    let out = e.fence(WorkerId(0), 1);
    assert_eq!(out.first(), Some(&Action::Lifted { task: TaskId(1) }));
    assert_eq!(dispatched(&out), vec![(2, 1)]);
    assert!(!e.dag().is_lost(TaskId(1)));
    assert_eq!(e.quarantined(), 0);
    e.finished(TaskId(4), 0, Ok(()));
    e.finished(TaskId(7), 0, Ok(()));
    let out = e.finished(TaskId(2), 0, Ok(()));
    assert_eq!(dispatched(&out), vec![(5, 1)]);
    e.finished(TaskId(5), 0, Ok(()));
    assert_eq!(e.dag().live(), 0);
    e.dag().check_invariants().unwrap();
    e.scheduler().check_invariants().unwrap();
}

#[test]
fn an_abandoned_quarantine_fails_waiting_and_later_writers_until_a_late_fence() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 4);
    e.worker_up(WorkerId(1), [K], 4);
    let on = |w| Placement::On(WorkerId(w));
    e.submit(submission(1, &[(row(b, 1), ArgTag::Output)], on(0)))
        .unwrap();
    // 2 overwrites 1's bytes; 3 reads 2's output.
    e.submit(submission(2, &[(row(b, 1), ArgTag::InOut)], on(1)))
        .unwrap();
    e.submit(submission(
        3,
        &[(row(b, 1), ArgTag::Input), (row(b, 5), ArgTag::Output)],
        on(1),
    ))
    .unwrap();
    e.submit(submission(4, &[(row(b, 1), ArgTag::OutputExisting)], on(1)))
        .unwrap();
    let out = e.worker_lost(WorkerId(0), "link cut", false);
    // INOUT reads: skipped at once. OUTPUT_EXISTING waits.
    assert_eq!(
        done_with(&out, 2),
        Some(Outcome::Skipped { because: TaskId(1) })
    );
    assert_eq!(
        done_with(&out, 3),
        Some(Outcome::Skipped { because: TaskId(1) })
    );
    assert_eq!(done_with(&out, 4), None);
    let out = e.abandon(WorkerId(0), 1, "no fence within 30 s");
    let cause = match done_with(&out, 4) {
        Some(Outcome::EndpointFailure(c)) => c,
        other => panic!("{other:?}"),
    };
    assert_eq!(cause.kind, FailureKind::Quarantined);
    assert!(
        cause.message.contains("quarantined by task 1")
            && cause.message.contains("worker 0")
            && cause.message.contains("no fence within 30 s"),
        "{cause}"
    );
    // Later writers are refused at once, naming the same.
    let out = e
        .submit(submission(5, &[(rows(b, 0, 4), ArgTag::Output)], on(1)))
        .unwrap();
    assert!(
        matches!(done_with(&out, 5), Some(Outcome::EndpointFailure(c))
            if c.kind == FailureKind::Quarantined && c.message.contains("quarantined by task 1"))
    );
    // A late fence lifts it: writers run again.
    let out = e.fence(WorkerId(0), 1);
    assert!(out.contains(&Action::Lifted { task: TaskId(1) }));
    let out = e
        .submit(submission(6, &[(row(b, 1), ArgTag::Output)], on(1)))
        .unwrap();
    assert_eq!(dispatched(&out), vec![(6, 1)]);
    e.finished(TaskId(6), 0, Ok(()));
    assert_eq!(e.dag().live(), 0);
}

#[test]
fn a_retry_of_a_quarantined_task_waits_for_the_fence() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 1);
    e.worker_up(WorkerId(1), [K], 1);
    let out = e
        .submit(retrying(
            submission(1, &[(row(b, 0), ArgTag::Output)], Placement::Any),
            1,
        ))
        .unwrap();
    assert_eq!(dispatched(&out), vec![(1, 0)]);
    // A reader waits on the task, which stays running for the DAG.
    assert!(
        e.submit(submission(
            2,
            &[(row(b, 0), ArgTag::Input), (row(b, 1), ArgTag::Output)],
            Placement::Any
        ))
        .unwrap()
        .is_empty()
    );
    let out = e.worker_lost(WorkerId(0), "hung", false);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(matches!(
        out[0],
        Action::Quarantined {
            task: TaskId(1),
            ..
        }
    ));
    assert!(e.cancel(TaskId(1)).is_err());
    e.scheduler().check_invariants().unwrap();
    let out = e.fence(WorkerId(0), 1);
    assert_eq!(out.first(), Some(&Action::Lifted { task: TaskId(1) }));
    assert_eq!(dispatched(&out), vec![(1, 1)], "rerun once fenced");
    let out = e.finished(TaskId(1), 0, Ok(()));
    assert_eq!(done_with(&out, 1), Some(Outcome::Success));
    assert_eq!(dispatched(&out), vec![(2, 1)]);
}

#[test]
fn a_group_publishes_one_completion_token() {
    let b = buffer(1, Access::ReadWrite);
    let token = row(b, 63);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 4);
    e.worker_up(WorkerId(1), [K], 4);
    let member = |w| MemberInfo {
        callable: K,
        placement: Placement::On(WorkerId(w)),
        device_buffers: vec![],
        needs: Capabilities::NONE,
        work: Default::default(),
    };
    let out = e
        .submit(Sub {
            task: NewTask {
                id: TaskId(1),
                members: vec![
                    vec![
                        Arg {
                            tensor: row(b, 0),
                            tag: ArgTag::Output,
                        },
                        Arg {
                            tensor: token,
                            tag: ArgTag::Output,
                        },
                    ],
                    vec![
                        Arg {
                            tensor: row(b, 1),
                            tag: ArgTag::Output,
                        },
                        Arg {
                            tensor: token,
                            tag: ArgTag::Output,
                        },
                    ],
                ],
                scalars: vec![0, 0],
                after: vec![],
            },
            members: vec![member(0), member(1)],
            retries: 0,
        })
        .unwrap();
    assert_eq!(dispatched(&out), vec![(1, 0), (1, 1)]);
    // The downstream task names only the token.
    let out = e
        .submit(submission(
            2,
            &[(token, ArgTag::Input), (row(b, 2), ArgTag::Output)],
            Placement::Any,
        ))
        .unwrap();
    assert!(out.is_empty());
    assert!(
        e.finished(TaskId(1), 0, Ok(())).is_empty(),
        "one member is not the group"
    );
    let out = e.finished(TaskId(1), 1, Ok(()));
    assert_eq!(done_with(&out, 1), Some(Outcome::Success));
    assert_eq!(dispatched(&out).len(), 1);
}

/// A member past its timeout fails with TASK_FAILURE naming the timeout
/// (never retried, whatever the policy) once its worker's loss follows;
/// the other task in flight there fails (or retries) as on any loss; an
/// unfenced loss quarantines the timed-out task's bytes like any other
/// until the fence, and a timeout for a member not in flight does nothing.
#[test]
fn a_timed_out_member_fails_naming_the_timeout_and_its_bytes_follow_the_loss() {
    let b = buffer(1, Access::ReadWrite);
    let mut e = Engine::new();
    e.worker_up(WorkerId(0), [K], 4);
    e.worker_up(WorkerId(1), [K], 4);
    let on = |w| Placement::On(WorkerId(w));
    // 1 (allowed to retry, placed on worker 0 by the scheduler) times out;
    // 2 is in flight beside it on worker 0; 3 overwrites 1's row (WAW).
    let out = e
        .submit(retrying(
            submission(1, &[(row(b, 0), ArgTag::Output)], on(0)),
            3,
        ))
        .unwrap();
    assert_eq!(dispatched(&out), vec![(1, 0)]);
    let out = e
        .submit(submission(2, &[(row(b, 1), ArgTag::Output)], on(0)))
        .unwrap();
    assert_eq!(dispatched(&out), vec![(2, 0)]);
    assert!(
        e.submit(submission(3, &[(row(b, 0), ArgTag::Output)], on(1)))
            .unwrap()
            .is_empty()
    );
    let cause = "timed out after 200 ms on worker 0";
    let timed = e.on_event(Event::TimedOut {
        task: TaskId(1),
        member: 0,
        cause: cause.into(),
    });
    assert!(timed.is_empty(), "it ends with the loss: {timed:?}");
    assert!(e.scheduler().running_on(WorkerId(0)).contains(&TaskId(1)));
    // A timeout of a task not in flight (or unknown) changes nothing.
    assert!(
        e.on_event(Event::TimedOut {
            task: TaskId(3),
            member: 0,
            cause: cause.into(),
        })
        .is_empty()
    );
    let out = e.worker_lost(WorkerId(0), "task 1 timed out", false);
    let loss = Loss {
        worker: WorkerId(0),
        epoch: 1,
    };
    assert!(out.contains(&Action::Quarantined {
        task: TaskId(1),
        loss
    }));
    assert_eq!(
        done_with(&out, 1),
        Some(Outcome::TaskFailure(FailureCause::new(
            FailureKind::TimedOut,
            cause
        ))),
        "{out:?}"
    );
    assert!(
        matches!(done_with(&out, 2), Some(Outcome::EndpointFailure(c))
            if c.kind == FailureKind::WorkerLost && c.message.contains("task 1 timed out")),
        "{out:?}"
    );
    assert_eq!(done_with(&out, 3), None, "WAW: waits for the fence");
    assert!(e.dag().is_lost(TaskId(1)));
    assert_eq!(
        e.first_error().map(|f| (f.task, f.outcome.clone())),
        Some((
            TaskId(1),
            Outcome::TaskFailure(FailureCause::new(FailureKind::TimedOut, cause))
        ))
    );
    let out = e.fence(WorkerId(0), 1);
    assert_eq!(dispatched(&out), vec![(3, 1)], "the fence lets 3 run");
    e.finished(TaskId(3), 0, Ok(()));
    assert_eq!(e.dag().live(), 0);
    e.dag().check_invariants().unwrap();
    e.scheduler().check_invariants().unwrap();
}
