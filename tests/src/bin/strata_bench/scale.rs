//! Schedules at scale: tiled Cholesky and tiled GEMM on 4 to 64 simulated
//! chips in timing mode (`sim:timing=on`: kernels take their flops at a
//! modelled rate instead of computing) behind a modelled link (every byte
//! staged to or from a chip also takes the link's bandwidth and latency),
//! in-process workers, per scheduling policy.
//!
//! Each figure is the makespan of the second run on one cluster (the
//! first calibrates the performance models), against the lower bound
//! `max(critical path, total work / chips)` computed here from the same
//! task graph and the same flop rate (transfers cost the bound nothing, so
//! a schedule that moves bytes it need not shows). The results are not
//! checked (timing mode computes nothing); the graph is.
//!
//! Each runs with written tiles going back to host memory when their task
//! ends (write-through, the cluster's default: every task's output
//! crosses the link) and, in the full run, kept on the chips until needed
//! (deferred write-back, as StarPU keeps data on its accelerators). With
//! `STRATA_SCALE_TRACE=DIR` set, each second run's trace is written there
//! (Chrome trace-event JSON).

use std::time::Instant;

use serde_json::json;
use strata_orchestrator::{Cluster, SchedulerPolicy, Task, WriteBack};
use strata_wire::DType;

use super::emit;

/// The modelled chip: 10 GFlop/s, behind a 16 GB/s link (a PCIe 4 card's
/// share) or a 1 GB/s one (where moving a tile costs a tenth of computing
/// on it), 5 µs per transfer.
const GFLOPS: u32 = 10;
const DEVICES: [(&str, &str); 2] = [
    (
        "16GB/s",
        "sim:mem=256MiB,timing=on,gflops=10,link=16GB,latency=5",
    ),
    (
        "1GB/s",
        "sim:mem=256MiB,timing=on,gflops=10,link=1GB,latency=5",
    ),
];

/// What the scenario runs.
pub(crate) struct Plan {
    pub(crate) chips: Vec<usize>,
    pub(crate) policies: Vec<SchedulerPolicy>,
    /// Tiles a side: the Cholesky's and the GEMM's.
    pub(crate) tiles: (u32, u32),
    /// Indices into [`DEVICES`].
    pub(crate) links: Vec<usize>,
    /// When written tiles go back to host memory.
    pub(crate) write_backs: Vec<WriteBack>,
}

/// The index in [`DEVICES`] of a link's name.
pub(crate) fn link_named(name: &str) -> Result<usize, String> {
    DEVICES.iter().position(|(n, _)| *n == name).ok_or_else(|| {
        let names: Vec<&str> = DEVICES.iter().map(|(n, _)| *n).collect();
        format!("unknown link {name:?}; one of {}", names.join(", "))
    })
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Plan {
        Plan {
            chips: if quick { vec![4] } else { vec![4, 8, 16, 64] },
            policies: SchedulerPolicy::ALL.iter().map(|(_, p)| *p).collect(),
            tiles: if quick { (8, 4) } else { (16, 8) },
            links: if quick {
                vec![0]
            } else {
                (0..DEVICES.len()).collect()
            },
            write_backs: if quick {
                vec![WriteBack::Through]
            } else {
                vec![WriteBack::Through, WriteBack::Deferred]
            },
        }
    }
}

/// One tile task of a workload: its kernel, flops, the tiles it reads and
/// the one it updates (a tile is `(matrix, row, column)`), and whether its
/// second input is read transposed.
struct TileTask {
    kernel: &'static str,
    flops: u64,
    reads: Vec<(u8, u32, u32)>,
    writes: (u8, u32, u32),
    scalars: Vec<f64>,
    transposed_second: bool,
}

/// A tiled workload: `tiles × tiles` tiles of `tile²` F32 per matrix.
struct Workload {
    name: &'static str,
    matrices: u8,
    tiles: u32,
    tile: u32,
    tasks: Vec<TileTask>,
}

fn cholesky(tiles: u32, tile: u32) -> Workload {
    let b = u64::from(tile);
    let mut tasks = Vec::new();
    for k in 0..tiles {
        tasks.push(TileTask {
            kernel: "potrf",
            flops: b * b * b / 3,
            reads: vec![],
            writes: (0, k, k),
            scalars: vec![],
            transposed_second: false,
        });
        for i in k + 1..tiles {
            tasks.push(TileTask {
                kernel: "trsm",
                flops: b * b * b,
                reads: vec![(0, k, k)],
                writes: (0, i, k),
                scalars: vec![],
                transposed_second: false,
            });
        }
        for i in k + 1..tiles {
            tasks.push(TileTask {
                kernel: "syrk",
                flops: b * b * b,
                reads: vec![(0, i, k)],
                writes: (0, i, i),
                scalars: vec![],
                transposed_second: false,
            });
            for j in k + 1..i {
                tasks.push(TileTask {
                    kernel: "gemm",
                    flops: 2 * b * b * b,
                    reads: vec![(0, i, k), (0, j, k)],
                    writes: (0, i, j),
                    scalars: vec![-1.0, 1.0],
                    transposed_second: true,
                });
            }
        }
    }
    Workload {
        name: "cholesky",
        matrices: 1,
        tiles,
        tile,
        tasks,
    }
}

