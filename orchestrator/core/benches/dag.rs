#![allow(missing_docs)] // criterion_group! generates undocumented items

//! Dependency inference, single thread:
//!
//! - `throughput_1m_tasks`: a stencil sweep over a 1024×1024 grid of 4×4
//!   F32 tiles (one 4096×4096 buffer): 1M tasks, each INOUT on its tile and
//!   INPUT on its left and upper neighbours (3 tagged arguments), inserted in
//!   order and completed oldest-first once 4,096 are live. Throughput in
//!   tagged arguments per second.
//! - `per_access/k`: with k live readers on k distinct tiles of one buffer,
//!   insert a reader of a random tile and complete it (k stays constant):
//!   the cost of one access against k live entries.
//! - `readers/<pattern>/n`: with n unfinished tasks that read the same
//!   bytes, one more such task inserted and the oldest completed (n stays
//!   constant): the cost of a task against n live readers, for n = 10³ to
//!   10⁶. Patterns: `private` (each task reads its own row of an input
//!   buffer and writes its own row of an output buffer: the yardstick),
//!   `one_view` (every task reads one view of a weights buffer instead),
//!   `overlapping`
//!   (each reads a window of 64 elements at offset i mod 1024 of one
//!   buffer: distinct, overlapping views) and `inference` (the `one_view`
//!   tasks, plus an INOUT update of the weights every 1,000 tasks).
//! - `writer_after/n`: n readers of one view, then a task that overwrites
//!   it; the time of the writer's insert and of completing the n readers
//!   and the writer, per reader.
//!
//! `cargo bench -p strata-orchestrator-core --bench dag`

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// The allocator the `strata` binaries use: the core runs on it there.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use strata_orchestrator_core::dag::{Arg, NewTask};
use strata_orchestrator_core::{Dag, TaskId};
use strata_wire::check::Rng;
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
};

const T: u32 = 4;

struct Grid {
    desc: BufferDescriptor,
    cols: u32,
}

impl Grid {
    fn new(rows: u32, cols: u32) -> Grid {
        let identity = CanonicalIdentity::new(*b"dagbench", 1, 1).unwrap();
        let nbytes = u64::from(rows * T) * u64::from(cols * T) * 4;
        let desc = BufferDescriptor::new(
            identity,
            nbytes,
            AddressSpace::Host,
            Access::ReadWrite,
            Backing::Memfd {
                st_dev: 0,
                st_ino: 1,
            },
        )
        .unwrap();
        Grid { desc, cols }
    }

    fn tile(&self, i: u32, j: u32) -> Tensor {
        let row = self.cols * T;
        let offset = (u64::from(i * T) * u64::from(row) + u64::from(j * T)) * 4;
        Tensor::new(self.desc, offset, &[T, T], &[row, 1], DType::F32).unwrap()
    }
}

fn throughput(c: &mut Criterion) {
    const SIDE: u32 = 1024;
    const WINDOW: usize = 4096;
    let grid = Grid::new(SIDE, SIDE);
    let mut group = c.benchmark_group("dag");
    group.sample_size(10);
    group.throughput(Throughput::Elements(3 * u64::from(SIDE) * u64::from(SIDE)));
    group.bench_function("throughput_1m_tasks", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut dag = Dag::new();
                let mut live = VecDeque::with_capacity(WINDOW + 1);
                let start = Instant::now();
                let mut id = 0u64;
                for i in 0..SIDE {
                    for j in 0..SIDE {
                        id += 1;
                        // Left and upper neighbours (right and lower ones on the
                        // first column and row, to keep three arguments).
                        let left = if j > 0 {
                            grid.tile(i, j - 1)
                        } else {
                            grid.tile(i, j + 1)
                        };
                        let up = if i > 0 {
                            grid.tile(i - 1, j)
                        } else {
                            grid.tile(i + 1, j)
                        };
                        let args = vec![
                            Arg {
                                tensor: grid.tile(i, j),
                                tag: ArgTag::InOut,
                            },
                            Arg {
                                tensor: left,
                                tag: ArgTag::Input,
                            },
                            Arg {
                                tensor: up,
                                tag: ArgTag::Input,
                            },
                        ];
                        black_box(
                            dag.check_and_insert(NewTask::single(TaskId(id), args))
                                .unwrap(),
                        );
                        live.push_back(TaskId(id));
                        if live.len() > WINDOW {
                            let old = live.pop_front().unwrap();
                            black_box(dag.complete(old).unwrap());
                        }
                    }
                }
                while let Some(old) = live.pop_front() {
                    dag.complete(old).unwrap();
                }
                total += start.elapsed();
            }
            total
        })
    });
    group.finish();
}

