//! `strata-soak`: millions of small tasks over 2 local workers, sampling
//! the driver's and the workers' memory (RSS) and open fds as it goes
//! (docs/reliability.md). After warm-up every sample must stay within 10 %
//! of the highest RSS seen during warm-up, and open fds must not grow at
//! all past the last warm-up sample, or the exit status is 1.
//!
//! ```text
//! strata-soak [--tasks N] [--batch N] [--warmup N]     (defaults 5,000,000 / 250,000 / 1,000,000)
//! strata-soak --readers N [--gate-ms MS]                (outstanding readers)
//! ```
//!
//! `--readers N` measures the driver's memory per unfinished reader
//! instead: one task fills a 64-float buffer after sleeping `MS`
//! milliseconds (default 30,000), and N tasks that each copy that buffer
//! into their own row of an output buffer are submitted behind it (every
//! one of them reads the same bytes, and waits). The driver's RSS is
//! sampled as they pile up; then the fill runs, every copy is checked,
//! and the exit status is 1 unless RSS per reader stayed within 25 % of
//! its value at the first sample past 10 % of N (hash tables grow by
//! doubling, so RSS per task moves in steps: +10 % between 10⁵ and 10⁶
//! readers when this was written).
//!
//! Each batch makes 16 fresh 4 KiB buffers, fills them round-robin (`fill`,
//! OUTPUT, so each buffer is a chain of writes), reads one element of each
//! back to check the last fill, and drops them: buffers are created,
//! imported by the workers and released again all the time.

use std::time::Instant;

use serde_json::json;
use strata_orchestrator::{Cluster, Task};
use strata_wire::DType;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// (RSS in KiB, open fds) of a process.
fn sample(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} {v:?} is not a number"))
        })
}

fn main() {
    if std::env::args().any(|a| a == "--readers") {
        readers(arg("--readers", 1_000_000), arg("--gate-ms", 30_000));
        return;
    }
    let total = arg("--tasks", 5_000_000);
    let batch = arg("--batch", 250_000).max(16);
    let warmup = arg("--warmup", 1_000_000);
    let exe = std::env::current_exe().expect("current exe");
    let cluster = Cluster::builder()
        .local(2)
        .worker_binary(exe.with_file_name("strata-test-worker"))
        .device("sim:mode=unified")
        .window(256)
        .start()
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    let pids: Vec<(String, u32)> = std::iter::once(("driver".to_owned(), std::process::id()))
        .chain(
            cluster
                .workers()
                .iter()
                .map(|w| (w.id.to_string(), w.pid.expect("spawned"))),
        )
        .collect();
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut base: Option<Vec<(u64, usize)>> = None;
    let mut worst: Vec<(f64, i64)> = vec![(1.0, 0); pids.len()];
    let mut ok = true;
    while done < total {
        let n = batch.min(total - done);
        let bufs: Vec<_> = (0..16)
            .map(|_| {
                cluster
                    .buffer(4096)
                    .and_then(|b| b.tensor(&[1024], DType::F32))
                    .unwrap_or_else(|e| panic!("buffer: {e}"))
            })
            .collect();
        for i in 0..n {
            let v = &bufs[(i % 16) as usize];
            cluster
                .submit(Task::new("fill").output(v).scalar_f64((done + i) as f64))
                .unwrap_or_else(|e| panic!("submit: {e}"));
        }
        let s = cluster.wait_all().unwrap_or_else(|e| panic!("run: {e}"));
        // The last fill of each buffer is what it holds.
        for (k, v) in bufs.iter().enumerate() {
            let last = (0..n).rev().find(|i| i % 16 == k as u64);
            if let Some(i) = last {
                let got = v.read::<f32>().unwrap_or_default();
                ok &= got.first().copied() == Some((done + i) as f32);
            }
        }
        ok &= s.succeeded == n;
        drop(bufs);
        done += n;
        // Let the releases reach the workers before sampling.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now: Vec<(u64, usize)> = pids.iter().map(|(_, p)| sample(*p)).collect();
        if done <= warmup {
            // The high-water mark of warm-up is the baseline: RSS swings
            // with where the allocator happens to be in returning pages.
            let b = base.get_or_insert_with(|| now.clone());
            for (hi, cur) in b.iter_mut().zip(&now) {
                *hi = (hi.0.max(cur.0), cur.1);
            }
        } else {
            match &base {
                None => base = Some(now.clone()),
                Some(b) => {
                    for (i, ((rss, fds), (rss0, fds0))) in now.iter().zip(b).enumerate() {
                        let growth = *rss as f64 / (*rss0).max(1) as f64;
                        worst[i].0 = worst[i].0.max(growth);
                        worst[i].1 = worst[i].1.max(*fds as i64 - *fds0 as i64);
                    }
                }
            }
        }
        println!(
            "{}",
            json!({
                "tasks": done,
                "seconds": t0.elapsed().as_secs_f64(),
                "samples": pids.iter().zip(&now).map(|((name, _), (rss, fds))| json!({"process": name, "rss_kib": rss, "fds": fds})).collect::<Vec<_>>(),
                "checked": ok,
            })
        );
    }
    let flat = worst.iter().all(|(g, f)| *g <= 1.10 && *f <= 0);
    println!(
        "{}",
        json!({
            "summary": true,
            "tasks": done,
            "seconds": t0.elapsed().as_secs_f64(),
            "tasks_per_s": done as f64 / t0.elapsed().as_secs_f64(),
            "after_warmup": pids.iter().zip(&worst).map(|((name, _), (g, f))| json!({"process": name, "max_rss_growth": g, "max_fd_growth": f})).collect::<Vec<_>>(),
            "results_checked": ok,
            "flat": flat,
        })
    );
    std::process::exit(i32::from(!(ok && flat)));
}

