//! `strata-bench`: strata's side of the benchmarks against Ray and StarPU
//! (docs/benchmarks.md; `scripts/bench.py` runs everything).
//!
//! Prints one JSON object per measurement on stdout:
//! `{"system": "strata", "scenario", "variant", "params", "value", "unit",
//! "ok", "detail"}`. Every scenario checks its result: a wrong result is
//! `"ok": false`, and the exit status is 1.
//!
//! ```text
//! strata-bench [--quick] [--scenario throughput|latency|stencil|handoff|remote|readers|cholesky|scale|hop]...
//!              [--link ring|grpc|in-process]... [--k TILES]...
//!              [--n READERS]... [--pattern P]... [--repeats R]
//!              [--cholesky-n N]... [--tile T]... [--scheduler least-loaded|dmda|dmdas]...
//! ```
//!
//! Each local scenario runs over every link (worker processes with the
//! ring, the same with the gRPC stream, in-process workers) unless
//! `--link` picks some; `readers` (many tasks reading the same bytes, see
//! `strata_bench/readers.rs`) runs over the ring unless `--link` picks;
//! `cholesky` (tiled Cholesky per scheduling policy, see
//! `strata_bench/cholesky.rs`) runs on 2 worker processes over the ring;
//! `scale` (tiled Cholesky and GEMM on 4–64 chips in timing mode, see
//! `strata_bench/scale.rs`) on in-process workers. `hop` (the dependent
//! hop of the Python package's figures, from Rust) runs only when named.

use std::path::PathBuf;

#[path = "strata_bench/cholesky.rs"]
mod cholesky;
#[path = "strata_bench/readers.rs"]
mod readers;
#[path = "strata_bench/scale.rs"]
mod scale;

/// The driver allocates per task; glibc's allocator under several threads
/// was the largest cost in its profile.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Duration, Instant};

use serde_json::json;
use strata_orchestrator::{Buffer, Cluster, ClusterBuilder, Task, Transport, View, WorkerId};
use strata_tests::kernels::fnv;
use strata_wire::DType;

