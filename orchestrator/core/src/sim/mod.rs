//! Random programs, the sequential oracle, and a simulated executor: the
//! differential test's parts, kept in the library so tests, benchmarks and
//! a longer soak share them.
//!
//! A program is a list of tasks over a few buffers; every task is a
//! deterministic function of the bytes it reads, writing every element of
//! the views it writes. [`run_sequential`] applies them one by one in
//! submission order. [`run_engine`] submits them to an [`Engine`] with
//! 1–8 simulated workers that complete dispatched tasks in random order,
//! reading their inputs at dispatch and writing their outputs at
//! completion, so a missing edge changes the bytes.

#![allow(clippy::cast_possible_truncation)]

use std::collections::HashMap;

use strata_wire::check::{Rng, random_factorization, row_major_strides};
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, DType,
    IdentityMint, Tensor,
};

use crate::dag::{Arg, NewTask};
use crate::engine::{Action, Engine, Event, Submission};
use crate::ids::{KernelHandle, TaskId, WorkerId};
use crate::sched::{MemberInfo, Outcome, Placement};
use strata_boundary::{BackendKinds, Capabilities, DTypeSet, Features};

mod faults;
pub use faults::{FaultRun, check_after_faults, oracle_after_faults, run_engine_with_faults};

/// The callable every simulated task uses.
pub const CALLABLE: KernelHandle = KernelHandle([0x5a; 16]);

/// One task of a program.
#[derive(Debug, Clone)]
pub struct ProgTask {
    /// Its id (increasing).
    pub id: TaskId,
    /// Argument lists, one per member.
    pub members: Vec<Vec<Arg>>,
    /// Explicit predecessors.
    pub after: Vec<TaskId>,
}

/// A random program.
#[derive(Debug, Clone)]
pub struct Program {
    /// The buffers: the first is read-only (read by INPUT and NO_DEP
    /// arguments, never written).
    pub buffers: Vec<BufferDescriptor>,
    /// Initial contents, by identity.
    pub initial: HashMap<CanonicalIdentity, Vec<u8>>,
    /// Tasks in submission order.
    pub tasks: Vec<ProgTask>,
}

/// Memory: bytes by buffer identity.
pub type Memory = HashMap<CanonicalIdentity, Vec<u8>>;

const DTYPES: [DType; 4] = [DType::U8, DType::F16, DType::F32, DType::I64];

/// A buffer laid out as a row-major array of `dims` elements of `dtype`.
struct Layout {
    desc: BufferDescriptor,
    dims: Vec<u32>,
    dtype: DType,
}

/// A random program of `n_tasks` tasks over 3–5 buffers.
pub fn random_program(rng: &mut Rng, n_tasks: usize) -> Program {
    let (layouts, initial) = random_layouts(rng);
    let mut tasks = Vec::new();
    let mut id = 0u64;
    while tasks.len() < n_tasks {
        id += 1;
        let members = if rng.range(1, 20) == 1 { 2 } else { 1 };
        if let Some(t) = random_task(rng, &layouts, TaskId(id), members) {
            tasks.push(t);
        }
    }
    // A few explicit edges to earlier tasks.
    for i in 0..tasks.len() {
        if i > 0 && rng.range(1, 25) == 1 {
            let j = (rng.next_u64() % i as u64) as usize;
            let a = tasks[j].id;
            tasks[i].after.push(a);
        }
    }
    Program {
        buffers: layouts.iter().map(|l| l.desc).collect(),
        initial,
        tasks,
    }
}

/// 3–5 buffers of random shapes and dtypes with random contents; the
/// first is read-only.
fn random_layouts(rng: &mut Rng) -> (Vec<Layout>, Memory) {
    let mint = IdentityMint::new(rng.next_u64().to_le_bytes());
    let n_buffers = rng.range(3, 5) as usize;
    let mut layouts = Vec::new();
    let mut initial = HashMap::new();
    for b in 0..n_buffers {
        let dtype = rng.pick(&DTYPES);
        let rank = rng.range(2, 4);
        let dims: Vec<u32> = (0..rank)
            .map(|_| rng.range(2, if rank == 2 { 12 } else { 6 }))
            .collect();
        let nbytes =
            dims.iter().map(|&d| u64::from(d)).product::<u64>() * u64::from(dtype.bits() / 8);
        let access = if b == 0 {
            Access::Read
        } else {
            Access::ReadWrite
        };
        let desc = BufferDescriptor::new(
            mint.mint().expect("identity"),
            nbytes,
            AddressSpace::Host,
            access,
            Backing::Memfd {
                st_dev: 1,
                st_ino: b as u64,
            },
        )
        .expect("descriptor");
        let bytes: Vec<u8> = (0..nbytes).map(|_| rng.next_u64() as u8).collect();
        initial.insert(*desc.identity(), bytes);
        layouts.push(Layout { desc, dims, dtype });
    }
    (layouts, initial)
}

