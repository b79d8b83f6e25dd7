//! The tiled Cholesky scenario: `strata_orchestrator::demo::cholesky_runs`
//! (potrf, trsm, syrk and gemm tile tasks, F32) on 2 local workers over the
//! ring, per scheduling policy, N and tile; the yardstick beside StarPU's
//! own tiled Cholesky (bench/starpu/cholesky.py). Each cluster runs the
//! factorization `1 + repeats` times on one matrix: the first run maps the
//! matrix into the workers and calibrates the performance models (as
//! StarPU's calibration runs do), the median of the rest is reported, in
//! GFlop/s by the usual count N³/3.
//!
//! Two chip kinds: `sim:mode=unified` (kernels read and write host memory
//! in place, as StarPU's CPU workers do) and the default staged `sim`
//! (every view copied to the chip's memory and back, the device cache
//! keeping tiles between tasks).

use serde_json::json;
use strata_orchestrator::{Cluster, SchedulerPolicy};

use super::{Mode, emit};

/// What the scenario runs.
pub(crate) struct Plan {
    pub(crate) ns: Vec<u32>,
    pub(crate) tiles: Vec<u32>,
    pub(crate) repeats: usize,
    pub(crate) policies: Vec<SchedulerPolicy>,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Plan {
        Plan {
            ns: if quick {
                vec![1024]
            } else {
                vec![2048, 4096, 8192]
            },
            tiles: if quick { vec![256] } else { vec![256, 512] },
            repeats: if quick { 2 } else { 5 },
            policies: SchedulerPolicy::ALL.iter().map(|(_, p)| *p).collect(),
        }
    }
}

pub(crate) fn cholesky(plan: &Plan) -> Result<bool, String> {
    let mut ok = true;
    for device in ["sim:mode=unified", "sim"] {
        for &n in &plan.ns {
            for &tile in &plan.tiles {
                if n % tile != 0 || n / tile < 2 {
                    continue;
                }
                for &policy in &plan.policies {
                    // The staged chip at the largest size only with the
                    // default policy: it shows the copies' cost, not the
                    // scheduler's.
                    if device == "sim" && policy != SchedulerPolicy::Dmdas {
                        continue;
                    }
                    ok &= one(device, n, tile, policy, plan.repeats)?;
                }
            }
        }
    }
    Ok(ok)
}

fn one(
    device: &str,
    n: u32,
    tile: u32,
    policy: SchedulerPolicy,
    repeats: usize,
) -> Result<bool, String> {
    // Its own policy, whatever STRATA_SCHEDULER says to the other
    // scenarios; the same settings as theirs otherwise.
    let cluster: Cluster = Cluster::builder()
        .scheduler(policy)
        .device(device)
        .window(256)
        .local(2)
        .worker_binary(super::worker_binary())
        .start()
        .map_err(|e| e.to_string())?;
    if let Some(w) = cluster
        .workers()
        .iter()
        .find(|w| w.transport != Mode::Process.transport())
    {
        return Err(format!(
            "worker {} is reached over {}, not the ring",
            w.id, w.transport
        ));
    }
    let runs = strata_orchestrator::demo::cholesky_runs::<f32>(&cluster, n, tile, 1 + repeats)
        .map_err(|e| e.to_string())?;
    cluster.shutdown().map_err(|e| e.to_string())?;
    let flops = f64::from(n).powi(3) / 3.0;
    let mut gflops: Vec<f64> = runs[1..]
        .iter()
        .map(|r| flops / r.wall.as_secs_f64() / 1e9)
        .collect();
    let all: Vec<f64> = gflops.iter().map(|g| (g * 10.0).round() / 10.0).collect();
    gflops.sort_by(f64::total_cmp);
    let median = gflops[gflops.len() / 2];
    let worst = runs.iter().map(|r| r.max_abs_err).fold(0.0, f64::max);
    let ok = worst <= 1e-5;
    let last = &runs[runs.len() - 1].summary;
    let err = last.prediction_error();
    Ok(emit(
        "cholesky",
        policy.name(),
        json!({
            "n": n, "tile": tile, "workers": 2, "device": device, "dtype": "f32",
            "tasks": runs[0].tasks, "repeats": repeats, "runs_gflops": all,
            "first_run_gflops": (flops / runs[0].wall.as_secs_f64() / 1e9 * 10.0).round() / 10.0,
            "model_error": err, "residual": worst,
        }),
        median,
        "GFlop/s",
        ok,
        &format!(
            "median of {repeats} runs after one calibration run; residual {worst:.1e}; model error {}",
            err.map_or("-".to_owned(), |e| format!("{:.0}%", e * 100.0))
        ),
    ))
}