fn per_access(c: &mut Criterion) {
    let mut group = c.benchmark_group("per_access");
    for k in [100u32, 1_000, 10_000, 100_000] {
        let side = (f64::from(k).sqrt().ceil()) as u32;
        let grid = Grid::new(side, side);
        let mut dag = Dag::new();
        let mut id = 0u64;
        'fill: for i in 0..side {
            for j in 0..side {
                if id == u64::from(k) {
                    break 'fill;
                }
                id += 1;
                dag.check_and_insert(NewTask::single(
                    TaskId(id),
                    vec![Arg {
                        tensor: grid.tile(i, j),
                        tag: ArgTag::Input,
                    }],
                ))
                .unwrap();
            }
        }
        let mut rng = Rng(k.into());
        group.bench_with_input(BenchmarkId::from_parameter(k), &k, |b, &k| {
            b.iter(|| {
                let t = rng.range(0, k - 1);
                let tile = grid.tile(t / side, t % side);
                id += 1;
                dag.check_and_insert(NewTask::single(
                    TaskId(id),
                    vec![Arg {
                        tensor: tile,
                        tag: ArgTag::Input,
                    }],
                ))
                .unwrap();
                dag.complete(TaskId(id)).unwrap()
            })
        });
        assert_eq!(dag.live() as u32, k);
    }
    group.finish();
}

/// A 1-D F32 buffer of `len` elements.
fn vector(ino: u32, len: u32) -> BufferDescriptor {
    BufferDescriptor::new(
        CanonicalIdentity::new(*b"dagbench", 2, ino).unwrap(),
        u64::from(len) * 4,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: 0,
            st_ino: ino.into(),
        },
    )
    .unwrap()
}

fn slice(desc: BufferDescriptor, start: u32, len: u32) -> Tensor {
    Tensor::new(desc, u64::from(start) * 4, &[len], &[1], DType::F32).unwrap()
}

/// Live readers of shared bytes: `readers/<pattern>/n` (module docs).
fn readers(c: &mut Criterion) {
    const ROW: u32 = 64;
    const UPDATE_EVERY: u64 = 1000;
    const OUT_ROWS: u32 = 1 << 20;
    let weights = vector(10, 1024 + ROW);
    let out = vector(11, OUT_ROWS * ROW);
    let input = vector(12, OUT_ROWS * ROW);
    // Task `id`'s arguments in `pattern`.
    let task = |pattern: &str, id: u64| -> Vec<Arg> {
        let row = u32::try_from(id % u64::from(OUT_ROWS)).unwrap();
        let dst = Arg {
            tensor: slice(out, row * ROW, ROW),
            tag: ArgTag::Output,
        };
        if pattern == "inference" && id % UPDATE_EVERY == 0 {
            return vec![Arg {
                tensor: slice(weights, 0, ROW),
                tag: ArgTag::InOut,
            }];
        }
        let src = match pattern {
            "private" => slice(input, row * ROW, ROW),
            "overlapping" => slice(weights, u32::try_from(id % 1024).unwrap(), ROW),
            _ => slice(weights, 0, ROW),
        };
        vec![
            Arg {
                tensor: src,
                tag: ArgTag::Input,
            },
            dst,
        ]
    };
    let mut group = c.benchmark_group("readers");
    group.sample_size(20);
    for pattern in ["private", "one_view", "overlapping", "inference"] {
        for n in [1_000u64, 10_000, 100_000, 1_000_000] {
            let mut dag = Dag::new();
            let mut live = VecDeque::new();
            let mut id = 0u64;
            let step = |dag: &mut Dag, live: &mut VecDeque<TaskId>, id: &mut u64| {
                *id += 1;
                dag.check_and_insert(NewTask::single(TaskId(*id), task(pattern, *id)))
                    .unwrap();
                live.push_back(TaskId(*id));
                // The oldest finishes once n are live (it is always ready:
                // its predecessors are older).
                if live.len() as u64 > n {
                    let old = live.pop_front().unwrap();
                    black_box(dag.complete(old).unwrap());
                }
            };
            for _ in 0..n {
                step(&mut dag, &mut live, &mut id);
            }
            group.bench_with_input(BenchmarkId::new(pattern, n), &n, |b, _| {
                b.iter(|| step(&mut dag, &mut live, &mut id))
            });
            assert_eq!(dag.live() as u64, n);
        }
    }
    group.finish();

    let mut group = c.benchmark_group("writer_after");
    group.sample_size(10);
    for n in [1_000u64, 10_000, 100_000, 1_000_000] {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut dag = Dag::new();
                    for id in 1..=n {
                        dag.check_and_insert(NewTask::single(TaskId(id), task("one_view", id)))
                            .unwrap();
                    }
                    let start = Instant::now();
                    let writer = TaskId(n + 1);
                    let w = dag
                        .check_and_insert(NewTask::single(
                            writer,
                            vec![Arg {
                                tensor: slice(weights, 0, ROW),
                                tag: ArgTag::Output,
                            }],
                        ))
                        .unwrap();
                    assert_eq!(w.edges.len() as u64, n);
                    for id in 1..=n {
                        black_box(dag.complete(TaskId(id)).unwrap());
                    }
                    dag.complete(writer).unwrap();
                    total += start.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = throughput, per_access, readers
}
criterion_main!(benches);