struct Opts {
    quick: bool,
    scenarios: Vec<String>,
    links: Vec<Mode>,
    /// Stencil tile counts (default: all of them).
    ks: Vec<u32>,
    /// What the readers scenarios run (task counts by default by `quick`).
    readers: readers::Plan,
    /// What the Cholesky scenario runs.
    cholesky: cholesky::Plan,
    /// What the scale scenario runs.
    scale: scale::Plan,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        quick: false,
        scenarios: Vec::new(),
        links: Vec::new(),
        ks: Vec::new(),
        readers: readers::Plan {
            ns: Vec::new(),
            patterns: Vec::new(),
            repeats: 3,
        },
        cholesky: cholesky::Plan::new(false),
        scale: scale::Plan::new(false),
    };
    let mut chol_ns = Vec::new();
    let mut chips = Vec::new();
    let mut scale_links = Vec::new();
    let mut write_backs = Vec::new();
    let mut chol_tiles = Vec::new();
    let mut chol_policies = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--cholesky-n" => chol_ns.push(
                args.next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--cholesky-n needs a matrix order")?,
            ),
            "--tile" => chol_tiles.push(
                args.next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&t: &u32| t > 0)
                    .ok_or("--tile needs a tile size")?,
            ),
            "--scheduler" => chol_policies.push(strata_orchestrator::SchedulerPolicy::from_name(
                &args.next().ok_or("--scheduler needs a policy")?,
            )?),
            "--chips" => chips.push(
                args.next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&c: &usize| c > 0)
                    .ok_or("--chips needs a chip count of at least 1")?,
            ),
            "--scale-link" => scale_links.push(scale::link_named(
                &args.next().ok_or("--scale-link needs 16GB/s or 1GB/s")?,
            )?),
            "--write-back" => write_backs.push(
                match args
                    .next()
                    .ok_or("--write-back needs through or deferred")?
                    .as_str()
                {
                    "through" => strata_orchestrator::WriteBack::Through,
                    "deferred" => strata_orchestrator::WriteBack::Deferred,
                    other => {
                        return Err(format!("unknown write-back {other:?}; through or deferred"));
                    }
                },
            ),
            "--scenario" => o
                .scenarios
                .push(args.next().ok_or("--scenario needs a name")?),
            "--k" => o.ks.push(
                args.next()
                    .and_then(|k| k.parse().ok())
                    .filter(|&k| k >= 2)
                    .ok_or("--k needs a tile count of at least 2")?,
            ),
            "--n" => o.readers.ns.push(
                args.next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n >= 1)
                    .ok_or("--n needs a task count of at least 1")?,
            ),
            "--pattern" => o.readers.patterns.push(readers::Pattern::named(
                &args.next().ok_or("--pattern needs a readers pattern")?,
            )?),
            "--repeats" => {
                o.readers.repeats = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n >= 1)
                    .ok_or("--repeats needs a count of at least 1")?;
            }
            "--link" => {
                let l = args.next().ok_or("--link needs ring, grpc or in-process")?;
                o.links.push(match l.as_str() {
                    "ring" => Mode::Process,
                    "grpc" => Mode::Grpc,
                    "in-process" => Mode::InProcess,
                    other => {
                        return Err(format!("unknown link {other:?}; ring, grpc or in-process"));
                    }
                });
            }
            "-h" | "--help" => {
                println!(
                    "strata-bench [--quick] [--scenario throughput|latency|stencil|handoff|remote|readers|cholesky|scale|hop]... [--link ring|grpc|in-process]... [--k TILES]... [--n READERS]... [--pattern private|shared|overlapping|writer|inference]... [--repeats R] [--cholesky-n N]... [--tile T]... [--scheduler least-loaded|dmda|dmdas]... [--chips C]... [--scale-link 16GB/s|1GB/s]... [--write-back through|deferred]..."
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    const ALL: [&str; 8] = [
        "throughput",
        "latency",
        "stencil",
        "handoff",
        "remote",
        "readers",
        "cholesky",
        "scale",
    ];
    // Named only: not part of a run of everything.
    const OPT_IN: [&str; 1] = ["hop"];
    for s in &o.scenarios {
        if !ALL.contains(&s.as_str()) && !OPT_IN.contains(&s.as_str()) {
            return Err(format!(
                "unknown scenario {s:?}; one of {}, {}",
                ALL.join(", "),
                OPT_IN.join(", ")
            ));
        }
    }
    if o.scenarios.is_empty() {
        o.scenarios = ALL.iter().map(|s| (*s).to_owned()).collect();
    }
    if o.readers.ns.is_empty() {
        o.readers.ns = readers::default_ns(o.quick);
    }
    let defaults = cholesky::Plan::new(o.quick);
    o.cholesky = cholesky::Plan {
        ns: if chol_ns.is_empty() {
            defaults.ns
        } else {
            chol_ns
        },
        tiles: if chol_tiles.is_empty() {
            defaults.tiles
        } else {
            chol_tiles
        },
        repeats: if o.readers.repeats == 3 {
            defaults.repeats
        } else {
            o.readers.repeats
        },
        policies: if chol_policies.is_empty() {
            defaults.policies
        } else {
            chol_policies.clone()
        },
    };
    let defaults = scale::Plan::new(o.quick);
    o.scale = scale::Plan {
        chips: if chips.is_empty() {
            defaults.chips
        } else {
            chips
        },
        policies: if chol_policies.is_empty() {
            defaults.policies
        } else {
            chol_policies
        },
        tiles: defaults.tiles,
        links: if scale_links.is_empty() {
            defaults.links
        } else {
            scale_links
        },
        write_backs: if write_backs.is_empty() {
            defaults.write_backs
        } else {
            write_backs
        },
    };
    Ok(o)
}

/// The test worker binary next to this one (it has `test.touch` and the
/// `test.hash.*` kernels).
fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.with_file_name("strata-test-worker")
}