/// `--readers N` (module docs).
fn readers(n: u64, gate_ms: u64) {
    const ROW: u32 = 64;
    let exe = std::env::current_exe().expect("current exe");
    let cluster = Cluster::builder()
        .local(2)
        .worker_binary(exe.with_file_name("strata-test-worker"))
        .max_unfinished(usize::try_from(n).unwrap_or(usize::MAX).saturating_add(16))
        .start()
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    let me = std::process::id();
    let rows = u32::try_from(n).expect("--readers fits in u32");
    let x = cluster
        .buffer(u64::from(ROW) * 4)
        .and_then(|b| b.tensor(&[ROW], DType::F32))
        .unwrap_or_else(|e| panic!("buffer: {e}"));
    let y = cluster
        .buffer(u64::from(rows) * u64::from(ROW) * 4)
        .unwrap_or_else(|e| panic!("buffer: {e}"));
    let (rss0, _) = sample(me);
    let t0 = Instant::now();
    cluster
        .submit(
            Task::new("test.late_fill")
                .output(&x)
                .scalar_u64(gate_ms)
                .scalar_u64(7),
        )
        .unwrap_or_else(|e| panic!("submit: {e}"));
    let mut first: Option<f64> = None;
    let mut worst = 1.0f64;
    let marks: Vec<u64> = [1, 2, 5, 10, 20, 50, 100]
        .iter()
        .map(|p| n * p / 100)
        .filter(|&m| m > 0)
        .collect();
    for i in 0..n {
        let row = y
            .tensor_at(i * u64::from(ROW) * 4, &[ROW], DType::F32)
            .unwrap_or_else(|e| panic!("view: {e}"));
        cluster
            .submit(Task::new("copy").input(&x).output(&row))
            .unwrap_or_else(|e| panic!("submit: {e}"));
        if marks.contains(&(i + 1)) {
            let (rss, _) = sample(me);
            let per = (rss.saturating_sub(rss0) * 1024) as f64 / (i + 1) as f64;
            if i + 1 >= n / 10 {
                let base = *first.get_or_insert(per);
                worst = worst.max(per / base);
            }
            println!(
                "{}",
                json!({
                    "outstanding_readers": i + 1,
                    "seconds": t0.elapsed().as_secs_f64(),
                    "driver_rss_kib": rss,
                    "bytes_per_reader": per.round(),
                })
            );
        }
    }
    let s = cluster.wait_all().unwrap_or_else(|e| panic!("run: {e}"));
    let got = y
        .tensor(&[rows, ROW], DType::F32)
        .and_then(|v| v.read::<f32>())
        .unwrap_or_else(|e| panic!("read: {e}"));
    let ok = s.succeeded == n + 1 && got.iter().all(|&v| v == 7.0);
    let flat = worst <= 1.25;
    println!(
        "{}",
        json!({
            "readers": n,
            "seconds": t0.elapsed().as_secs_f64(),
            "checked": ok,
            "worst_growth_per_reader": worst,
            "flat": flat,
        })
    );
    if !(ok && flat) {
        std::process::exit(1);
    }
}
