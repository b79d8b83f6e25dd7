//! The `readers` scenarios: what a task costs when N unfinished
//! tasks read the same bytes, against N that read bytes of their own.
//!
//! Every task is the built-in `copy` of 64 F32 elements into its own row
//! of `y`; what it reads is the pattern:
//! - `private`: row i of `s` (N rows);
//! - `shared`: all of `x` (64 elements);
//! - `overlapping`: elements `i mod 1024 .. +64` of `w` (1,088 elements):
//!   a different window of one buffer, overlapping its neighbours';
//! - `writer`: the shared readers, then one `copy` that overwrites `x`,
//!   which must follow all N;
//! - `inference`: the shared weights `x`, with a weight update (`axpy`,
//!   `x += 1`, INOUT) after every [`K`] readers, which must follow the
//!   readers before it and precede those after it.
//!
//! **All N unfinished at once.** Left alone, the workers would run the
//! first tasks while the later ones are submitted, and N would not be the
//! number of live readers. So each run starts with a blocker,
//! `test.slow` writing the whole of `y` (OUTPUT) and sleeping; every task
//! writes a row of `y` and waits for it (one edge per task, in every
//! pattern alike). The sleep is sized to outlast the submissions
//! (from the previous run's pace, tripled on a retry) and checked: a run
//! counts only if, once the last task is submitted and taken by the DAG
//! actor (a `totals` round trip), every task of the run is unfinished.
//! The cluster's `max_unfinished` is raised above the largest run, which
//! its default (65,536) would otherwise cap; the window (256 members per
//! worker) bounds what is dispatched, not what is live.
//!
//! **The figure** is the submit phase (first submit to that round trip)
//! plus the drain (the blocker's completion to the run's last), divided by
//! the run's tasks; the sleep between is not counted. Every run checks the
//! bytes of `y` (and of `x` where it is written) against what one-by-one
//! execution leaves.

use std::time::{Duration, Instant};

use serde_json::json;
use strata_orchestrator::{Buffer, Cluster, Task, View};
use strata_wire::DType;

use crate::{Mode, emit, local_from};

/// Elements per row (and per read view).
const ROW: usize = 64;
/// The overlapping windows: as many distinct starts.
const WINDOWS: usize = 1024;
/// Tasks between two weight updates of the inference pattern.
const K: usize = 1000;
/// What `y` holds before a run: no task writes it.
const SENTINEL: f32 = -1.0;

/// What the readers read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pattern {
    Private,
    Shared,
    Overlapping,
    Writer,
    Inference,
}

impl Pattern {
    const ALL: [Pattern; 5] = [
        Pattern::Private,
        Pattern::Shared,
        Pattern::Overlapping,
        Pattern::Writer,
        Pattern::Inference,
    ];

    /// The pattern named `name`.
    pub(crate) fn named(name: &str) -> Result<Pattern, String> {
        Pattern::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                let all: Vec<_> = Pattern::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown readers pattern {name:?}; one of {}",
                    all.join(", ")
                )
            })
    }

    fn name(self) -> &'static str {
        match self {
            Pattern::Private => "private",
            Pattern::Shared => "shared",
            Pattern::Overlapping => "overlapping",
            Pattern::Writer => "writer",
            Pattern::Inference => "inference",
        }
    }

    /// The tasks of a run of `n` readers, blocker aside.
    fn tasks(self, n: usize) -> usize {
        match self {
            Pattern::Writer => n + 1,
            Pattern::Inference => n + n / K,
            _ => n,
        }
    }
}

/// The bytes and views of the runs of one N (made before any clock).
struct Bufs {
    n: usize,
    y: Buffer,
    y_all: View,
    rows: Vec<View>,
    s: Buffer,
    s_rows: Vec<View>,
    x: Buffer,
    x_view: View,
    windows: Vec<View>,
    /// The writer's source.
    z: View,
    /// The weight update's increment (ones).
    ones: View,
}