fn emit(
    scenario: &str,
    variant: &str,
    params: serde_json::Value,
    value: f64,
    unit: &str,
    ok: bool,
    detail: &str,
) -> bool {
    println!(
        "{}",
        json!({
            "system": "strata", "scenario": scenario, "variant": variant,
            "params": params, "value": value, "unit": unit, "ok": ok, "detail": detail,
        })
    );
    ok
}

/// Where a scenario's workers run, and what link reaches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One `strata-test-worker` process per chip, buffers passed by fd,
    /// tasks on the shared-memory ring (the default link).
    Process,
    /// The same processes with tasks on the gRPC stream
    /// (`ClusterBuilder::ring(false)`).
    Grpc,
    /// Worker nodes inside this process (`ClusterBuilder::in_process`).
    InProcess,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Process, Mode::Grpc, Mode::InProcess];

    /// The scenario's name in the results: `-grpc` and `-in-process` mark
    /// the other links.
    fn name(self, scenario: &str) -> String {
        match self {
            Mode::Process => scenario.to_owned(),
            Mode::Grpc => format!("{scenario}-grpc"),
            Mode::InProcess => format!("{scenario}-in-process"),
        }
    }

    /// The link each worker must have.
    fn transport(self) -> Transport {
        match self {
            Mode::Process => Transport::Ring,
            Mode::Grpc => Transport::GrpcUnix,
            Mode::InProcess => Transport::InProcess,
        }
    }
}

fn local(mode: Mode, n: usize, device: &str) -> Result<Cluster, String> {
    local_from(Cluster::builder().window(256), mode, n, device)
}

/// As [`local`], from a builder with more settings (the window is the
/// builder's: [`local`] sets 256).
///
/// `STRATA_SCHEDULER` (least-loaded, dmda, dmdas) sets the scheduling
/// policy of every scenario's cluster but the Cholesky's, which sets its
/// own: for measuring what placement by the models costs per task.
fn local_from(b: ClusterBuilder, mode: Mode, n: usize, device: &str) -> Result<Cluster, String> {
    let mut b = b.device(device);
    if let Ok(name) = std::env::var("STRATA_SCHEDULER") {
        b = b.scheduler(strata_orchestrator::SchedulerPolicy::from_name(&name)?);
    }
    let cluster = match mode {
        Mode::Process => b.local(n).worker_binary(worker_binary()),
        Mode::Grpc => b.local(n).worker_binary(worker_binary()).ring(false),
        Mode::InProcess => b.in_process(n).kernels(strata_tests::kernels::registry()?),
    }
    .start()
    .map_err(|e| e.to_string())?;
    // A figure is only worth its name if the link is the one it says.
    for w in cluster.workers() {
        if w.transport != mode.transport() {
            return Err(format!(
                "worker {} is reached over {}, not {}",
                w.id,
                w.transport,
                mode.transport()
            ));
        }
    }
    Ok(cluster)
}

fn throughput(mode: Mode, quick: bool) -> Result<bool, String> {
    let n: u64 = if quick { 10_000 } else { 100_000 };
    let cluster = local(mode, 2, "sim:mode=unified")?;
    for _ in 0..1000 {
        cluster
            .submit(Task::new("noop"))
            .map_err(|e| e.to_string())?;
    }
    cluster.wait_all().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    for _ in 0..n {
        cluster
            .submit(Task::new("noop"))
            .map_err(|e| e.to_string())?;
    }
    let submitted = t0.elapsed();
    let s = cluster.wait_all().map_err(|e| e.to_string())?;
    let wall = t0.elapsed();
    Ok(emit(
        &mode.name("throughput"),
        "tasks",
        json!({"tasks": n, "workers": 2}),
        n as f64 / wall.as_secs_f64(),
        "tasks/s",
        s.succeeded == n,
        &format!(
            "submit {:.2} us/task; {} succeeded",
            submitted.as_secs_f64() * 1e6 / n as f64,
            s.succeeded
        ),
    ))
}

