//! Runtime-managed intermediates through real worker processes: a long
//! job allocating temporaries in a scope per step runs in bounded memory
//! (memfds made, held by the driver's pool, mapped by each worker), and a
//! recycled memfd never shows a byte of its last user.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use strata_orchestrator::{Cluster, Task, View, WorkerId};
use strata_tests::strata_bin;
use strata_wire::{Backing, DType};

/// The memfd inode behind a host view.
fn inode(v: &View) -> u64 {
    match v.buffer().descriptor().backing() {
        Backing::Memfd { st_ino, .. } => *st_ino,
        other => panic!("not a memfd: {other:?}"),
    }
}

/// Mappings of strata buffers in process `pid` (every one the worker
/// holds: its imports' mappings).
fn buffer_mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().filter(|l| l.contains("strata-buffer")).count())
        .unwrap_or(0)
}

fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// 10,000 steps, each a scope with two 16 KiB temporaries: copy half of
/// `x` into `t1`, square `t1` into `t2`, add `t2` to one of 16
/// accumulators (16 chains, so that steps overlap). Unfinished
/// tasks are bounded (16), so at most a few steps are in flight;
/// every temporary of an ended step goes back to the pool once its tasks
/// are done and both workers released it. Without the pool and scopes the
/// job would hold 20,000 memfds (320 MB); with them it makes a bounded
/// number, the workers map a bounded number at any time, and the results
/// show no recycled byte: `t1`'s bottom half is never written, so a stale
/// byte there would reach an accumulator's bottom half, which must stay 0.
#[test]
fn a_long_job_of_scoped_temporaries_runs_in_bounded_memory() {
    const STEPS: usize = 10_000;
    const BOUND: usize = 64;
    let c = Cluster::builder()
        .local(2)
        .worker_binary(strata_bin())
        .max_unfinished(16)
        .start()
        .expect("cluster");
    let x = c
        .buffer_from_slice(&[1.0f32; 32 * 64])
        .unwrap()
        .tensor(&[32, 64], DType::F32)
        .unwrap();
    const CHAINS: usize = 16;
    let acc = c.alloc(&[CHAINS as u32 * 64, 64], DType::F32).unwrap();
    let chains: Vec<View> = (0..CHAINS)
        .map(|k| {
            acc.reshape((k * 64 * 64 * 4) as u64, &[64, 64], &[64, 1], DType::F32)
                .unwrap()
        })
        .collect();
    let pids: Vec<u32> = (0..2).map(|w| c.worker_pid(WorkerId(w)).unwrap()).collect();
    let mut inodes = HashSet::new();
    let (mut most_out, mut most_mapped, mut most_imports) = (0u64, 0usize, 0u64);
    let started = Instant::now();
    for step in 0..STEPS {
        let s = c.scope().unwrap();
        let t1 = s.alloc(&[64, 64], DType::F32).unwrap();
        let t2 = s.alloc(&[64, 64], DType::F32).unwrap();
        inodes.insert(inode(&t1));
        inodes.insert(inode(&t2));
        let top = t1.reshape(0, &[32, 64], &[64, 1], DType::F32).unwrap();
        c.submit(Task::new("copy").input(&x).output(&top)).unwrap();
        c.submit(Task::new("mul").input(&t1).input(&t1).output(&t2))
            .unwrap();
        c.submit(
            Task::new("axpy")
                .input(&t2)
                .inout(&chains[step % CHAINS])
                .scalar_f64(1.0),
        )
        .unwrap();
        drop(s);
        if step % 500 == 499 {
            let p = c.pool_stats();
            most_out = most_out.max(p.out);
            for (w, &pid) in pids.iter().enumerate() {
                most_mapped = most_mapped.max(buffer_mappings(pid));
                let imports = c.worker_stats(WorkerId(w as u32)).unwrap().imports;
                most_imports = most_imports.max(imports);
            }
        }
    }
    let summary = c.wait_all().unwrap();
    let elapsed = started.elapsed();
    assert_eq!(summary.succeeded as usize, 3 * STEPS);
    for (k, chain) in chains.iter().enumerate() {
        let got = chain.read::<f32>().unwrap();
        let want = (STEPS / CHAINS) as f32;
        assert!(
            got[..32 * 64].iter().all(|&v| v == want),
            "chain {k}: top half"
        );
        assert!(
            got[32 * 64..].iter().all(|&v| v == 0.0),
            "chain {k}: a stale byte reached the bottom half"
        );
    }
    eventually("every temporary is back", || c.pool_stats().out == 1);
    let p = c.pool_stats();
    eprintln!(
        "{STEPS} steps in {elapsed:?}: {} memfds made for {} temporaries ({} reused, {} discarded), {} idle ({} KiB); at most {most_out} out, {most_mapped} buffer mappings in a worker, {most_imports} imports",
        p.created,
        2 * STEPS,
        p.reused,
        p.discarded,
        p.idle,
        p.idle_bytes >> 10
    );
    assert!(inodes.len() <= BOUND, "{} distinct memfds", inodes.len());
    assert_eq!(
        p.created as usize,
        inodes.len() + 1,
        "acc's and the temporaries'"
    );
    assert_eq!(p.reused as usize, 2 * STEPS + 1 - p.created as usize);
    assert_eq!(p.discarded, 0);
    assert!(most_out as usize <= BOUND, "{most_out} out at once");
    assert!(most_mapped <= BOUND, "{most_mapped} mappings in a worker");
    assert!(most_imports as usize <= BOUND, "{most_imports} imports");
    // Once released, the workers map nothing but `x` and `acc`.
    for (w, &pid) in pids.iter().enumerate() {
        eventually("the workers let go", || {
            c.worker_stats(WorkerId(w as u32)).unwrap().imports <= 2
        });
        assert!(
            buffer_mappings(pid) <= 2,
            "worker {w}: {}",
            buffer_mappings(pid)
        );
    }
}