/// `C = A·B`: per tile of C, `gemm` with β = 0 then with β = 1 along k.
fn gemm(tiles: u32, tile: u32) -> Workload {
    let b = u64::from(tile);
    let mut tasks = Vec::new();
    for k in 0..tiles {
        for i in 0..tiles {
            for j in 0..tiles {
                tasks.push(TileTask {
                    kernel: "gemm",
                    flops: 2 * b * b * b,
                    reads: vec![(0, i, k), (1, k, j)],
                    writes: (2, i, j),
                    scalars: vec![1.0, if k == 0 { 0.0 } else { 1.0 }],
                    transposed_second: false,
                });
            }
        }
    }
    Workload {
        name: "gemm",
        matrices: 3,
        tiles,
        tile,
        tasks,
    }
}

/// Each task's predecessors in the graph the tiles' reads and writes make
/// (read after write, write after read, write after write), and its
/// duration in seconds at [`GFLOPS`].
fn graph(w: &Workload) -> (Vec<Vec<usize>>, Vec<f64>) {
    use std::collections::HashMap;
    let mut preds = vec![Vec::new(); w.tasks.len()];
    let mut last_writer: HashMap<(u8, u32, u32), usize> = HashMap::new();
    let mut readers: HashMap<(u8, u32, u32), Vec<usize>> = HashMap::new();
    for (n, t) in w.tasks.iter().enumerate() {
        let p = &mut preds[n];
        p.extend(t.reads.iter().filter_map(|r| last_writer.get(r).copied()));
        p.extend(last_writer.get(&t.writes).copied());
        p.extend(readers.get(&t.writes).into_iter().flatten().copied());
        p.sort_unstable();
        p.dedup();
        for r in &t.reads {
            readers.entry(*r).or_default().push(n);
        }
        readers.remove(&t.writes);
        last_writer.insert(t.writes, n);
    }
    let secs = w
        .tasks
        .iter()
        .map(|t| t.flops as f64 / (f64::from(GFLOPS) * 1e9))
        .collect();
    (preds, secs)
}

/// `(critical path, total work)` in seconds.
fn bounds(w: &Workload) -> (f64, f64) {
    let (preds, secs) = graph(w);
    let mut finish = vec![0f64; secs.len()];
    for t in 0..secs.len() {
        let start = preds[t].iter().map(|&p| finish[p]).fold(0.0, f64::max);
        finish[t] = start + secs[t];
    }
    (
        finish.iter().copied().fold(0.0, f64::max),
        secs.iter().sum(),
    )
}

/// The makespan of an ideal list schedule on `chips` identical chips: no
/// transfers, no overheads, ready tasks taken by upward rank (HEFT's
/// order) as chips free up. What a perfect runtime with that policy would
/// reach: the gap between it and the bound is the graph's, not strata's.
fn ideal(w: &Workload, chips: usize) -> f64 {
    let (preds, secs) = graph(w);
    let n = secs.len();
    let mut succs = vec![Vec::new(); n];
    for (t, ps) in preds.iter().enumerate() {
        for &p in ps {
            succs[p].push(t);
        }
    }
    let mut rank = secs.clone();
    for t in (0..n).rev() {
        let below = succs[t].iter().map(|&s| rank[s]).fold(0.0, f64::max);
        rank[t] = secs[t] + below;
    }
    let mut unmet: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..n).filter(|&t| unmet[t] == 0).collect();
    // (finish time, task) of what runs.
    let mut running: Vec<(f64, usize)> = Vec::new();
    let (mut now, mut free, mut done) = (0f64, chips, 0usize);
    while done < n {
        ready.sort_by(|a, b| rank[*b].total_cmp(&rank[*a]));
        while free > 0 && !ready.is_empty() {
            let t = ready.remove(0);
            running.push((now + secs[t], t));
            free -= 1;
        }
        let Some(i) = (0..running.len()).min_by(|&a, &b| running[a].0.total_cmp(&running[b].0))
        else {
            break;
        };
        let (end, t) = running.swap_remove(i);
        now = end;
        free += 1;
        done += 1;
        for &s in &succs[t] {
            unmet[s] -= 1;
            if unmet[s] == 0 {
                ready.push(s);
            }
        }
    }
    now
}