/// A read-mostly random program of `n_tasks` tasks, the pattern of
/// inference: a few *shared* views of the first two buffers (the weights)
/// that most tasks read — many readers of identical views, and of views
/// that overlap them partially — while each task writes a view of the
/// other buffers (its activations); about one task in twelve writes the
/// second buffer instead (a weight update: a shared view, or any view,
/// which may cover some shared views and cut across others).
pub fn read_mostly_program(rng: &mut Rng, n_tasks: usize) -> Program {
    let (layouts, initial) = random_layouts(rng);
    let shared: Vec<Tensor> = layouts[..2]
        .iter()
        .flat_map(|l| {
            let n = rng.range(1, 3);
            (0..n)
                .filter_map(|_| random_view(rng, l))
                .collect::<Vec<_>>()
        })
        .collect();
    let writable = |t: &Tensor| t.buffer().access().allows_write();
    let mut tasks = Vec::new();
    let mut id = 0u64;
    while tasks.len() < n_tasks && !shared.is_empty() {
        id += 1;
        let mut args = Vec::new();
        for _ in 0..rng.range(1, 2) {
            let tensor = shared[(rng.next_u64() % shared.len() as u64) as usize];
            args.push(Arg {
                tensor,
                tag: ArgTag::Input,
            });
        }
        let (tensor, tags) = if rng.range(1, 12) == 1 {
            let own = shared.iter().copied().filter(writable).collect::<Vec<_>>();
            let t = match own.len() {
                0 => random_view(rng, &layouts[1]),
                n if rng.range(0, 1) == 0 => Some(own[(rng.next_u64() % n as u64) as usize]),
                _ => random_view(rng, &layouts[1]),
            };
            (
                t,
                &[ArgTag::Output, ArgTag::OutputExisting, ArgTag::InOut][..],
            )
        } else {
            let b = rng.range(2, layouts.len() as u32 - 1) as usize;
            (
                random_view(rng, &layouts[b]),
                &[ArgTag::Output, ArgTag::OutputExisting][..],
            )
        };
        let Some(tensor) = tensor else { continue };
        args.push(Arg {
            tensor,
            tag: rng.pick(tags),
        });
        let task = NewTask::single(TaskId(id), args.clone());
        if crate::Dag::check(task).is_ok() {
            tasks.push(ProgTask {
                id: TaskId(id),
                members: vec![args],
                after: Vec::new(),
            });
        }
    }
    Program {
        buffers: layouts.iter().map(|l| l.desc).collect(),
        initial,
        tasks,
    }
}

fn random_task(rng: &mut Rng, layouts: &[Layout], id: TaskId, members: usize) -> Option<ProgTask> {
    let mut all = Vec::new();
    for _ in 0..members {
        let n_args = rng.range(1, 4);
        let mut args = Vec::new();
        for _ in 0..n_args {
            let b = (rng.next_u64() % layouts.len() as u64) as usize;
            let layout = &layouts[b];
            let tensor = random_view(rng, layout)?;
            let tag = if b == 0 {
                if rng.range(0, 1) == 0 {
                    ArgTag::Input
                } else {
                    ArgTag::NoDep
                }
            } else {
                rng.pick(&[
                    ArgTag::Input,
                    ArgTag::Output,
                    ArgTag::OutputExisting,
                    ArgTag::InOut,
                ])
            };
            args.push(Arg { tensor, tag });
        }
        all.push(args);
    }
    let task = NewTask {
        id,
        members: all.clone(),
        scalars: vec![0; members],
        after: Vec::new(),
    };
    // Keep only tasks the submit checks accept, and groups whose members
    // neither read nor write what another member writes (so that member
    // order cannot matter to the oracle).
    crate::Dag::check(task).ok()?;
    if members > 1 {
        for (m1, a1) in all.iter().enumerate() {
            for (m2, a2) in all.iter().enumerate() {
                if m1 == m2 {
                    continue;
                }
                for x in a1.iter().filter(|a| a.tag.writes()) {
                    for y in a2 {
                        if strata_wire::overlap(&x.tensor, &y.tensor)
                            != strata_wire::Overlap::Disjoint
                        {
                            return None;
                        }
                    }
                }
            }
        }
    }
    Some(ProgTask {
        id,
        members: all,
        after: Vec::new(),
    })
}