/// What `test.hash.<pattern>` computes (see strata_tests::kernels) for
/// task scalar `task` over u64 arguments: the new contents of each
/// written argument.
fn hash_kernel(task: u64, args: &[(&[u64], bool, bool)]) -> Vec<Vec<u64>> {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ task;
    for (i, (data, reads, _)) in args.iter().enumerate() {
        if *reads {
            fnv(&mut h, &(i as u64).to_le_bytes());
            for v in *data {
                fnv(&mut h, &v.to_le_bytes());
            }
        }
    }
    args.iter()
        .enumerate()
        .filter(|(_, (_, _, writes))| *writes)
        .map(|(i, (data, _, _))| {
            (0..data.len())
                .map(|k| {
                    let mut x = h;
                    fnv(&mut x, &[i as u8]);
                    fnv(&mut x, &(k as u64).to_le_bytes());
                    x
                })
                .collect()
        })
        .collect()
}

fn latency(mode: Mode, quick: bool) -> Result<bool, String> {
    let n: u64 = if quick { 1_000 } else { 10_000 };
    let cluster = local(mode, 2, "sim:mode=unified")?;
    let cell = cluster.buffer(8).map_err(|e| e.to_string())?;
    let v = cell.tensor(&[1], DType::U64).map_err(|e| e.to_string())?;
    let run = |count: u64, base: u64| -> Result<Duration, String> {
        let t0 = Instant::now();
        for i in 0..count {
            cluster
                .submit(
                    Task::new("test.hash.x")
                        .inout(&v)
                        .scalar_u64(base + i)
                        .on(WorkerId((i % 2) as u32)),
                )
                .map_err(|e| e.to_string())?;
        }
        cluster.wait_all().map_err(|e| e.to_string())?;
        Ok(t0.elapsed())
    };
    run(100, 0)?;
    let mut want = cell.to_vec::<u64>().map_err(|e| e.to_string())?;
    let wall = run(n, 1_000_000)?;
    for i in 0..n {
        want = hash_kernel(1_000_000 + i, &[(&want, true, true)]).remove(0);
    }
    let got = cell.to_vec::<u64>().map_err(|e| e.to_string())?;
    Ok(emit(
        &mode.name("latency"),
        "data",
        json!({"tasks": n, "workers": 2}),
        wall.as_secs_f64() * 1e6 / n as f64,
        "us/hop",
        got == want,
        "each task reads and writes one 8-byte cell (INOUT) on the other worker",
    ))
}

/// The dependent hop as the Python package's figures measure it
/// (`python/bench/figures.py`), from Rust: `axpy` of one `f32[8]` view into
/// another on alternate workers, the first 1,000 hops of a fresh cluster
/// (nothing run before), the next 1,000, then the next 9,000, each wall
/// time to the end of `wait_all`. The same tasks from both drivers, so
/// the ratio of the two is what the Python layer costs per hop. First
/// against second is what a fresh cluster costs (the same count, so the
/// same burst to take in); second against the 9,000 is what a burst of
/// 1,000 costs to take in beside its hops.
fn hop(mode: Mode, quick: bool) -> Result<bool, String> {
    let (first, next): (u32, u32) = if quick {
        (1_000, 1_000)
    } else {
        (1_000, 9_000)
    };
    let second = first;
    // The Python package's default window (the builder's).
    let cluster = local_from(Cluster::builder(), mode, 2, "sim:mode=unified")?;
    let (xb, yb) = (
        cluster.buffer(32).map_err(|e| e.to_string())?,
        cluster.buffer(32).map_err(|e| e.to_string())?,
    );
    let x = xb.tensor(&[8], DType::F32).map_err(|e| e.to_string())?;
    let y = yb.tensor(&[8], DType::F32).map_err(|e| e.to_string())?;
    x.write(&[1.0f32; 8]).map_err(|e| e.to_string())?;
    let run = |count: u32| -> Result<f64, String> {
        let t0 = Instant::now();
        for i in 0..count {
            cluster
                .submit(
                    Task::new("axpy")
                        .input(&x)
                        .inout(&y)
                        .scalar_f64(0.5)
                        .on(WorkerId(i % 2)),
                )
                .map_err(|e| e.to_string())?;
        }
        cluster.wait_all().map_err(|e| e.to_string())?;
        Ok(t0.elapsed().as_secs_f64() * 1e6 / f64::from(count))
    };
    let (a, a2, b) = (run(first)?, run(second)?, run(next)?);
    // Every hop added half of x's ones to y.
    let got = yb.to_vec::<f32>().map_err(|e| e.to_string())?;
    let ok = got
        .iter()
        .all(|&v| v == 0.5 * (first + second + next) as f32);
    let detail = "axpy of one f32[8] view into another on alternate workers, from a fresh cluster (as python/bench/figures.py)";
    let params = |n: u32| json!({"tasks": n, "workers": 2});
    Ok(emit(
        &mode.name("hop"),
        "first-1000",
        params(first),
        a,
        "us/hop",
        ok,
        detail,
    ) & emit(
        &mode.name("hop"),
        "second-1000",
        params(second),
        a2,
        "us/hop",
        ok,
        detail,
    ) & emit(
        &mode.name("hop"),
        "later",
        params(next),
        b,
        "us/hop",
        ok,
        detail,
    ))
}