fn x0() -> Vec<f32> {
    (0..ROW).map(|e| 2.0 * e as f32 + 1.0).collect()
}

fn w0(j: usize) -> f32 {
    100_000.0 + j as f32
}

fn z0() -> Vec<f32> {
    (0..ROW).map(|e| -(e as f32) - 7.0).collect()
}

fn s0(k: usize) -> f32 {
    (k % 1_000_003) as f32
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn f32_buffer(cluster: &Cluster, values: &[f32]) -> Result<(Buffer, View), String> {
    let b = cluster.buffer((values.len() * 4) as u64).map_err(err)?;
    b.write_slice(0, values).map_err(err)?;
    let v = b.tensor(&[values.len() as u32], DType::F32).map_err(err)?;
    Ok((b, v))
}

fn rows_of(b: &Buffer, n: usize) -> Result<Vec<View>, String> {
    (0..n)
        .map(|i| b.tensor_at((i * ROW * 4) as u64, &[ROW as u32], DType::F32))
        .collect::<Result<_, _>>()
        .map_err(err)
}

impl Bufs {
    fn new(cluster: &Cluster, n: usize) -> Result<Bufs, String> {
        let elems = u32::try_from(n * ROW).map_err(|_| format!("N = {n} is too many rows"))?;
        let y = cluster.buffer(u64::from(elems) * 4).map_err(err)?;
        let y_all = y.tensor(&[elems], DType::F32).map_err(err)?;
        let s: Vec<f32> = (0..n * ROW).map(s0).collect();
        let (s, _) = f32_buffer(cluster, &s)?;
        let (x, x_view) = f32_buffer(cluster, &x0())?;
        let w: Vec<f32> = (0..WINDOWS + ROW).map(w0).collect();
        let (w, _) = f32_buffer(cluster, &w)?;
        let windows = (0..WINDOWS)
            .map(|j| w.tensor_at((j * 4) as u64, &[ROW as u32], DType::F32))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let (_, z) = f32_buffer(cluster, &z0())?;
        let (_, ones) = f32_buffer(cluster, &[1.0; ROW])?;
        Ok(Bufs {
            n,
            rows: rows_of(&y, n)?,
            y,
            y_all,
            s_rows: rows_of(&s, n)?,
            s,
            x,
            x_view,
            windows,
            z,
            ones,
        })
    }

    /// `y` back to the sentinel and `x` to its first contents.
    fn reset(&self) -> Result<(), String> {
        let chunk = vec![SENTINEL; 1 << 16];
        let total = self.n * ROW;
        let mut at = 0;
        while at < total {
            let len = chunk.len().min(total - at);
            self.y
                .write_slice((at * 4) as u64, &chunk[..len])
                .map_err(err)?;
            at += len;
        }
        self.x.write_slice(0, &x0()).map_err(err)
    }

    /// Whether `y` and `x` hold what the tasks run one by one leave.
    fn check(&self, p: Pattern) -> Result<bool, String> {
        let y = self.y.to_vec::<f32>().map_err(err)?;
        let x = self.x.to_vec::<f32>().map_err(err)?;
        let base = x0();
        let rows_ok = match p {
            Pattern::Private => {
                let s = self.s.to_vec::<f32>().map_err(err)?;
                y == s && s.iter().enumerate().all(|(k, &v)| v == s0(k))
            }
            Pattern::Shared | Pattern::Writer => y.chunks(ROW).all(|r| r == base),
            Pattern::Overlapping => y.chunks(ROW).enumerate().all(|(i, r)| {
                let start = i % WINDOWS;
                r.iter().enumerate().all(|(e, &v)| v == w0(start + e))
            }),
            Pattern::Inference => y.chunks(ROW).enumerate().all(|(i, r)| {
                let version = (i / K) as f32;
                r.iter().zip(&base).all(|(&v, &b)| v == b + version)
            }),
        };
        let x_ok = match p {
            Pattern::Writer => x == z0(),
            Pattern::Inference => {
                let version = (self.n / K) as f32;
                x.iter().zip(&base).all(|(&v, &b)| v == b + version)
            }
            _ => x == base,
        };
        Ok(rows_ok && x_ok && y.len() == self.n * ROW)
    }
}

/// One run's measurements.
struct Sample {
    submit: Duration,
    drain: Duration,
    /// The writer's submit and the `totals` round trip after it.
    writer_insert: Option<Duration>,
    edges: u64,
    ok: bool,
}

impl Sample {
    fn total(&self) -> Duration {
        self.submit + self.drain
    }
}

/// Submits one run of `p` behind a blocker holding for `hold`; `None` when
/// the blocker finished before the last task was taken (not all live).
fn run_once(
    cluster: &Cluster,
    b: &Bufs,
    p: Pattern,
    hold: Duration,
) -> Result<Option<Sample>, String> {
    b.reset()?;
    let submit = |t: Task| cluster.submit(t).map_err(err);
    let t0 = Instant::now();
    let blocker = submit(
        Task::new("test.slow")
            .output(&b.y_all)
            .scalar_u64(hold.as_millis() as u64),
    )?;
    for i in 0..b.n {
        let input = match p {
            Pattern::Private => &b.s_rows[i],
            Pattern::Overlapping => &b.windows[i % WINDOWS],
            _ => &b.x_view,
        };
        submit(Task::new("copy").input(input).output(&b.rows[i]))?;
        if p == Pattern::Inference && (i + 1) % K == 0 {
            submit(
                Task::new("axpy")
                    .input(&b.ones)
                    .inout(&b.x_view)
                    .scalar_f64(1.0),
            )?;
        }
    }
    let mut writer_insert = None;
    if p == Pattern::Writer {
        cluster.totals().map_err(err)?;
        let tw = Instant::now();
        submit(Task::new("copy").input(&b.z).output(&b.x_view))?;
        cluster.totals().map_err(err)?;
        writer_insert = Some(tw.elapsed());
    }
    let t = cluster.totals().map_err(err)?;
    let submitted = t0.elapsed();
    let live = t.submitted - t.succeeded - t.failed - t.skipped - t.cancelled;
    let all_live = live == (p.tasks(b.n) + 1) as u64;
    cluster.wait(blocker).map_err(err)?;
    let t2 = Instant::now();
    let s = cluster.wait_all().map_err(err)?;
    let drain = t2.elapsed();
    if !all_live {
        return Ok(None);
    }
    let ok = s.succeeded == (p.tasks(b.n) + 1) as u64 && b.check(p)?;
    Ok(Some(Sample {
        submit: submitted,
        drain,
        writer_insert,
        edges: s.edges,
        ok,
    }))
}

fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The default task counts.
pub(crate) fn default_ns(quick: bool) -> Vec<usize> {
    if quick {
        vec![1_000, 10_000]
    } else {
        vec![1_000, 10_000, 100_000]
    }
}

/// What the readers scenarios run.
pub(crate) struct Plan {
    /// Task counts.
    pub(crate) ns: Vec<usize>,
    /// Patterns (empty: all).
    pub(crate) patterns: Vec<Pattern>,
    /// Runs of each pattern at each N; the median is reported.
    pub(crate) repeats: usize,
}

/// Runs every pattern at every N of the plan, `repeats` times each
/// (patterns interleaved), and emits the medians.
pub(crate) fn readers(mode: Mode, plan: &Plan) -> Result<bool, String> {
    let (ns, repeats) = (&plan.ns, plan.repeats.max(1));
    let patterns = if plan.patterns.is_empty() {
        Pattern::ALL.to_vec()
    } else {
        plan.patterns.clone()
    };
    let largest = ns.iter().copied().max().unwrap_or(0);
    let unfinished = (2 * (largest + largest / K) + 16).max(65_536);
    let cluster = local_from(
        Cluster::builder().window(256).max_unfinished(unfinished),
        mode,
        2,
        "sim:mode=unified",
    )?;
    let scenario = mode.name("readers");
    // The submit phase's pace so far, per task: sizes the blocker's sleep.
    let mut pace = Duration::from_micros(20);
    let mut all_ok = true;
    let warm = Bufs::new(&cluster, 1_000)?;
    run_once(&cluster, &warm, Pattern::Shared, Duration::from_millis(100))?;
    drop(warm);
    for &n in ns {
        let b = Bufs::new(&cluster, n)?;
        let mut samples: Vec<Vec<Sample>> = patterns.iter().map(|_| Vec::new()).collect();
        for _ in 0..repeats {
            for (k, &p) in patterns.iter().enumerate() {
                // In halves: 1.5 times the last pace, then 4.5, 13.5, 40.5.
                let mut factor = 3;
                let sample = loop {
                    let hold = pace * (p.tasks(n) as u32) * factor / 2 + Duration::from_millis(50);
                    if let Some(s) = run_once(&cluster, &b, p, hold)? {
                        break s;
                    }
                    if factor > 81 {
                        return Err(format!(
                            "{} N={n}: the blocker finished before the last submit, held {hold:?}",
                            p.name()
                        ));
                    }
                    factor *= 3;
                };
                pace = sample.submit / p.tasks(n) as u32;
                samples[k].push(sample);
            }
        }
        all_ok &= report(&scenario, n, &patterns, &samples);
    }
    Ok(all_ok)
}

/// Emits the medians of one N: a row per pattern, the shared/private
/// ratio and what the writer added.
fn report(scenario: &str, n: usize, patterns: &[Pattern], samples: &[Vec<Sample>]) -> bool {
    let mut ok = true;
    let mut per_task = Vec::new();
    for (&p, runs) in patterns.iter().zip(samples) {
        let tasks = p.tasks(n) as f64;
        let value = median_of(runs.iter().map(|s| us(s.total()) / tasks).collect());
        let submit = median_of(runs.iter().map(|s| us(s.submit) / tasks).collect());
        let drain = median_of(runs.iter().map(|s| us(s.drain) / tasks).collect());
        let good = runs.iter().all(|s| s.ok);
        let edges = runs.iter().map(|s| s.edges).max().unwrap_or(0);
        ok &= emit(
            scenario,
            &format!("{} N={n}", p.name()),
            json!({"N": n, "pattern": p.name(), "tasks": p.tasks(n), "repeats": runs.len(),
                   "submit_us_per_task": submit, "drain_us_per_task": drain}),
            value,
            "us/task",
            good,
            &format!(
                "submit {submit:.2} + drain {drain:.2} us/task (medians); all {} tasks unfinished at the last submit; {edges} edges inferred",
                p.tasks(n)
            ),
        );
        per_task.push(value);
    }
    let at = |p: Pattern| patterns.iter().position(|&q| q == p);
    let (Some(private), Some(shared)) = (at(Pattern::Private), at(Pattern::Shared)) else {
        return ok;
    };
    let total = |k: usize| median_of(samples[k].iter().map(|s| us(s.total())).collect());
    let (private_us, shared_us) = (per_task[private], per_task[shared]);
    ok &= emit(
        scenario,
        &format!("shared/private N={n}"),
        json!({"N": n, "pattern": "shared/private"}),
        shared_us / private_us,
        "ratio",
        ok,
        &format!("{shared_us:.2} / {private_us:.2} us per task"),
    );
    let Some(writer) = at(Pattern::Writer) else {
        return ok;
    };
    let insert = median_of(
        samples[writer]
            .iter()
            .filter_map(|s| s.writer_insert.map(us))
            .collect(),
    );
    ok &= emit(
        scenario,
        &format!("writer-added N={n}"),
        json!({"N": n, "pattern": "writer-added", "writer_insert_us": insert}),
        total(writer) - total(shared),
        "us",
        ok,
        &format!(
            "median run with the writer minus without it; the writer's submit and a totals round trip: {insert:.1} us"
        ),
    );
    ok
}
