//! Partial writers against the sequential oracle, on every path: kernels
//! that write a seeded random subset of their `OUTPUT_EXISTING` and
//! `INOUT` views keep every other element, through staged and unified
//! chips, Unix workers with and without the ring, TCP workers (whose bytes
//! travel) and in-process workers, with two clients sharing the workers.
//! And no byte of one session's reaches another's.

use crate::faults::test_worker_bin;

use strata_orchestrator::{Cluster, Task};
use strata_orchestrator_core::sim::{self, Program};
use strata_tests::WorkerProcess;
use strata_tests::kernels::{partial_callable, partially_writes};
use strata_wire::check::Rng;

use crate::cluster::{remap_with, submit_program, without_fp4};

/// Runs `seeds` random programs of partial writers on `cluster`, each
/// checked byte for byte against one-by-one execution. Returns the tasks
/// run.
fn run_partial_programs(cluster: &Cluster, who: &str, first_seed: u64, seeds: u64) -> usize {
    let mut total = 0;
    for seed in first_seed..first_seed + seeds {
        let mut rng = Rng(0x9a27_0000 + seed);
        let program: Program = without_fp4(sim::random_program(&mut rng, 50));
        let salt = rng.next_u64();
        let want = sim::run_sequential_partial(&program, &|task, arg, tag, k| {
            !matches!(
                tag,
                strata_wire::ArgTag::OutputExisting | strata_wire::ArgTag::InOut
            ) || partially_writes(salt, task.0, arg, k)
        });
        let (buffers, tasks) = remap_with(&program, cluster, &|tags, task| {
            let (name, mask) = partial_callable(tags);
            Task::new(name)
                .scalar_u64(task)
                .scalar_u64(salt)
                .scalar_u64(mask)
        });
        submit_program(cluster, &program, tasks, |_| {});
        let summary = cluster
            .wait_all()
            .unwrap_or_else(|e| panic!("{who} seed {seed}: {e}"));
        assert_eq!(summary.succeeded as usize, program.tasks.len());
        for (d, b) in program.buffers.iter().zip(&buffers) {
            assert_eq!(
                b.to_bytes().unwrap(),
                want[d.identity()],
                "{who} seed {seed}: buffer {} differs from sequential execution",
                d.identity()
            );
        }
        total += program.tasks.len();
    }
    total
}

#[test]
fn partial_writers_keep_untouched_elements_on_every_link_with_two_clients() {
    let seeds: u64 = std::env::var("STRATA_PARTIAL_DIFF_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "partial").unwrap();
    let token = token.to_str().unwrap();
    // Workers both clients share: staged and unified chips on the ring,
    // a staged chip on the gRPC stream, and TCP workers (bytes staged)
    // with a staged and a unified chip.
    let shared = [
        WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--device", "sim:mode=staged"]),
        WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--device", "sim:mode=unified"]),
        WorkerProcess::spawn_unix(
            test_worker_bin(),
            &[],
            &["--device", "sim:mode=staged", "--no-ring"],
        ),
        WorkerProcess::spawn_tcp(
            test_worker_bin(),
            &[],
            &["--token-file", token, "--device", "sim:mode=staged"],
        ),
        WorkerProcess::spawn_tcp(
            test_worker_bin(),
            &[],
            &["--token-file", token, "--device", "sim:mode=unified"],
        ),
    ];
    // Client A keeps written bytes on its staged chips until needed
    // (deferred write-back), client B writes them through.
    let client = |spawned_device: &str, write_back| {
        let mut b = Cluster::builder()
            .local(1)
            .worker_binary(test_worker_bin())
            .device(spawned_device)
            .write_back(write_back)
            .window(3);
        for (i, w) in shared.iter().enumerate() {
            let token = (i >= 3).then_some("partial");
            b = b.connect(&w.endpoint.to_string(), token).unwrap();
        }
        b.start().unwrap()
    };
    let (a, b) = (
        client("sim:mode=staged", strata_orchestrator::WriteBack::Deferred),
        client("sim:mode=unified", strata_orchestrator::WriteBack::Through),
    );
    let (ta, tb) = std::thread::scope(|s| {
        let ta = s.spawn(|| run_partial_programs(&a, "client A", 0, seeds));
        let tb = s.spawn(|| run_partial_programs(&b, "client B", 1000, seeds));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    // Every worker took part for both clients.
    for (who, c) in [("A", &a), ("B", &b)] {
        for w in c.workers() {
            let s = c.worker_stats(w.id).unwrap();
            assert!(s.tasks_succeeded > 0, "client {who}: {} ran nothing", w.id);
        }
    }
    eprintln!("partial writers: two clients over 6 workers each, {ta} + {tb} tasks, identical");
}

#[test]
fn partial_writers_keep_untouched_elements_in_process() {
    for device in ["sim:mode=staged,lanes=2", "sim:mode=unified,lanes=2"] {
        let cluster = Cluster::builder()
            .in_process(2)
            .kernels(strata_tests::kernels::registry().unwrap())
            .device(device)
            .window(3)
            .write_back(strata_orchestrator::WriteBack::Deferred)
            .start()
            .unwrap();
        let n = run_partial_programs(&cluster, device, 0, 6);
        eprintln!("partial writers in process ({device}): {n} tasks, identical");
    }
}