/// A view of one of the engine's classes over `layout`.
fn random_view(rng: &mut Rng, layout: &Layout) -> Option<Tensor> {
    let nbytes = layout.desc.nbytes();
    let elem = u64::from(layout.dtype.bits() / 8);
    let strides = row_major_strides(&layout.dims);
    let make = |offset_elems: u64, shape: &[u32], strides: &[u32], dtype: DType| {
        let byte_offset = match dtype.bits() {
            4 => offset_elems / 2,
            bits => offset_elems * u64::from(bits / 8),
        };
        Tensor::new(layout.desc, byte_offset, shape, strides, dtype).ok()
    };
    let boxed = |rng: &mut Rng, dims: &[u32], max_step: u32| {
        let st = row_major_strides(dims);
        let mut off = 0u64;
        let mut shape = Vec::new();
        let mut vs = Vec::new();
        for (&d, &s) in dims.iter().zip(&st) {
            let start = rng.range(0, d - 1);
            let step = rng.range(1, max_step);
            let count = rng.range(1, (d - 1 - start) / step + 1);
            off += u64::from(start) * u64::from(s);
            shape.push(count);
            vs.push(step * s);
        }
        (off, shape, vs)
    };
    match rng.range(0, 6) {
        0 => {
            let (o, s, st) = boxed(rng, &layout.dims, 1);
            make(o, &s, &st, layout.dtype)
        }
        1 => {
            let (o, s, st) = boxed(rng, &layout.dims, 1);
            let mut axes: Vec<(u32, u32)> = s.into_iter().zip(st).collect();
            for i in (1..axes.len()).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                axes.swap(i, j);
            }
            let (s, st): (Vec<u32>, Vec<u32>) = axes.into_iter().unzip();
            make(o, &s, &st, layout.dtype)
        }
        2 => {
            let (o, s, st) = boxed(rng, &layout.dims, 3);
            make(o, &s, &st, layout.dtype)
        }
        3 => {
            // Reshaped: another dtype, another factorization of the bytes.
            let dtype = rng.pick(&DTYPES);
            let e = u64::from(dtype.bits() / 8);
            if nbytes % e != 0 {
                return None;
            }
            let rank = rng.range(1, 3) as usize;
            let dims = random_factorization(rng, (nbytes / e) as u32, rank);
            let (o, s, st) = boxed(rng, &dims, 2);
            make(o, &s, &st, dtype)
        }
        4 => {
            // Rows that run past the end of a buffer row.
            let total = (nbytes / elem) as u32;
            let row = *layout.dims.last()?;
            let n = layout.dims.len();
            let mut shape: Vec<u32> = layout.dims.iter().map(|&d| rng.range(1, d)).collect();
            shape[n - 1] = rng.range(1, (2 * row).min(total));
            make(
                u64::from(rng.range(0, total - 1)),
                &shape,
                &strides,
                layout.dtype,
            )
        }
        5 => {
            // FP4 over the bytes.
            let rank = rng.range(1, 3) as usize;
            let dims = random_factorization(rng, (nbytes * 2) as u32, rank);
            let (o, s, st) = boxed(rng, &dims, 2);
            make(o & !1, &s, &st, DType::Fp4E2M1)
        }
        _ => {
            let rank = rng.range(1, 3) as usize;
            let shape: Vec<u32> = (0..rank).map(|_| rng.range(1, 4)).collect();
            let st: Vec<u32> = (0..rank).map(|_| rng.range(1, 9)).collect();
            make(u64::from(rng.range(0, 16)), &shape, &st, layout.dtype)
        }
    }
}

