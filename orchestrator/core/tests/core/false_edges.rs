//! No needless edges on tiled workloads: every direct edge the DAG builds
//! joins two tasks that really share a byte one of them writes (checked
//! against byte sets).

use strata_orchestrator_core::dag::{Arg, NewTask};
use strata_orchestrator_core::{Dag, TaskId};
use strata_wire::check::byte_set;
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
};

/// A T×T-element F32 tile grid of `rows`×`cols` tiles in one buffer.
struct Grid {
    desc: BufferDescriptor,
    cols: u32,
}

const T: u32 = 4;

impl Grid {
    fn new(id: u64, rows: u32, cols: u32) -> Grid {
        let identity = CanonicalIdentity::new(*b"falseedg", id, 1).unwrap();
        let nbytes = u64::from(rows * T * cols * T) * 4;
        let desc = BufferDescriptor::new(
            identity,
            nbytes,
            AddressSpace::Host,
            Access::ReadWrite,
            Backing::Memfd {
                st_dev: 0,
                st_ino: id,
            },
        )
        .unwrap();
        Grid { desc, cols }
    }

    fn tile(&self, i: u32, j: u32) -> Tensor {
        let row_elems = self.cols * T;
        let offset = (u64::from(i * T) * u64::from(row_elems) + u64::from(j * T)) * 4;
        Tensor::new(self.desc, offset, &[T, T], &[row_elems, 1], DType::F32).unwrap()
    }
}

/// Inserts `tasks` and counts direct edges between tasks that share no
/// byte where one writes.
fn false_edges(tasks: Vec<Vec<Arg>>) -> (usize, usize) {
    let mut dag = Dag::new();
    let mut edges = 0;
    let mut false_ones = 0;
    let bytes: Vec<Vec<(Arg, Vec<u64>)>> = tasks
        .iter()
        .map(|args| {
            args.iter()
                .map(|a| (*a, byte_set(&a.tensor).unwrap()))
                .collect()
        })
        .collect();
    for (j, args) in tasks.into_iter().enumerate() {
        let inserted = dag
            .check_and_insert(NewTask::single(TaskId(j as u64 + 1), args))
            .unwrap();
        for (p, _) in inserted.edges {
            edges += 1;
            let i = (p.0 - 1) as usize;
            let real = bytes[i].iter().any(|(a, ba)| {
                bytes[j].iter().any(|(b, bb)| {
                    a.tensor.identity() == b.tensor.identity()
                        && (a.tag.writes() || b.tag.writes())
                        && ba.iter().any(|x| bb.binary_search(x).is_ok())
                })
            });
            false_ones += usize::from(!real);
        }
    }
    (edges, false_ones)
}

fn arg(tensor: Tensor, tag: ArgTag) -> Arg {
    Arg { tensor, tag }
}

#[test]
fn blocked_matmul_has_no_false_edges() {
    let (m, n, k) = (4, 4, 4);
    let (a, b, c) = (Grid::new(1, m, k), Grid::new(2, k, n), Grid::new(3, m, n));
    let mut tasks = Vec::new();
    for p in 0..k {
        for i in 0..m {
            for j in 0..n {
                tasks.push(vec![
                    arg(a.tile(i, p), ArgTag::Input),
                    arg(b.tile(p, j), ArgTag::Input),
                    arg(c.tile(i, j), ArgTag::InOut),
                ]);
            }
        }
    }
    let (edges, false_ones) = false_edges(tasks);
    assert_eq!(false_ones, 0, "{false_ones} false edges of {edges}");
    // Each C tile is a chain of k updates: (k − 1)·m·n edges, nothing else.
    assert_eq!(edges as u32, (k - 1) * m * n);
}

#[test]
fn row_and_column_stencil_has_no_false_edges() {
    let (rows, cols) = (6, 6);
    let grids = [Grid::new(10, rows, cols), Grid::new(11, rows, cols)];
    let mut tasks = Vec::new();
    for step in 0..4 {
        let (src, dst) = (&grids[step % 2], &grids[(step + 1) % 2]);
        for i in 0..rows {
            for j in 0..cols {
                let mut args = vec![
                    arg(src.tile(i, j), ArgTag::Input),
                    arg(dst.tile(i, j), ArgTag::Output),
                ];
                for (di, dj) in [(-1i32, 0i32), (1, 0), (0, -1), (0, 1)] {
                    let (ni, nj) = (i as i32 + di, j as i32 + dj);
                    if (0..rows as i32).contains(&ni) && (0..cols as i32).contains(&nj) {
                        args.push(arg(src.tile(ni as u32, nj as u32), ArgTag::Input));
                    }
                }
                tasks.push(args);
            }
        }
    }
    // In place too: each task updates its tile from its row and column
    // neighbours' tiles.
    let g = Grid::new(12, rows, cols);
    for i in 0..rows {
        for j in 0..cols {
            let mut args = vec![arg(g.tile(i, j), ArgTag::InOut)];
            if j > 0 {
                args.push(arg(g.tile(i, j - 1), ArgTag::Input));
            }
            if i > 0 {
                args.push(arg(g.tile(i - 1, j), ArgTag::Input));
            }
            tasks.push(args);
        }
    }
    let (edges, false_ones) = false_edges(tasks);
    assert_eq!(false_ones, 0, "{false_ones} false edges of {edges}");
    assert!(edges > 0);
}