fn stencil(mode: Mode, quick: bool, only: &[u32]) -> Result<bool, String> {
    let ks: &[u32] = if !only.is_empty() {
        only
    } else if quick {
        &[16, 256]
    } else {
        &[16, 64, 256, 1024, 4096]
    };
    let cluster = local(mode, 2, "sim:mode=unified")?;
    let tile = 64u32;
    let mut all_ok = true;
    for &k in ks {
        let target = if quick { 5_000 } else { 50_000 };
        let steps = (target / k as usize).max(2);
        let buf = cluster
            .buffer(u64::from(k) * u64::from(tile) * 8)
            .map_err(|e| e.to_string())?;
        // f64 values as U64 bits (the tiles of `test.tile.*`).
        let init: Vec<f64> = (0..k * tile)
            .map(|e| {
                if e % tile == 0 {
                    0.0
                } else {
                    f64::from(e % 1000)
                }
            })
            .collect();
        let bits: Vec<u64> = init.iter().map(|x| x.to_bits()).collect();
        buf.write_slice(0, &bits).map_err(|e| e.to_string())?;
        let views: Vec<_> = (0..k)
            .map(|i| buf.tensor_at(u64::from(i * tile) * 8, &[tile], DType::U64))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let mut id = 0u64;
        for _ in 0..steps {
            for i in 0..k as usize {
                let mut t = Task::new(match (i > 0, i + 1 < k as usize) {
                    (true, true) => "test.tile.rrx",
                    (false, false) => "test.tile.x",
                    _ => "test.tile.rx",
                });
                if i > 0 {
                    t = t.input(&views[i - 1]);
                }
                if i + 1 < k as usize {
                    t = t.input(&views[i + 1]);
                }
                cluster
                    .submit(t.inout(&views[i]))
                    .map_err(|e| e.to_string())?;
                id += 1;
            }
        }
        let s = cluster.wait_all().map_err(|e| e.to_string())?;
        let wall = t0.elapsed();
        // The sequential oracle: the same tasks one by one.
        let mut mem: Vec<Vec<f64>> = init.chunks(tile as usize).map(<[f64]>::to_vec).collect();
        for _ in 0..steps {
            for i in 0..k as usize {
                let mut own = std::mem::take(&mut mem[i]);
                let mut neighbours: Vec<&[f64]> = Vec::new();
                if i > 0 {
                    neighbours.push(&mem[i - 1]);
                }
                if i + 1 < k as usize {
                    neighbours.push(&mem[i + 1]);
                }
                strata_tests::kernels::tile_update(&mut own, &neighbours);
                mem[i] = own;
            }
        }
        let got: Vec<f64> = buf
            .to_vec::<u64>()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(f64::from_bits)
            .collect();
        let ok = got == mem.concat() && s.succeeded == id;
        all_ok &= emit(
            &mode.name("stencil"),
            &format!("k={k}"),
            json!({"tiles": k, "steps": steps, "tasks": id, "tile_bytes": tile * 8, "workers": 2}),
            wall.as_secs_f64() * 1e6 / id as f64,
            "us/task",
            ok,
            &format!("{} edges inferred", s.edges),
        );
    }
    Ok(all_ok)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// How long `test.touch` takes on `v`, from submit to completion.
fn time_touch(cluster: &Cluster, v: &View) -> Result<Duration, String> {
    let t0 = Instant::now();
    let h = cluster
        .submit(Task::new("test.touch").input(v))
        .map_err(|e| e.to_string())?;
    cluster.wait(h).map_err(|e| e.to_string())?;
    Ok(t0.elapsed())
}

/// A fresh buffer of `bytes` (a multiple of 8) as one U64 view.
fn fresh_view(cluster: &Cluster, bytes: u64) -> Result<(Buffer, View), String> {
    let b = cluster.buffer(bytes).map_err(|e| e.to_string())?;
    let v = b
        .tensor(&[(bytes / 8) as u32], DType::U64)
        .map_err(|e| e.to_string())?;
    Ok((b, v))
}

fn sizes(quick: bool, full: &[(u64, &'static str)]) -> Vec<(u64, &'static str)> {
    if quick {
        full[..2].to_vec()
    } else {
        full.to_vec()
    }
}

fn handoff(mode: Mode, quick: bool) -> Result<bool, String> {
    let cluster = local(mode, 1, "sim:mode=unified")?;
    let w = cluster.workers()[0].id;
    let mut all_ok = true;
    for (bytes, label) in sizes(
        quick,
        &[(1 << 20, "1MiB"), (64 << 20, "64MiB"), (1 << 30, "1GiB")],
    ) {
        let reps = if bytes >= 1 << 30 { 3 } else { 5 };
        let mut samples = Vec::new();
        for _ in 0..reps {
            // Prepared by the driver before the clock starts.
            let (b, v) = fresh_view(&cluster, bytes)?;
            b.write_bytes(bytes - 8, &7u64.to_le_bytes())
                .map_err(|e| e.to_string())?;
            samples.push(time_touch(&cluster, &v)?);
        }
        let st = cluster.worker_stats(w).map_err(|e| e.to_string())?;
        let copied =
            st.staged_to_device + st.staged_to_host + st.copied_to_device + st.copied_to_host;
        all_ok &= emit(
            &mode.name("handoff"),
            label,
            json!({"bytes": bytes, "repetitions": reps}),
            median(samples).as_secs_f64() * 1e3,
            "ms",
            copied == 0,
            &format!("{mode:?} worker, fd passed, unified device; {copied} bytes copied"),
        );
    }
    Ok(all_ok)
}

/// The view sizes of the remote scenarios, both ways.
const REMOTE_SIZES: &[(u64, &str)] = &[
    (1 << 20, "1MiB"),
    (16 << 20, "16MiB"),
    (48 << 20, "48MiB"),
    (128 << 20, "128MiB"),
];

fn remote(quick: bool) -> Result<bool, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let token = dir.path().join("token");
    std::fs::write(&token, "bench").map_err(|e| e.to_string())?;
    let w = strata_tests::WorkerProcess::spawn_tcp(
        &worker_binary(),
        &[],
        &[
            "--token-file",
            token.to_str().unwrap_or_default(),
            "--device",
            "sim:mode=unified",
        ],
    );
    let cluster = Cluster::builder()
        .connect(&w.endpoint.to_string(), Some("bench"))
        .map_err(|e| e.to_string())?
        .start()
        .map_err(|e| e.to_string())?;
    let mut all_ok = true;
    // Views under the 64 MiB message limit travel in the task's message;
    // the 128 MiB one is staged ahead of it in chunks.
    for (bytes, label) in sizes(quick, REMOTE_SIZES) {
        let mut samples = Vec::new();
        let mut ok = true;
        for _ in 0..5 {
            let (_b, v) = fresh_view(&cluster, bytes)?;
            let before = cluster.totals().map_err(|e| e.to_string())?.sent_bytes;
            samples.push(time_touch(&cluster, &v)?);
            let sent = cluster.totals().map_err(|e| e.to_string())?.sent_bytes - before;
            ok &= sent == bytes;
        }
        let m = median(samples);
        all_ok &= emit(
            "remote",
            label,
            json!({"bytes": bytes, "repetitions": 5}),
            bytes as f64 / m.as_secs_f64() / 1e9,
            "GB/s",
            ok,
            &format!(
                "TCP loopback with a token; median {:.2} ms submit to completion",
                m.as_secs_f64() * 1e3
            ),
        );
    }
    // The other way: a task that writes the whole view (OUTPUT, so no
    // bytes go down), its bytes coming back with the completion (fetched
    // after it, for the view larger than a message).
    for (bytes, label) in sizes(quick, REMOTE_SIZES) {
        let mut samples = Vec::new();
        let mut ok = true;
        for rep in 0..5u64 {
            let (b, v) = fresh_view(&cluster, bytes)?;
            let before = cluster.totals().map_err(|e| e.to_string())?.returned_bytes;
            let t0 = Instant::now();
            let h = cluster
                .submit(Task::new("test.mark").output(&v).scalar_u64(rep + 7))
                .map_err(|e| e.to_string())?;
            cluster.wait(h).map_err(|e| e.to_string())?;
            samples.push(t0.elapsed());
            let back = cluster.totals().map_err(|e| e.to_string())?.returned_bytes - before;
            let tail = b
                .tensor_at(bytes - 8, &[1], DType::U64)
                .and_then(|t| t.read::<u64>())
                .map_err(|e| e.to_string())?;
            ok &= back == bytes && tail == [rep + 7];
        }
        let m = median(samples);
        all_ok &= emit(
            "remote-back",
            label,
            json!({"bytes": bytes, "repetitions": 5}),
            bytes as f64 / m.as_secs_f64() / 1e9,
            "GB/s",
            ok,
            &format!(
                "TCP loopback with a token, written bytes back to the driver; median {:.2} ms submit to completion",
                m.as_secs_f64() * 1e3
            ),
        );
    }
    Ok(all_ok)
}

fn main() {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("strata-bench: {e}");
            std::process::exit(2);
        }
    };
    let mut ok = true;
    for s in &opts.scenarios {
        // No --link: every link, but readers over the ring only.
        let modes: &[Mode] = match (s.as_str(), opts.links.is_empty()) {
            ("remote", _) => &[],
            ("readers" | "cholesky", true) => &[Mode::Process],
            ("scale", _) => &[Mode::InProcess],
            (_, true) => &Mode::ALL,
            (_, false) => &opts.links,
        };
        let mut runs: Vec<(String, Result<bool, String>)> = modes
            .iter()
            .map(|&mode| {
                let r = match s.as_str() {
                    "throughput" => throughput(mode, opts.quick),
                    "latency" => latency(mode, opts.quick),
                    "hop" => hop(mode, opts.quick),
                    "stencil" => stencil(mode, opts.quick, &opts.ks),
                    "readers" => readers::readers(mode, &opts.readers),
                    "cholesky" => cholesky::cholesky(&opts.cholesky),
                    "scale" => scale::scale(&opts.scale),
                    _ => handoff(mode, opts.quick),
                };
                (mode.name(s), r)
            })
            .collect();
        if s == "remote" {
            runs.push((s.clone(), remote(opts.quick)));
        }
        for (name, r) in runs {
            match r {
                Ok(good) => ok &= good,
                Err(e) => {
                    ok = false;
                    emit(&name, "error", json!({}), 0.0, "", false, &e);
                }
            }
        }
    }
    std::process::exit(i32::from(!ok));
}