/// Every element offset of a view, in row-major index order, in units of
/// its element (nibbles for FP4), from the buffer's start.
fn elements(t: &Tensor) -> Vec<u64> {
    let unit_offset = match t.dtype().bits() {
        4 => t.byte_offset() * 2,
        bits => t.byte_offset() / u64::from(bits / 8),
    };
    let mut out = vec![unit_offset];
    for (&n, &s) in t.shape().iter().zip(t.strides()) {
        out = out
            .iter()
            .flat_map(|&o| (0..u64::from(n)).map(move |i| o + i * u64::from(s)))
            .collect();
    }
    out
}

fn read_elem(bytes: &[u8], dtype: DType, e: u64) -> Vec<u8> {
    match dtype.bits() {
        4 => vec![(bytes[(e / 2) as usize] >> (4 * (e % 2))) & 0xf],
        bits => {
            let w = (bits / 8) as usize;
            let at = e as usize * w;
            bytes[at..at + w].to_vec()
        }
    }
}

fn write_elem(bytes: &mut [u8], dtype: DType, e: u64, value: u64) {
    match dtype.bits() {
        4 => {
            let b = &mut bytes[(e / 2) as usize];
            let shift = 4 * (e % 2);
            *b = (*b & !(0xf << shift)) | (((value & 0xf) as u8) << shift);
        }
        bits => {
            let w = (bits / 8) as usize;
            let at = e as usize * w;
            bytes[at..at + w].copy_from_slice(&value.to_le_bytes()[..w]);
        }
    }
}

fn fnv(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x0100_0000_01b3);
    }
}

/// What a member will write: per written argument, per element, a value.
#[derive(Debug, Clone)]
pub struct Writes(Vec<(CanonicalIdentity, DType, u64, u64)>);

/// Reads a member's inputs from `mem` and computes its writes: every
/// written element gets a hash of the task id, the argument, the element
/// position and everything the member read.
pub fn compute(task: TaskId, args: &[Arg], mem: &Memory) -> Writes {
    compute_partial(task, args, mem, &|_, _, _, _| true)
}

/// As [`compute`], for a partial writer: element `k` (row-major) of a
/// written argument `i` tagged `tag` is written only when `writes(task, i,
/// tag, k)` says so,
/// and keeps its bytes otherwise (an `OUTPUT_EXISTING` or `INOUT` that
/// writes some elements and keeps the rest).
pub fn compute_partial(
    task: TaskId,
    args: &[Arg],
    mem: &Memory,
    writes: &dyn Fn(TaskId, usize, ArgTag, u64) -> bool,
) -> Writes {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ task.0;
    for (i, a) in args.iter().enumerate() {
        if a.tag.reads() || a.tag == ArgTag::NoDep {
            fnv(&mut h, &(i as u64).to_le_bytes());
            let bytes = &mem[a.tensor.identity()];
            for e in elements(&a.tensor) {
                fnv(&mut h, &read_elem(bytes, a.tensor.dtype(), e));
            }
        }
    }
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate().filter(|(_, a)| a.tag.writes()) {
        for (k, e) in elements(&a.tensor).into_iter().enumerate() {
            if !writes(task, i, a.tag, k as u64) {
                continue;
            }
            let mut v = h;
            fnv(&mut v, &[i as u8]);
            fnv(&mut v, &(k as u64).to_le_bytes());
            out.push((*a.tensor.identity(), a.tensor.dtype(), e, v));
        }
    }
    Writes(out)
}

/// Applies computed writes.
pub fn apply(writes: &Writes, mem: &mut Memory) {
    for &(id, dtype, e, v) in &writes.0 {
        if let Some(bytes) = mem.get_mut(&id) {
            write_elem(bytes, dtype, e, v);
        }
    }
}

/// The oracle: every task, one by one, in submission order (a group's
/// members one after another).
pub fn run_sequential(p: &Program) -> Memory {
    run_sequential_partial(p, &|_, _, _, _| true)
}

/// The oracle for partial writers ([`compute_partial`]): `writes(task,
/// member's argument, its tag, element)` says which elements of which
/// written argument a task writes.
pub fn run_sequential_partial(
    p: &Program,
    writes: &dyn Fn(TaskId, usize, ArgTag, u64) -> bool,
) -> Memory {
    let mut mem = p.initial.clone();
    for t in &p.tasks {
        for m in &t.members {
            let w = compute_partial(t.id, m, &mem, writes);
            apply(&w, &mut mem);
        }
    }
    mem
}