/// Runs the workload on `cluster` once; the makespan in seconds.
fn run(
    cluster: &Cluster,
    w: &Workload,
    mats: &[strata_orchestrator::Buffer],
) -> Result<f64, String> {
    let n = w.tiles * w.tile;
    let view = |m: u8, i: u32, j: u32, t: bool| {
        let offset = (u64::from(i) * u64::from(n) + u64::from(j)) * u64::from(w.tile) * 4;
        let strides = if t { [1, n] } else { [n, 1] };
        mats[usize::from(m)]
            .view(offset, &[w.tile, w.tile], &strides, DType::F32)
            .map_err(|e| e.to_string())
    };
    let start = Instant::now();
    for t in &w.tasks {
        let mut task = Task::new(t.kernel);
        for (k, &(m, i, j)) in t.reads.iter().enumerate() {
            task = task.input(&view(m, i, j, k == 1 && t.transposed_second)?);
        }
        let (m, i, j) = t.writes;
        task = task.inout(&view(m, i, j, false)?).flops(t.flops);
        for &s in &t.scalars {
            task = task.scalar_f64(s);
        }
        cluster.submit(task).map_err(|e| e.to_string())?;
    }
    cluster.wait_all().map_err(|e| e.to_string())?;
    Ok(start.elapsed().as_secs_f64())
}

pub(crate) fn scale(plan: &Plan) -> Result<bool, String> {
    let mut ok = true;
    for &(link, device) in plan.links.iter().map(|&l| &DEVICES[l]) {
        for w in [cholesky(plan.tiles.0, 256), gemm(plan.tiles.1, 512)] {
            let (critical, work) = bounds(&w);
            for &chips in &plan.chips {
                let bound = critical.max(work / chips as f64);
                let ideal = ideal(&w, chips);
                for (&policy, &write_back) in plan
                    .policies
                    .iter()
                    .flat_map(|p| plan.write_backs.iter().map(move |w| (p, w)))
                {
                    let cluster = Cluster::builder()
                        .in_process(chips)
                        .device(device)
                        .scheduler(policy)
                        .write_back(write_back)
                        .trace(std::env::var_os("STRATA_SCALE_TRACE").is_some())
                        .window(256)
                        .start()
                        .map_err(|e| e.to_string())?;
                    let n = u64::from(w.tiles * w.tile);
                    let mats = (0..w.matrices)
                        .map(|_| cluster.buffer(n * n * 4).map_err(|e| e.to_string()))
                        .collect::<Result<Vec<_>, _>>()?;
                    // The first run calibrates the models; the second counts.
                    let first = run(&cluster, &w, &mats)?;
                    let before = cluster.totals().map_err(|e| e.to_string())?;
                    let _ = cluster.take_trace();
                    let makespan = run(&cluster, &w, &mats)?;
                    let totals = cluster.totals().map_err(|e| e.to_string())?;
                    if let Some(dir) = std::env::var_os("STRATA_SCALE_TRACE") {
                        if let Ok(Some(t)) = cluster.take_trace() {
                            let path = std::path::Path::new(&dir).join(format!(
                                "{}-{chips}-{}-{}-{write_back:?}.json",
                                w.name,
                                link.replace('/', ""),
                                policy.name()
                            ));
                            t.write_chrome(path, cluster.workers())
                                .map_err(|e| e.to_string())?;
                        }
                    }
                    cluster.shutdown().map_err(|e| e.to_string())?;
                    let ratio = makespan / bound;
                    ok &= emit(
                        "scale",
                        &if write_back == WriteBack::Through {
                            format!("{}-{}", w.name, policy.name())
                        } else {
                            format!(
                                "{}-{}-{}",
                                w.name,
                                policy.name(),
                                format!("{write_back:?}").to_lowercase()
                            )
                        },
                        json!({
                            "workload": w.name, "policy": policy.name(), "chips": chips, "link": link,
                            "write_back": format!("{write_back:?}").to_lowercase(),
                            "tiles": w.tiles, "tile": w.tile, "tasks": w.tasks.len(),
                            "device": device, "makespan_s": makespan, "first_run_s": first,
                            "bound_s": bound, "critical_path_s": critical, "work_s": work,
                            "ideal_s": ideal, "x_ideal": makespan / ideal,
                            "to_device_bytes": totals.to_device_bytes - before.to_device_bytes,
                            "from_device_bytes": totals.from_device_bytes - before.from_device_bytes,
                            "prefetched_bytes": totals.prefetched_bytes - before.prefetched_bytes,
                            "model_error": totals.prediction_error(),
                        }),
                        ratio,
                        "x bound",
                        true,
                        &format!(
                            "link {link}: makespan {:.1} ms, bound {:.1} ms (critical path {:.1}, work/chips {:.1}), ideal list schedule {:.1} ms",
                            makespan * 1e3,
                            bound * 1e3,
                            critical * 1e3,
                            work / chips as f64 * 1e3,
                            ideal * 1e3
                        ),
                    );
                }
            }
        }
    }
    Ok(ok)
}