/// Statistics of one simulated run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Tasks completed.
    pub completed: usize,
    /// Most members in flight at once.
    pub max_in_flight: usize,
}

/// A program's task as the engine takes it, placed by the scheduler and
/// checked as a driver checks it.
///
/// # Panics
/// When the task does not pass the submit checks (the generator keeps
/// only tasks that do).
fn submission(t: &ProgTask, retries: u32) -> Event {
    let task = crate::Dag::check(NewTask {
        id: t.id,
        members: t.members.clone(),
        scalars: vec![0; t.members.len()],
        after: t.after.clone(),
    })
    .expect("the generator keeps tasks that pass the checks");
    Event::Submit(Submission {
        task,
        retries,
        members: t
            .members
            .iter()
            .map(|args| MemberInfo {
                callable: CALLABLE,
                placement: Placement::Any,
                device_buffers: vec![],
                needs: needs_of(t.id, t.members.len(), args),
                work: work_of(args),
            })
            .collect(),
    })
}

/// The feature a third of the plain tasks need and worker 0 lacks when
/// there are others, so that every simulation places some tasks under a
/// capability (SCHED-3, checked after every event, and the runs' own
/// checks catch a task placed where its need is not met).
pub(crate) const NEEDED: Features = Features::DEVICE_CACHE;

/// Whether task `t` needs [`NEEDED`].
pub(crate) fn needs_feature(t: TaskId, members: usize) -> bool {
    members == 1 && t.0 % 3 == 0
}

/// What a member of task `t` (of `members` members) with `args` needs:
/// its arguments' backend kinds and dtypes, and [`NEEDED`] for a third of
/// the plain tasks.
pub(crate) fn needs_of(t: TaskId, members: usize, args: &[Arg]) -> Capabilities {
    Capabilities {
        backends: BackendKinds::of(args.iter().map(|a| a.tensor.buffer().backing().kind())),
        dtypes: DTypeSet::of(args.iter().map(|a| a.tensor.dtype())),
        features: if needs_feature(t, members) {
            NEEDED
        } else {
            Features::NONE
        },
    }
}

/// What a simulated worker's tasks may use: every kind and dtype, and
/// [`NEEDED`] unless it is worker 0 of several.
/// Fails unless member `member` of `task` (of `members`) was dispatched to
/// a worker that has what it needs.
pub(crate) fn assert_capable(
    task: TaskId,
    member: usize,
    members: &[Vec<Arg>],
    worker: WorkerId,
    workers: u32,
) {
    let args = members.get(member).map_or(&[][..], Vec::as_slice);
    assert!(
        capabilities(worker.0, workers).covers(&needs_of(task, members.len(), args)),
        "{task} placed on {worker}, which lacks what it needs"
    );
}

pub(crate) fn capabilities(worker: u32, workers: u32) -> Capabilities {
    Capabilities {
        backends: BackendKinds::of(strata_wire::BackendKind::ALL),
        dtypes: DTypeSet::ALL,
        features: if worker == 0 && workers > 1 {
            Features::NONE
        } else {
            NEEDED
        },
    }
}

/// What the performance models see of a member: its views' shapes as the
/// size class, their elements as the size, each view as a byte set.
fn work_of(args: &[Arg]) -> crate::sched::Work {
    use std::hash::{Hash, Hasher};
    let mut class = rustc_hash::FxHasher::default();
    let mut size = 0;
    let mut data = smallvec::SmallVec::new();
    for a in args {
        a.tensor.shape().hash(&mut class);
        size += a.tensor.element_count();
        let mut key = rustc_hash::FxHasher::default();
        (a.tensor.byte_offset(), a.tensor.shape(), a.tensor.strides()).hash(&mut key);
        data.push((key.finish(), a.tensor.element_count(), a.tag.writes()));
    }
    crate::sched::Work {
        class: class.finish(),
        size,
        flops: (size % 3 == 0).then_some(size * 10),
        data,
    }
}

/// A scheduling policy drawn from `rng`, so that the simulations cover
/// each.
pub(crate) fn any_policy(rng: &mut Rng) -> crate::sched::Policy {
    crate::sched::Policy::ALL[(rng.next_u64() % 3) as usize].1
}

/// Feeds the performance models a made-up measurement of a member about to
/// be reported (the models decide where and in which order, never whether:
/// any figure must leave the results unchanged).
pub(crate) fn observe(engine: &mut Engine, task: TaskId, member: usize, rng: &mut Rng) {
    let ns = u64::from(rng.range(1, 100_000));
    let bytes = u64::from(rng.range(0, 4)) * 4096;
    let _ = engine
        .scheduler_mut()
        .observe(task, member, ns, bytes, bytes / 8);
}

/// Worker `worker` of `workers` comes up, taking `window` tasks at a time.
pub(crate) fn worker_up(worker: u32, workers: u32, window: usize) -> Event {
    Event::WorkerUp {
        worker: WorkerId(worker),
        callables: vec![CALLABLE],
        capabilities: capabilities(worker, workers),
        window,
    }
}

/// Runs `p` through an [`Engine`] with `workers` simulated workers (window
/// 1–4 each), submitting and completing in an order drawn from `rng`.
///
/// # Panics
/// When the engine refuses a task or a task does not succeed (the program
/// has no failures).
pub fn run_engine(p: &Program, workers: u32, rng: &mut Rng) -> (Memory, RunStats) {
    let mut engine = Engine::with_policy(any_policy(rng));
    let mut pending = Vec::new();
    // A group needs as many workers as members.
    let workers = workers.max(
        p.tasks
            .iter()
            .map(|t| t.members.len() as u32)
            .max()
            .unwrap_or(1),
    );
    for w in 0..workers {
        pending.extend(engine.on_event(worker_up(w, workers, rng.range(1, 4) as usize)));
    }
    let members: HashMap<TaskId, Vec<Vec<Arg>>> =
        p.tasks.iter().map(|t| (t.id, t.members.clone())).collect();
    let mut mem = p.initial.clone();
    let mut in_flight: Vec<(TaskId, usize, Writes)> = Vec::new();
    let mut done = 0usize;
    let mut stats = RunStats::default();
    let mut next = 0usize;
    let handle = |actions: Vec<Action>,
                  mem: &Memory,
                  in_flight: &mut Vec<(TaskId, usize, Writes)>,
                  done: &mut usize| {
        for a in actions {
            match a {
                Action::Dispatch {
                    task,
                    member,
                    worker,
                    ..
                } => {
                    assert_capable(task, member, &members[&task], worker, workers);
                    // Inputs are read when the task starts.
                    let w = compute(task, &members[&task][member], mem);
                    in_flight.push((task, member, w));
                }
                Action::Done { task, outcome } => {
                    assert_eq!(outcome, Outcome::Success, "{task} did not succeed");
                    *done += 1;
                }
                Action::Release(_) | Action::Accepted { .. } => {}
                Action::Quarantined { task, .. } | Action::Lifted { task } => {
                    panic!("{task} was quarantined, but no worker is lost in this run")
                }
                Action::Refused(r) => panic!("refused: {r}"),
                Action::ScopeOpened(_) => unreachable!("the run opens no scope"),
            }
        }
    };
    handle(
        std::mem::take(&mut pending),
        &mem,
        &mut in_flight,
        &mut done,
    );
    while done < p.tasks.len() {
        let submit = next < p.tasks.len() && (in_flight.is_empty() || rng.range(0, 2) > 0);
        if submit {
            let t = &p.tasks[next];
            next += 1;
            let actions = engine.on_event(submission(t, 0));
            handle(actions, &mem, &mut in_flight, &mut done);
        } else {
            assert!(
                !in_flight.is_empty(),
                "nothing in flight, nothing to submit, {done} of {} done",
                p.tasks.len()
            );
            let i = (rng.next_u64() % in_flight.len() as u64) as usize;
            let (task, member, writes) = in_flight.swap_remove(i);
            // Outputs land when the task completes.
            apply(&writes, &mut mem);
            observe(&mut engine, task, member, rng);
            let actions = engine.on_event(Event::Finished {
                task,
                member,
                result: Ok(()),
            });
            handle(actions, &mem, &mut in_flight, &mut done);
        }
        stats.max_in_flight = stats.max_in_flight.max(in_flight.len());
    }
    stats.completed = done;
    engine.dag().check_invariants().expect("dag invariants");
    engine
        .scheduler()
        .check_invariants()
        .expect("scheduler invariants");
    assert_eq!(engine.dag().live(), 0);
    (mem, stats)
}
