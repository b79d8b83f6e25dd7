//! The orchestrator end to end against real worker processes: tiled matmul over local and TCP workers, the
//! differential test through real workers, a worker killed mid-run,
//! device-buffer pipelines and zero-copy hand-off.

use crate::faults::test_worker_bin;
use std::path::Path;
use std::time::{Duration, Instant};

use strata_orchestrator::{
    Buffer, Cluster, ClusterError, Error, FailureKind, Outcome, Task, TaskHandle, Transport,
    WorkerId, WriteBack,
};
use strata_orchestrator_core::sim::{self, Program};
use strata_tests::kernels::hash_callable;
use strata_tests::{WorkerProcess, strata_bin};
use strata_wire::check::Rng;
use strata_wire::{Access, DType};

fn local(n: usize, binary: &Path) -> Cluster {
    Cluster::builder()
        .local(n)
        .worker_binary(binary)
        .start()
        .expect("cluster")
}

#[test]
fn tiled_matmul_over_four_local_workers_matches_the_reference() {
    let cluster = local(4, &strata_bin());
    let r = strata_orchestrator::demo::tiled_matmul(&cluster, 512, 64, 1).expect("job");
    assert_eq!(r.tasks, 512);
    assert_eq!(r.summary.succeeded, 512);
    assert!(r.ok(1e-3), "max |err| {}", r.max_abs_err);
    assert_eq!(r.summary.sent_bytes, 0, "local workers get fds, not bytes");
    assert!(r.summary.fd_bytes > 0);
    // Every worker took part.
    for w in cluster.workers() {
        let s = cluster.worker_stats(w.id).expect("stats");
        assert!(s.tasks_succeeded > 0, "{} ran nothing", w.id);
    }
    eprintln!(
        "tiled matmul 512/64 over 4 local workers: {:.1} ms",
        r.wall.as_secs_f64() * 1e3
    );
}

/// A tiled Cholesky (potrf, trsm, syrk, gemm tile tasks) through real
/// workers under every scheduling policy, F32 on staged chips and F64 on
/// unified ones, checked by its residual; the models predict the later
/// runs' kernels, and kept in a file they predict a new cluster's first.
#[test]
fn tiled_cholesky_is_right_under_every_policy_and_the_models_persist() {
    use strata_orchestrator::SchedulerPolicy;
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models.json");
    for (_, policy) in SchedulerPolicy::ALL {
        for device in ["sim", "sim:mode=unified"] {
            let cluster = Cluster::builder()
                .local(2)
                .worker_binary(strata_bin())
                .device(device)
                .scheduler(policy)
                .perf_models(&models)
                .start()
                .expect("cluster");
            let runs = if device == "sim" {
                strata_orchestrator::demo::cholesky_runs::<f32>(&cluster, 256, 64, 2)
                    .expect("job")
                    .into_iter()
                    .map(|r| (r, 1e-5))
                    .collect::<Vec<_>>()
            } else {
                strata_orchestrator::demo::cholesky_runs::<f64>(&cluster, 256, 64, 2)
                    .expect("job")
                    .into_iter()
                    .map(|r| (r, 1e-12))
                    .collect()
            };
            for (r, tol) in &runs {
                assert_eq!(r.tasks, 20, "4 tiles a side: 4 + 2·6 + 4 tasks");
                assert_eq!(r.summary.succeeded, 20);
                assert!(
                    r.ok(*tol),
                    "{policy} on {device}: residual {}",
                    r.max_abs_err
                );
            }
            if policy != SchedulerPolicy::LeastLoaded {
                // The second run's kernels were all seen in the first.
                assert_eq!(runs[1].0.summary.predicted, 20, "{policy} on {device}");
            }
            cluster.shutdown().expect("shutdown");
        }
    }
    let saved = std::fs::read_to_string(&models).expect("models saved at shutdown");
    assert!(saved.contains("strata_perf_models"), "{saved}");
    // A new cluster predicts from the file from its first task on.
    let cluster = Cluster::builder()
        .local(2)
        .worker_binary(strata_bin())
        .perf_models(&models)
        .start()
        .expect("cluster");
    let r = strata_orchestrator::demo::cholesky::<f32>(&cluster, 256, 64).expect("job");
    assert!(r.ok(1e-5));
    assert_eq!(
        r.summary.predicted, 20,
        "every task predicted from the file"
    );
    cluster.shutdown().expect("shutdown");
    // A file that is not a models file fails the start, naming it.
    std::fs::write(&models, "{not json").unwrap();
    let err = Cluster::builder()
        .local(1)
        .worker_binary(strata_bin())
        .perf_models(&models)
        .start()
        .expect_err("a corrupt models file");
    assert!(
        err.to_string().contains("models.json") && err.to_string().contains("delete it"),
        "{err}"
    );
}

/// The device cache through real workers: the same tiled matmul with
/// copies kept on the chips and without, both right; with them, tiles read
/// again on a chip are found there, so far fewer bytes are copied in.
#[test]
fn a_tiled_matmul_reads_tiles_once_per_chip_with_the_device_cache() {
    let mut staged = Vec::new();
    for cache in [false, true] {
        let cluster = Cluster::builder()
            .local(2)
            .worker_binary(strata_bin())
            .device_cache(cache)
            .start()
            .expect("cluster");
        let r = strata_orchestrator::demo::tiled_matmul(&cluster, 256, 64, 3).expect("job");
        assert!(r.ok(1e-3), "cache {cache}: max |err| {}", r.max_abs_err);
        let (mut into, mut hits) = (0, 0);
        for w in cluster.workers() {
            let s = cluster.worker_stats(w.id).expect("stats");
            into += s.staged_to_device;
            hits += s.cache.hits;
        }
        assert_eq!(hits > 0, cache, "cache {cache}: {hits} hits");
        staged.push(into);
    }
    // 64 tasks read an A and a B tile each (and 48 an accumulated C tile):
    // without the cache 64·2·16 KiB + 48·16 KiB copied in; with it, each
    // of the 32 tiles of A and B at most once per chip.
    assert!(staged[1] * 2 < staged[0], "copied in: {staged:?}");
    eprintln!(
        "tiled matmul 256/64 on 2 chips, bytes copied in without / with the cache: {staged:?}"
    );
}

/// A driver's write to bytes a chip has a copy of, after the task that
/// read them and before the next one: the next task reads the new bytes.
#[test]
fn the_device_cache_never_hides_a_drivers_write() {
    let cluster = local(1, &strata_bin());
    let x = cluster.buffer_from_slice(&[1.0f32; 256]).unwrap();
    let outs: Vec<Buffer> = (0..2).map(|_| cluster.buffer(1024).unwrap()).collect();
    let view = |b: &Buffer| b.tensor(&[16, 16], DType::F32).unwrap();
    let copy = |out: &Buffer| {
        cluster
            .submit(Task::new("copy").input(&view(&x)).output(&view(out)))
            .unwrap();
        cluster.wait_all().unwrap();
    };
    copy(&outs[0]);
    x.write_slice(0, &[2.0f32; 256]).unwrap();
    copy(&outs[1]);
    assert_eq!(outs[0].to_vec::<f32>().unwrap(), vec![1.0; 256]);
    assert_eq!(outs[1].to_vec::<f32>().unwrap(), vec![2.0; 256]);
    let cache = cluster.worker_stats(WorkerId(0)).unwrap().cache;
    assert_eq!(cache.hits, 0, "the second copy read host memory: {cache:?}");
}

#[test]
fn tiled_matmul_over_two_tcp_workers_with_a_token_stages_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let token_arg = token.to_str().unwrap();
    let w0 = WorkerProcess::spawn_tcp(&strata_bin(), &["worker"], &["--token-file", token_arg]);
    let w1 = WorkerProcess::spawn_tcp(
        &strata_bin(),
        &["worker"],
        &[
            "--chip",
            "1",
            "--token-file",
            token_arg,
            "--device",
            "sim:mode=staged",
        ],
    );
    // A wrong token is refused at start, naming the worker.
    let bad = Cluster::builder()
        .connect(&w0.endpoint.to_string(), Some("wrong"))
        .unwrap()
        .start();
    assert!(
        matches!(&bad, Err(Error::Cluster(ClusterError::Unreachable { address, .. })) if address.contains(&w0.endpoint.to_string())),
        "{bad:?}"
    );
    let cluster = Cluster::builder()
        .connect(&w0.endpoint.to_string(), Some("s3cret-token"))
        .unwrap()
        .connect(&w1.endpoint.to_string(), Some("s3cret-token"))
        .unwrap()
        .device_cache(false)
        .start()
        .expect("cluster");
    assert!(cluster.workers().iter().all(|w| !w.fd_passing));
    let r = strata_orchestrator::demo::tiled_matmul(&cluster, 512, 64, 2).expect("job");
    assert!(r.ok(1e-3), "max |err| {}", r.max_abs_err);
    assert_eq!(r.summary.fd_bytes, 0);
    // Without the device cache each task sends its two input tiles (16 KiB
    // each) and gets its output tile back.
    assert_eq!(
        r.summary.sent_bytes,
        512 * 2 * 64 * 64 * 4 + 448 * 64 * 64 * 4
    );
    assert_eq!(r.summary.returned_bytes, 512 * 64 * 64 * 4);
    eprintln!(
        "tiled matmul 512/64 over 2 TCP workers: {:.1} ms",
        r.wall.as_secs_f64() * 1e3
    );
}

/// The device cache on a remote worker: a tile sent once stays on its
/// chip, so a tiled matmul over one TCP worker sends each input tile once
/// (the compulsory bound) instead of once per task; with a chip too small
/// for the working set, copies are evicted, the worker asks for the bytes
/// it no longer holds, and the answer is still right.
#[test]
fn a_remote_worker_keeps_the_tiles_it_was_sent() {
    let tile = 64 * 64 * 4;
    for (device, bound) in [
        ("sim:mode=staged", true),
        // Room for about six tiles beside the run and scratch regions.
        ("sim:mode=staged,mem=320KiB,run=64KiB,scratch=160KiB", false),
    ] {
        let w = WorkerProcess::spawn_tcp(
            &strata_bin(),
            &["worker"],
            &["--insecure", "--device", device],
        );
        let cluster = Cluster::builder()
            .connect(&w.endpoint.to_string(), None)
            .unwrap()
            .start()
            .expect("cluster");
        let r = strata_orchestrator::demo::tiled_matmul(&cluster, 256, 64, 5).expect("job");
        assert!(r.ok(1e-3), "{device}: max |err| {}", r.max_abs_err);
        assert_eq!(r.summary.succeeded, 64);
        let stats = cluster.worker_stats(WorkerId(0)).expect("stats").cache;
        // 4×4 tiles of A and B, 16 KiB each; every C tile stays on the
        // chip from one task of its chain to the next (written through:
        // each task still returns it).
        let compulsory = 2 * 16 * tile;
        let s = &r.summary;
        if bound {
            assert_eq!(s.sent_bytes, compulsory, "{stats:?}");
            // Every other read of A and B, and every read of C.
            assert_eq!(s.held_bytes, (64 * 2 - 32 + 48) * tile, "{s:?}");
            assert_eq!((s.resent, s.evictions), (0, 0), "{s:?}");
            assert_eq!(
                (
                    s.cache_hits,
                    s.cache_misses,
                    s.to_device_bytes,
                    s.prefetched_bytes
                ),
                (stats.hits, stats.misses, stats.loaded, stats.prefetched),
                "the run's figures are the chip's"
            );
        } else {
            // Left out, evicted before its task ran, sent again.
            assert!(s.evictions > 0 && s.resent > 0, "{s:?}");
            assert!(s.sent_bytes > compulsory, "{s:?}");
        }
        // Never more than without the cache: every read's tile once per
        // task, and the 48 accumulations' C tiles.
        assert!(
            r.summary.sent_bytes < (64 * 2 + 48) * tile,
            "{device}: {} bytes sent",
            r.summary.sent_bytes
        );
        assert_eq!(r.summary.returned_bytes, 64 * tile);
        eprintln!(
            "remote tiled matmul 256/64 on {device}: {} bytes sent ({:.2}× the compulsory bound), {stats:?}",
            r.summary.sent_bytes,
            r.summary.sent_bytes as f64 / compulsory as f64
        );
    }
}

#[test]
fn pipeline_keeps_intermediates_in_device_buffers() {
    let cluster = Cluster::builder()
        .local(2)
        .worker_binary(strata_bin())
        .device("sim:mode=staged")
        .start()
        .unwrap();
    let r = strata_orchestrator::demo::pipeline(&cluster, 256, 128, 3).expect("job");
    assert!(r.ok(1e-5), "max |err| {}", r.max_abs_err);
    assert_eq!(r.summary.succeeded, 8);
    // A device buffer on worker 0 cannot be used by a task placed on
    // worker 1; the refusal names both.
    let d = cluster.device_buffer(WorkerId(0), 64).unwrap();
    let v = d.tensor(&[16], DType::F32).unwrap();
    let e = cluster
        .submit(Task::new("fill").output(&v).scalar_f64(1.0).on(WorkerId(1)))
        .unwrap_err();
    assert!(
        e.to_string().contains("worker 0") && e.to_string().contains("worker 1"),
        "{e}"
    );
    // Device buffers are written and read by the driver too.
    cluster.write_device(&d, 0, &[7u8; 64]).unwrap();
    assert_eq!(cluster.read_device(&d, 8, 4).unwrap(), vec![7u8; 4]);
}

/// Rebuilds a program's views over real buffers of the cluster.
pub(crate) fn remap(program: &Program, cluster: &Cluster) -> (Vec<Buffer>, Vec<(u64, Vec<Task>)>) {
    remap_with(program, cluster, &|tags, task| {
        Task::new(hash_callable(tags)).scalar_u64(task)
    })
}

/// As [`remap`], each member's task (callable and scalars) made by
/// `task(tags, program task id)`.
pub(crate) fn remap_with(
    program: &Program,
    cluster: &Cluster,
    task: &dyn Fn(&[strata_wire::ArgTag], u64) -> Task,
) -> (Vec<Buffer>, Vec<(u64, Vec<Task>)>) {
    let buffers: Vec<Buffer> = program
        .buffers
        .iter()
        .map(|d| {
            let b = cluster.buffer_with(d.nbytes(), d.access()).unwrap();
            b.write_bytes(0, &program.initial[d.identity()]).unwrap();
            b
        })
        .collect();
    let find = |id: &strata_wire::CanonicalIdentity| {
        let i = program
            .buffers
            .iter()
            .position(|d| d.identity() == id)
            .unwrap();
        &buffers[i]
    };
    let tasks = program
        .tasks
        .iter()
        .map(|t| {
            let members = t
                .members
                .iter()
                .map(|args| {
                    let tags: Vec<_> = args.iter().map(|a| a.tag).collect();
                    let mut member = task(&tags, t.id.0);
                    for a in args {
                        let v = find(a.tensor.identity())
                            .view(
                                a.tensor.byte_offset(),
                                a.tensor.shape(),
                                a.tensor.strides(),
                                a.tensor.dtype(),
                            )
                            .unwrap();
                        member = member.arg(&v, a.tag);
                    }
                    member
                })
                .collect();
            (t.id.0, members)
        })
        .collect();
    (buffers, tasks)
}

/// Submits a program's remapped tasks in order (a group as one group,
/// `after` edges through the handles of earlier tasks), calling `before(i)`
/// before the i-th; the handles by program task id.
pub(crate) fn submit_program(
    cluster: &Cluster,
    program: &Program,
    tasks: Vec<(u64, Vec<Task>)>,
    mut before: impl FnMut(usize),
) -> std::collections::HashMap<u64, strata_orchestrator::TaskHandle> {
    let mut ids = std::collections::HashMap::new();
    for (i, (pid, members)) in tasks.into_iter().enumerate() {
        before(i);
        let ptask = &program.tasks[i];
        let members: Vec<Task> = members
            .into_iter()
            .map(|mut m| {
                for a in &ptask.after {
                    m = m.after(ids[&a.0]);
                }
                m
            })
            .collect();
        let h = if members.len() == 1 {
            cluster.submit(members.into_iter().next().unwrap())
        } else {
            cluster.submit_group(members)
        }
        .unwrap_or_else(|e| panic!("task {pid}: {e}"));
        ids.insert(pid, h);
    }
    ids
}

/// Drops FP4 views (the test kernel reads whole elements) and the explicit
/// edges to dropped tasks.
pub(crate) fn without_fp4(mut p: Program) -> Program {
    p.tasks.retain(|t| {
        t.members
            .iter()
            .flatten()
            .all(|a| a.tensor.dtype() != DType::Fp4E2M1)
    });
    let kept: std::collections::HashSet<_> = p.tasks.iter().map(|t| t.id).collect();
    for t in &mut p.tasks {
        t.after.retain(|a| kept.contains(a));
    }
    p
}

#[test]
fn differential_through_real_workers_matches_sequential_execution() {
    let seeds: u64 = std::env::var("STRATA_CLUSTER_DIFF_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    // Three workers that pass fds (one unified, one staged, both with
    // their tasks on a ring; one without a ring) and one reached by TCP
    // (bytes staged), small windows so orders vary. The staged worker's
    // chip leaves its device cache room for a few copies only, so copies
    // are evicted (dirty ones written back) as the programs run; the
    // worker without a ring has the default staged chip and its cache.
    // The TCP worker's chip is as small: the driver leaves out bytes it
    // holds, and sends them again when they were evicted meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "diff").unwrap();
    let tcp = WorkerProcess::spawn_tcp(
        test_worker_bin(),
        &[],
        &[
            "--token-file",
            token.to_str().unwrap(),
            "--device",
            "sim:mode=staged,mem=64KiB,run=32KiB,scratch=31KiB",
        ],
    );
    let staged = WorkerProcess::spawn_unix(
        test_worker_bin(),
        &[],
        &[
            "--device",
            "sim:mode=staged,mem=64KiB,run=32KiB,scratch=31KiB",
        ],
    );
    let no_ring = WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--no-ring"]);
    let cluster = Cluster::builder()
        .local(1)
        .worker_binary(test_worker_bin())
        .device("sim:mode=unified")
        .connect(&staged.endpoint.to_string(), None)
        .unwrap()
        .connect(&tcp.endpoint.to_string(), Some("diff"))
        .unwrap()
        .connect(&no_ring.endpoint.to_string(), None)
        .unwrap()
        .window(3)
        .write_back(WriteBack::Deferred)
        .start()
        .unwrap();
    // Every link at once: two rings, the gRPC stream over TCP (bytes
    // staged) and over a Unix socket (a worker that offers no ring).
    let links: Vec<Transport> = cluster.workers().iter().map(|w| w.transport).collect();
    assert_eq!(
        links,
        [
            Transport::Ring,
            Transport::Ring,
            Transport::GrpcTcp,
            Transport::GrpcUnix
        ]
    );
    let mut total = 0usize;
    let (mut held, mut resent) = (0, 0);
    // Which worker runs what is the scheduler's choice and varies with
    // timing, so the caches' reuse does too: past `seeds`, more seeds run
    // (up to four times as many) until both small caches have had hits
    // and evictions and the driver has left out held bytes.
    let covered = |held: u64| {
        let (cache, remote) = (
            cluster.worker_stats(WorkerId(1)).unwrap().cache,
            cluster.worker_stats(WorkerId(2)).unwrap().cache,
        );
        cache.hits > 0 && cache.evictions > 0 && remote.hits > 0 && remote.evictions > 0 && held > 0
    };
    let mut seed = 0;
    while seed < seeds || (seed < 4 * seeds && !covered(held)) {
        let mut rng = Rng(0x5eed_0000 + seed);
        // Odd seeds: read-mostly programs (many unfinished readers of
        // shared views, rare writers).
        let program = without_fp4(if seed % 2 == 1 {
            sim::read_mostly_program(&mut rng, 60)
        } else {
            sim::random_program(&mut rng, 60)
        });
        let want = sim::run_sequential(&program);
        let (buffers, tasks) = remap(&program, &cluster);
        submit_program(&cluster, &program, tasks, |_| {});
        let summary = cluster
            .wait_all()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(summary.succeeded as usize, program.tasks.len());
        (held, resent) = (held + summary.held_bytes, resent + summary.resent);
        for (d, b) in program.buffers.iter().zip(&buffers) {
            assert_eq!(
                b.to_bytes().unwrap(),
                want[d.identity()],
                "seed {seed}: buffer {} differs from sequential execution",
                d.identity()
            );
        }
        total += program.tasks.len();
        seed += 1;
    }
    let cache = cluster.worker_stats(WorkerId(1)).unwrap().cache;
    let remote = cluster.worker_stats(WorkerId(2)).unwrap().cache;
    eprintln!(
        "differential through 4 real workers: {seed} seeds, {total} tasks, identical; the small cache: {cache:?}; the remote one: {remote:?}, {held} bytes left out as held, {resent} tasks resent"
    );
    assert!(cache.hits > 0 && cache.evictions > 0, "{cache:?}");
    assert!(
        remote.hits > 0 && remote.evictions > 0 && held > 0,
        "{remote:?}"
    );
}

#[test]
fn differential_through_in_process_workers_matches_sequential_execution() {
    let seeds: u64 = std::env::var("STRATA_INPROC_DIFF_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    // Three worker nodes in this process, two lanes each, small windows so
    // orders vary; buffers passed by fd and mapped by each node.
    let cluster = Cluster::builder()
        .in_process(3)
        .kernels(strata_tests::kernels::registry().unwrap())
        .device("sim:lanes=2")
        .window(3)
        .write_back(WriteBack::Deferred)
        .start()
        .unwrap();
    assert!(
        cluster
            .workers()
            .iter()
            .all(|w| w.pid.is_none() && w.fd_passing)
    );
    let mut total = 0usize;
    for seed in 0..seeds {
        let mut rng = Rng(0x1a9c_0000 + seed);
        let program = without_fp4(if seed % 2 == 1 {
            sim::read_mostly_program(&mut rng, 80)
        } else {
            sim::random_program(&mut rng, 80)
        });
        let want = sim::run_sequential(&program);
        let (buffers, tasks) = remap(&program, &cluster);
        submit_program(&cluster, &program, tasks, |_| {});
        let summary = cluster
            .wait_all()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(summary.succeeded as usize, program.tasks.len());
        for (d, b) in program.buffers.iter().zip(&buffers) {
            assert_eq!(
                b.to_bytes().unwrap(),
                want[d.identity()],
                "seed {seed}: buffer {} differs from sequential execution",
                d.identity()
            );
        }
        total += program.tasks.len();
    }
    eprintln!("differential through 3 in-process workers: {seeds} seeds, {total} tasks, identical");
}

#[test]
fn a_killed_worker_is_named_within_two_seconds_and_the_rest_goes_on() {
    let cluster = local(3, test_worker_bin());
    let victim = cluster.workers()[1].clone();
    // Long tasks on every worker: the victim's will never finish.
    let mut on = Vec::new();
    for w in cluster.workers() {
        for _ in 0..4 {
            let h = cluster
                .submit(Task::new("test.sleep").scalar_u64(150).on(w.id))
                .unwrap();
            on.push((w.id, h));
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim.pid.unwrap() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The first of the victim's tasks reports the loss.
    let (_, first_victim_task) = on.iter().find(|(w, _)| *w == victim.id).unwrap();
    let e = cluster.wait(*first_victim_task).unwrap_err();
    let detected = killed.elapsed();
    let Error::Run(run) = &e else { panic!("{e}") };
    assert!(matches!(run.outcome, Outcome::EndpointFailure(_)), "{e}");
    assert!(
        run.worker
            .as_deref()
            .unwrap_or("")
            .contains(&victim.endpoint),
        "the error names the worker: {e}"
    );
    assert!(
        detected < Duration::from_secs(2),
        "detected after {detected:?}"
    );
    eprintln!(
        "kill -9 detected after {:.1} ms: {e}",
        detected.as_secs_f64() * 1e3
    );
    // The run's error is that worker's; the others finished their work.
    let run_err = cluster.wait_all().unwrap_err();
    assert!(run_err.to_string().contains(&victim.endpoint), "{run_err}");
    for (w, h) in &on {
        if *w != victim.id {
            cluster.wait(*h).unwrap_or_else(|e| panic!("{w}: {e}"));
        }
    }
    // A new job runs on the survivors.
    let r = strata_orchestrator::demo::tiled_matmul(&cluster, 128, 32, 9).expect("new job");
    assert!(r.ok(1e-3));
    assert!(
        cluster.worker_stats(victim.id).is_err(),
        "the victim is lost"
    );
}

/// With deferred write-back, bytes a task left dirty on its chip are lost
/// with the chip: the run's wait names the task that wrote them, a later
/// task that reads them fails instead of reading stale host bytes, and a
/// task that writes them whole again makes them usable.
#[test]
fn a_killed_worker_takes_its_dirty_bytes_and_nobody_reads_them_stale() {
    let cluster = Cluster::builder()
        .local(2)
        .worker_binary(test_worker_bin())
        .write_back(WriteBack::Deferred)
        .start()
        .unwrap();
    let (victim, other) = (cluster.workers()[0].clone(), cluster.workers()[1].id);
    let x = cluster.buffer_from_slice(&[1.0f32; 256]).unwrap();
    let y = cluster.buffer_from_slice(&[0.0f32; 256]).unwrap();
    let z = cluster.buffer(1024).unwrap();
    let v = |b: &Buffer| b.tensor(&[256], DType::F32).unwrap();
    let update = cluster
        .submit(
            Task::new("axpy")
                .input(&v(&x))
                .inout(&v(&y))
                .scalar_f64(1.0)
                .on(victim.id),
        )
        .unwrap();
    // Done (not waited for: a wait would write the bytes back).
    let until = Instant::now() + Duration::from_secs(10);
    while cluster.totals().unwrap().succeeded < 1 {
        assert!(Instant::now() < until, "the update never finished");
        std::thread::sleep(Duration::from_millis(2));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim.pid.unwrap() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let read = cluster
        .submit(Task::new("copy").input(&v(&y)).output(&v(&z)).on(other))
        .unwrap();
    let e = cluster.wait(read).unwrap_err().to_string();
    assert!(
        e.contains("were lost with") && e.contains(&update.id().to_string()),
        "{e}"
    );
    let e = cluster.wait_all().unwrap_err().to_string();
    assert!(
        e.contains(&update.id().to_string()) && e.contains("lost with the worker"),
        "{e}"
    );
    // Written whole again, the bytes are usable.
    cluster
        .submit(Task::new("fill").output(&v(&y)).scalar_f64(5.0).on(other))
        .unwrap();
    cluster
        .submit(Task::new("copy").input(&v(&y)).output(&v(&z)).on(other))
        .unwrap();
    cluster.wait_all().unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![5.0; 256]);
}

#[test]
fn failures_name_task_callable_worker_and_cause_and_skip_consumers() {
    let cluster = local(2, test_worker_bin());
    let b = cluster.buffer(1024).unwrap();
    let v = b.tensor(&[256], DType::F32).unwrap();
    let bad = cluster.submit(Task::new("test.panic")).unwrap();
    let fill = cluster
        .submit(Task::new("fill").output(&v).scalar_f64(1.0).after(bad))
        .unwrap();
    let e = cluster.wait(bad).unwrap_err().to_string();
    assert!(
        e.contains("test.panic@1") && e.contains("TASK_FAILURE") && e.contains("worker"),
        "{e}"
    );
    let e = cluster.wait(fill).unwrap_err().to_string();
    assert!(e.contains("SKIPPED"), "{e}");
    let all = cluster.wait_all().unwrap_err().to_string();
    assert!(all.contains("test.panic"), "{all}");
    // Submit-time refusals: unknown callable, grant mismatch, overlapping
    // written arguments.
    let e = cluster.submit(Task::new("nope")).unwrap_err().to_string();
    assert!(e.contains("unknown callable \"nope\""), "{e}");
    let ro = cluster.buffer_with(64, Access::Read).unwrap();
    let rv = ro.tensor(&[16], DType::F32).unwrap();
    let e = cluster
        .submit(Task::new("fill").output(&rv).scalar_f64(0.0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("grants READ"), "{e}");
    let e = cluster
        .submit(Task::new("copy").input(&v).output(&v))
        .unwrap_err()
        .to_string();
    assert!(e.contains("share bytes"), "{e}");
    // After all that, the cluster still works.
    let t = cluster
        .submit(Task::new("fill").output(&v).scalar_f64(2.5))
        .unwrap();
    cluster.wait(t).unwrap();
    assert!(v.read::<f32>().unwrap().iter().all(|&x| x == 2.5));
}

/// Each kind of failure a task can meet on a worker process reaches the
/// driver typed, beside its words: the kernel's error, a consumer skipped
/// after it, a task cancelled before it started, a task its chip has no
/// memory for; and the run's summary counts them by kind.
#[test]
fn each_failure_kind_reaches_the_driver_typed() {
    let cluster = Cluster::builder()
        .local(1)
        .worker_binary(test_worker_bin())
        .device("sim:mem=256KiB")
        .start()
        .expect("cluster");
    let failed = |t: TaskHandle| match cluster.wait(t) {
        Err(Error::Run(r)) => r,
        other => panic!("{other:?}"),
    };
    let v = cluster
        .buffer(1024)
        .unwrap()
        .tensor(&[256], DType::F32)
        .unwrap();
    let bad = cluster.submit(Task::new("test.panic")).unwrap();
    let skipped = cluster
        .submit(Task::new("fill").output(&v).scalar_f64(1.0).after(bad))
        .unwrap();
    let r = failed(bad);
    let Outcome::TaskFailure(cause) = &r.outcome else {
        panic!("{r}")
    };
    assert_eq!(cause.kind, FailureKind::Kernel, "{r}");
    assert!(
        cause.message.contains("test.panic was asked to panic"),
        "{r}"
    );
    assert!(r.to_string().contains("TASK_FAILURE (kernel)"), "{r}");
    let r = failed(skipped);
    assert_eq!(r.outcome.kind(), Some(FailureKind::Skipped), "{r}");
    assert_eq!(r.outcome, Outcome::Skipped { because: bad.id() });

    // Held behind a sleeper on the only worker, then cancelled.
    let sleeper = cluster
        .submit(Task::new("test.sleep").scalar_u64(300))
        .unwrap();
    let later = cluster
        .submit(Task::new("fill").output(&v).scalar_f64(2.0).after(sleeper))
        .unwrap();
    cluster.cancel(later).unwrap();
    assert_eq!(failed(later).outcome.kind(), Some(FailureKind::Cancelled));
    cluster.wait(sleeper).unwrap();

    // A MiB staged onto a chip of 256 KiB.
    let big = cluster
        .buffer(1 << 20)
        .unwrap()
        .tensor(&[1 << 18], DType::F32)
        .unwrap();
    let r = failed(
        cluster
            .submit(Task::new("fill").output(&big).scalar_f64(1.0))
            .unwrap(),
    );
    assert_eq!(r.outcome.kind(), Some(FailureKind::Device), "{r}");
    assert!(r.to_string().contains("out of device memory"), "{r}");

    let by_kind = cluster.totals().unwrap().by_kind;
    let want = [
        (FailureKind::Kernel, 1),
        (FailureKind::Device, 1),
        (FailureKind::Cancelled, 1),
        (FailureKind::Skipped, 1),
    ];
    assert_eq!(by_kind, want.into_iter().collect(), "{by_kind:?}");
}

#[test]
fn zero_copy_a_gibibyte_buffer_costs_what_a_page_costs() {
    let cluster = Cluster::builder()
        .local(1)
        .worker_binary(test_worker_bin())
        .device("sim:mode=unified")
        .start()
        .unwrap();
    let w = cluster.workers()[0].id;
    let time = |nbytes: u64| {
        let mut samples = Vec::new();
        for _ in 0..5 {
            let b = cluster.buffer(nbytes).unwrap();
            let v = b.tensor(&[(nbytes / 4) as u32], DType::F32).unwrap();
            let t0 = Instant::now();
            let h = cluster.submit(Task::new("test.touch").input(&v)).unwrap();
            cluster.wait(h).unwrap();
            samples.push(t0.elapsed());
        }
        samples.sort();
        samples[samples.len() / 2]
    };
    let small = time(4096);
    let big = time(1 << 30);
    let stats = cluster.worker_stats(w).unwrap();
    assert_eq!(
        stats.staged_to_device + stats.staged_to_host,
        0,
        "{stats:?}"
    );
    assert_eq!(
        stats.copied_to_device + stats.copied_to_host,
        0,
        "{stats:?}"
    );
    let totals = cluster.totals().unwrap();
    assert_eq!(
        totals.sent_bytes + totals.returned_bytes + totals.staged_bytes,
        0
    );
    assert!(totals.fd_bytes >= 5 << 30);
    eprintln!(
        "zero-copy: first use of a 4 KiB buffer {:.3} ms, of a 1 GiB buffer {:.3} ms (median of 5): +{:.3} ms",
        small.as_secs_f64() * 1e3,
        big.as_secs_f64() * 1e3,
        (big.as_secs_f64() - small.as_secs_f64()) * 1e3
    );
}

#[test]
fn a_stopped_worker_is_lost_at_its_health_deadline() {
    let cluster = local(2, test_worker_bin());
    let victim = cluster.workers()[0].clone();
    let pid = nix::unistd::Pid::from_raw(victim.pid.unwrap() as i32);
    let h = cluster
        .submit(Task::new("test.sleep").scalar_u64(5000).on(victim.id))
        .unwrap();
    let other = cluster
        .submit(
            Task::new("test.sleep")
                .scalar_u64(300)
                .on(cluster.workers()[1].id),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    strata_tests::hang_process(victim.pid.unwrap());
    let stopped = Instant::now();
    let e = cluster.wait(h).unwrap_err();
    let detected = stopped.elapsed();
    assert!(e.to_string().contains("no health beat"), "{e}");
    assert!(
        detected < Duration::from_millis(2500),
        "detected after {detected:?}"
    );
    eprintln!(
        "SIGSTOP detected after {:.0} ms: {e}",
        detected.as_secs_f64() * 1e3
    );
    cluster.wait(other).unwrap();
    // The cluster killed the hung worker it spawned, so it cannot wake up
    // and write into buffers later.
    std::thread::sleep(Duration::from_millis(100));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
}

#[test]
fn npy_files_round_trip_and_bad_ones_are_named() {
    let cluster = local(1, &strata_bin());
    let dir = tempfile::tempdir().unwrap();
    // A version-1 .npy file written by hand: a 2×3 little-endian f4 array.
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    let mut h = header.to_string();
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut file = b"\x93NUMPY\x01\x00".to_vec();
    file.extend_from_slice(&(h.len() as u16).to_le_bytes());
    file.extend_from_slice(h.as_bytes());
    for v in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0] {
        file.extend_from_slice(&v.to_le_bytes());
    }
    let path = dir.path().join("a.npy");
    std::fs::write(&path, &file).unwrap();
    let a = cluster.buffer_from_npy(&path).unwrap();
    assert_eq!(a.shape(), &[2, 3]);
    assert_eq!(a.dtype(), DType::F32);
    // Transpose on a worker, save, load again.
    let t = cluster
        .buffer(24)
        .unwrap()
        .tensor(&[3, 2], DType::F32)
        .unwrap();
    let h = cluster
        .submit(Task::new("transpose").input(&a).output(&t))
        .unwrap();
    cluster.wait(h).unwrap();
    let out = dir.path().join("t.npy");
    t.save_npy(&out).unwrap();
    let back = cluster.buffer_from_npy(&out).unwrap();
    assert_eq!(back.shape(), &[3, 2]);
    assert_eq!(
        back.read::<f32>().unwrap(),
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
    // Bad files are refused naming the file and the problem.
    let fortran = file_with(&file, "'fortran_order': False", "'fortran_order': True ");
    let big = file_with(&file, "'<f4'", "'>f4'");
    for (name, bytes, want) in [
        ("f.npy", fortran, "Fortran"),
        ("b.npy", big, ">f4"),
        ("x.npy", b"not an npy file".to_vec(), "not a .npy file"),
        (
            "short.npy",
            file[..file.len() - 3].to_vec(),
            "expected 24 bytes",
        ),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let e = cluster.buffer_from_npy(&p).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains(want), "{name}: {e}");
    }
}

fn file_with(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap();
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to.as_bytes());
    out
}

/// Polls `f` for up to two seconds.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..100 {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn releasing_a_buffer_in_use_is_deferred_then_workers_release_it() {
    let cluster = local(1, test_worker_bin());
    let w = cluster.workers()[0].id;
    let imports = || cluster.worker_stats(w).unwrap().imports;
    let kept = cluster.buffer(4096).unwrap();
    let kept_v = kept.tensor(&[1024], DType::F32).unwrap();
    let t = cluster
        .submit(Task::new("test.touch").input(&kept_v))
        .unwrap();
    cluster.wait(t).unwrap();
    assert_eq!(imports(), 1);
    // A buffer whose only handle is dropped while a task that uses it
    // waits behind a slow one.
    let gate = cluster
        .submit(Task::new("test.sleep").scalar_u64(300))
        .unwrap();
    let dropped = cluster.buffer_from_slice(&[3.0f32; 1024]).unwrap();
    let dv = dropped.tensor(&[1024], DType::F32).unwrap();
    let out = cluster
        .buffer(4096)
        .unwrap()
        .tensor(&[1024], DType::F32)
        .unwrap();
    let copy = cluster
        .submit(Task::new("copy").input(&dv).output(&out).after(gate))
        .unwrap();
    drop(dv);
    drop(dropped);
    cluster.wait(copy).unwrap();
    assert!(
        out.read::<f32>().unwrap().iter().all(|&x| x == 3.0),
        "the copy read the dropped buffer's bytes"
    );
    // Now nothing uses it: the worker lets go of it (and of `out`, once
    // dropped), but keeps the buffer we still hold.
    drop(out);
    assert!(eventually(|| imports() == 1), "imports: {}", imports());
    drop(kept_v);
    drop(kept);
    assert!(eventually(|| imports() == 0), "imports: {}", imports());
    // Scopes: a scoped buffer is released once the scope ends and its
    // tasks are done, even while the driver holds no handle.
    let scope = cluster.open_scope().unwrap();
    let s = cluster.buffer(4096).unwrap();
    cluster.scope_buffer(scope, &s).unwrap();
    let sv = s.tensor(&[1024], DType::F32).unwrap();
    let t = cluster
        .submit(Task::new("fill").output(&sv).scalar_f64(1.0))
        .unwrap();
    drop(sv);
    drop(s);
    cluster.wait(t).unwrap();
    assert_eq!(imports(), 1, "the scope holds it");
    cluster.end_scope(scope).unwrap();
    assert!(eventually(|| imports() == 0), "imports: {}", imports());
    assert!(cluster.end_scope(scope).is_err(), "a scope ends once");
}

#[test]
fn a_cluster_reaches_tls_workers_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = super::worker::Pki::new("strata test CA");
    let (cert, key) = ca.leaf("localhost");
    let write = |name: &str, pem: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, pem).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let args = [
        "--tls-cert".to_owned(),
        write("w.pem", &cert),
        "--tls-key".to_owned(),
        write("w.key", &key),
        "--tls-client-ca".to_owned(),
        write("ca.pem", &ca.ca),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let w = WorkerProcess::spawn_tcp(&strata_bin(), &["worker"], &args);
    let tls = |(cert, key): (String, String)| strata_orchestrator::ClientTls {
        ca_pem: ca.ca.clone().into_bytes(),
        cert_pem: cert.into_bytes(),
        key_pem: key.into_bytes(),
        domain: "localhost".into(),
    };
    let rogue = super::worker::Pki::new("another CA");
    let refused = Cluster::builder()
        .connect_tls(&w.endpoint.to_string(), None, tls(rogue.leaf("driver")))
        .unwrap()
        .start();
    assert!(matches!(refused, Err(Error::Cluster(_))), "{refused:?}");
    let cluster = Cluster::builder()
        .connect_tls(&w.endpoint.to_string(), None, tls(ca.leaf("driver")))
        .unwrap()
        .start()
        .unwrap();
    // A TLS worker offers no data connection: its frames would not be
    // encrypted, so every byte stays on the TLS connection.
    assert!(!cluster.workers()[0].data_connection);
    let r = strata_orchestrator::demo::tiled_matmul(&cluster, 128, 32, 4).unwrap();
    assert!(r.ok(1e-3));
}

#[test]
fn cancelled_tasks_skip_their_consumers_and_release_nothing_early() {
    let cluster = local(1, test_worker_bin());
    let b = cluster.buffer(64).unwrap();
    let v = b.tensor(&[16], DType::F32).unwrap();
    let gate = cluster
        .submit(Task::new("test.sleep").scalar_u64(200))
        .unwrap();
    let producer = cluster
        .submit(Task::new("fill").output(&v).scalar_f64(1.0).after(gate))
        .unwrap();
    let consumer = cluster
        .submit(
            Task::new("reduce_sum")
                .input(&v)
                .output(&cluster.buffer(4).unwrap().tensor(&[1], DType::F32).unwrap()),
        )
        .unwrap();
    cluster.cancel(producer).unwrap();
    let e = cluster.wait(producer).unwrap_err().to_string();
    assert!(e.contains("CANCELLED"), "{e}");
    let e = cluster.wait(consumer).unwrap_err().to_string();
    assert!(e.contains("SKIPPED"), "{e}");
    cluster.wait(gate).unwrap();
    assert!(
        cluster.cancel(gate).is_err(),
        "a finished task cannot be cancelled"
    );
    // Cancelling is not a failure of the run.
    let s = cluster.wait_all().unwrap();
    assert_eq!((s.cancelled, s.skipped, s.succeeded), (1, 1, 1));
    assert_eq!(
        v.read::<f32>().unwrap(),
        vec![0.0; 16],
        "the producer never ran"
    );
}

#[test]
fn blocking_calls_from_inside_an_async_runtime_are_refused_not_panicking() {
    let cluster = local(1, &strata_bin());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let e = rt.block_on(async { cluster.wait_all() }).unwrap_err();
    assert!(e.to_string().contains("async"), "{e}");
    // Dropping it there is fine too.
    rt.block_on(async move { drop(cluster) });
}

#[test]
fn a_crashed_workers_last_words_are_in_the_error() {
    let cluster = local(2, test_worker_bin());
    let w = cluster.workers()[0].id;
    let t0 = Instant::now();
    let h = cluster.submit(Task::new("test.abort").on(w)).unwrap();
    let e = cluster.wait(h).unwrap_err().to_string();
    eprintln!(
        "a crash was reported {:.1} ms after the task was submitted",
        t0.elapsed().as_secs_f64() * 1e3
    );
    assert!(
        e.contains("ENDPOINT_FAILURE") && e.contains("test.abort: aborting"),
        "{e}"
    );
    // Tasks placed freely go to the survivor; those named to the lost
    // worker fail at once.
    let t = cluster.submit(Task::new("noop")).unwrap();
    cluster.wait(t).unwrap();
    let t = cluster.submit(Task::new("noop").on(w)).unwrap();
    let e = cluster.wait(t).unwrap_err().to_string();
    assert!(e.contains("is down"), "{e}");
}

/// The pids of the live children of `parent`.
fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        let rest = &stat[stat.rfind(')').unwrap_or(0) + 1..];
        let mut f = rest.split_whitespace();
        let state = f.next().unwrap_or("");
        if f.next().and_then(|p| p.parse::<u32>().ok()) == Some(parent) && state != "Z" {
            out.push(pid);
        }
    }
    out
}

#[test]
fn workers_spawned_by_a_killed_driver_exit_on_their_own() {
    // `strata demo` is a driver that spawns its workers; kill it mid-run.
    let mut driver = std::process::Command::new(strata_bin())
        .args(["demo", "--workers", "2", "--size", "2048", "--tile", "64"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut workers = Vec::new();
    assert!(
        eventually(|| {
            workers = children(driver.id());
            workers.len() == 2
        }),
        "the demo started its workers"
    );
    driver.kill().unwrap();
    driver.wait().unwrap();
    let killed = Instant::now();
    // Orphans are re-parented; they see their stdin close and shut down.
    assert!(
        eventually(|| workers.iter().all(|&p| strata_tests::process_exited(p))),
        "workers {workers:?} outlived their driver"
    );
    eprintln!(
        "the killed driver's workers were gone {:.0} ms after it",
        killed.elapsed().as_secs_f64() * 1e3
    );
}

#[test]
fn a_control_call_to_a_hung_worker_returns_at_the_health_deadline() {
    // Not spawned by the cluster, so not killed when lost: the call must
    // give up by itself.
    let w = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let cluster = Cluster::builder()
        .connect(&w.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(w.pid() as i32);
    w.hang();
    let t0 = Instant::now();
    // On its own thread, so that a hang fails the test instead of
    // hanging it (SIGCONT then lets the call finish).
    let (tx, rx) = std::sync::mpsc::channel();
    let (got, waited, at_once) = std::thread::scope(|s| {
        s.spawn(|| tx.send(cluster.device_buffer(WorkerId(0), 4096).map(drop)));
        let got = rx.recv_timeout(Duration::from_secs(5));
        let waited = t0.elapsed();
        // Once lost (and while still hung), calls fail at once.
        let t1 = Instant::now();
        let at_once = cluster.worker_stats(WorkerId(0)).is_err();
        let at_once = at_once && t1.elapsed() < Duration::from_millis(100);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
        (got, waited, at_once)
    });
    let e = got
        .expect("the call returned within 5 s")
        .expect_err("a stopped worker cannot allocate");
    assert!(e.to_string().contains("lost"), "{e}");
    assert!(waited < Duration::from_millis(2500), "waited {waited:?}");
    assert!(at_once, "calls to a lost worker fail at once");
    // Woken up, it rejoins (the cluster connected to it, so it dials it
    // again) and answers calls.
    cluster
        .wait_up(WorkerId(0), Duration::from_secs(15))
        .expect("rejoined");
    cluster
        .device_buffer(WorkerId(0), 4096)
        .expect("allocates again");
    eprintln!(
        "a control call to a hung worker returned after {:.0} ms",
        waited.as_secs_f64() * 1e3
    );
}

/// A view larger than a message travels in chunks both ways: the input is
/// staged ahead of its task, the written view fetched after it, and the
/// bytes are those a one-by-one copy gives (strided views: packing and
/// unpacking on both sides).
#[test]
fn views_larger_than_a_message_travel_in_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "big").unwrap();
    let w = WorkerProcess::spawn_tcp(
        &strata_bin(),
        &["worker"],
        &[
            "--token-file",
            token.to_str().unwrap(),
            "--max-message-bytes",
            "1048576",
        ],
    );
    // The strided pack and unpack of 1.5 Mi runs each way take long in a
    // debug build; they run off the async runtimes (strata_proto::offload),
    // so the 1 s default health deadline holds even on a loaded machine
    // (6 of 6 runs with four busy loops beside it, 2026-12-03; before the
    // change it passed 2 of 6 at a load average of about 5).
    let cluster = Cluster::builder()
        .connect(&w.endpoint.to_string(), Some("big"))
        .unwrap()
        .start()
        .unwrap();
    // 1.5 Mi F32, every other one of a 3 Mi buffer: 6 MiB packed each way.
    let n = 3u32 << 19;
    let values: Vec<f32> = (0..2 * n).map(|i| (i % 9973) as f32 * 0.5).collect();
    let src_buf = cluster.buffer_from_slice(&values).unwrap();
    let src = src_buf.view(0, &[n], &[2], DType::F32).unwrap();
    let dst_buf = cluster.buffer(u64::from(2 * n) * 4).unwrap();
    let dst = dst_buf.view(4, &[n], &[2], DType::F32).unwrap();
    let big = cluster
        .submit(Task::new("copy").input(&src).output(&dst))
        .unwrap();
    cluster.wait(big).unwrap();
    let got = dst_buf
        .tensor(&[2 * n], DType::F32)
        .unwrap()
        .read::<f32>()
        .unwrap();
    for i in 0..2 * n as usize {
        let want = if i % 2 == 1 { values[i - 1] } else { 0.0 };
        assert!(got[i] == want, "element {i}: {} != {want}", got[i]);
    }
    let t = cluster.totals().unwrap();
    assert!(
        t.sent_bytes >= 6 << 20 && t.returned_bytes >= 6 << 20,
        "{t:?}"
    );
    // A view past what travels inline at all is refused by the worker when
    // it is staged: that task fails alone, saying why.
    let huge = (strata_proto::MAX_INLINE_EXTENT / 4 + 1) as u32;
    let view = |b: Buffer| b.tensor(&[huge], DType::F32).unwrap();
    let (from, to) = (
        view(cluster.buffer(u64::from(huge) * 4).unwrap()),
        view(cluster.buffer(u64::from(huge) * 4).unwrap()),
    );
    let task = cluster
        .submit(Task::new("copy").input(&from).output(&to))
        .unwrap();
    let e = cluster.wait(task).unwrap_err().to_string();
    assert!(
        e.contains("TASK_FAILURE")
            && e.contains("staging its")
            && e.contains("the largest inline view"),
        "{e}"
    );
    // The connection is fine: small tasks still run there.
    let s = cluster
        .buffer(64)
        .unwrap()
        .tensor(&[16], DType::F32)
        .unwrap();
    let t = cluster
        .submit(Task::new("fill").output(&s).scalar_f64(1.0))
        .unwrap();
    cluster.wait(t).unwrap();
    assert_eq!(s.read::<f32>().unwrap(), vec![1.0; 16]);
}

#[test]
fn spawned_workers_live_in_a_private_directory() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = local(1, &strata_bin());
    let ep = &cluster.workers()[0].endpoint;
    let sock = std::path::Path::new(ep.strip_prefix("unix:").unwrap());
    let mode = std::fs::metadata(sock.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

/// The worker (by index) with a task in flight, waiting for one to start.
fn busy_worker(cluster: &Cluster) -> WorkerId {
    for _ in 0..200 {
        for w in cluster.workers() {
            if cluster
                .worker_stats(w.id)
                .is_ok_and(|s| s.tasks_in_flight > 0)
            {
                return w.id;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no task started");
}

fn kill_worker(cluster: &Cluster, w: WorkerId) {
    let pid = cluster.workers()[w.0 as usize].pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

#[test]
fn with_the_retry_policy_output_tasks_rerun_elsewhere_and_inout_tasks_never() {
    let cluster = Cluster::builder()
        .local(3)
        .worker_binary(test_worker_bin())
        .retry(1)
        .start()
        .unwrap();
    let cell = cluster
        .buffer(64)
        .unwrap()
        .tensor(&[16], DType::F32)
        .unwrap();
    // An OUTPUT task whose worker is killed under it runs again elsewhere.
    let out = cluster
        .submit(Task::new("test.slow").output(&cell).scalar_u64(400))
        .unwrap();
    let first = busy_worker(&cluster);
    let killed = Instant::now();
    kill_worker(&cluster, first);
    cluster.wait(out).unwrap_or_else(|e| panic!("retried: {e}"));
    eprintln!(
        "the OUTPUT task (400 ms) finished on a survivor {:.0} ms after its worker was killed",
        killed.elapsed().as_secs_f64() * 1e3
    );
    let s = cluster.wait_all().unwrap();
    assert_eq!((s.succeeded, s.failed), (1, 0));
    let ran_on: Vec<u64> = cluster
        .workers()
        .iter()
        .filter(|w| w.id != first)
        .map(|w| cluster.worker_stats(w.id).unwrap().tasks_succeeded)
        .collect();
    assert_eq!(ran_on.iter().sum::<u64>(), 1, "it ran once on a survivor");
    // An INOUT task is never rerun: its input may be half overwritten.
    let inout = cluster
        .submit(Task::new("test.slow.x").inout(&cell).scalar_u64(400))
        .unwrap();
    let second = busy_worker(&cluster);
    kill_worker(&cluster, second);
    let e = cluster.wait(inout).unwrap_err().to_string();
    assert!(e.contains("ENDPOINT_FAILURE"), "{e}");
    // Without the policy nothing is rerun either.
    let plain = local(2, test_worker_bin());
    let c2 = plain.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    let t = plain
        .submit(Task::new("test.slow").output(&c2).scalar_u64(400))
        .unwrap();
    let w = busy_worker(&plain);
    kill_worker(&plain, w);
    assert!(plain.wait(t).is_err());
}

#[test]
fn a_killed_driver_leaves_nothing_held_on_its_workers() {
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &[]);
    let stats = || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut c = strata_client::WorkerClient::connect(&w.endpoint, None)
                .await
                .unwrap();
            c.handshake().await.unwrap();
            c.stats().await.unwrap()
        })
    };
    let idle = stats();
    // A driver that imports buffers and allocates device memory there,
    // killed in the middle of its job.
    let mut driver = std::process::Command::new(strata_bin())
        .args([
            "demo",
            "--workers",
            &w.endpoint.to_string(),
            "--size",
            "2048",
            "--tile",
            "64",
            "-q",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(|| {
            let s = stats();
            s.imports > 0 && s.persistent.in_use > idle.persistent.in_use
        }),
        "the driver got going"
    );
    // Another driver shares the worker and keeps working through the kill.
    let other = Cluster::builder()
        .connect(&w.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (jobs, killed) = std::thread::scope(|s| {
        let running = s.spawn(|| {
            let mut jobs = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || jobs == 0 {
                let r = strata_orchestrator::demo::tiled_matmul(&other, 128, 32, 4)
                    .expect("the other driver's job");
                assert!(r.ok(1e-3), "max |err| {}", r.max_abs_err);
                jobs += 1;
            }
            jobs
        });
        std::thread::sleep(Duration::from_millis(50));
        driver.kill().unwrap();
        driver.wait().unwrap();
        let killed = Instant::now();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (running.join().unwrap(), killed)
    });
    assert!(jobs > 0);
    drop(other);
    assert!(
        eventually(|| {
            let s = stats();
            s.imports == 0
                && s.persistent.in_use == idle.persistent.in_use
                && s.tasks_in_flight == 0
        }),
        "the worker let go of the dead driver's imports and device buffers: {:?}",
        stats()
    );
    eprintln!(
        "a killed driver's session was released; checked {:.0} ms after the kill, with another driver's {jobs} jobs run meanwhile",
        killed.elapsed().as_secs_f64() * 1e3
    );
    // And it serves the next driver.
    let cluster = Cluster::builder()
        .connect(&w.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    let r = strata_orchestrator::demo::tiled_matmul(&cluster, 128, 32, 3).unwrap();
    assert!(r.ok(1e-3));
}

/// Run buffers live for one run: a job keeps its intermediates in the run
/// region, `wait_all` ends the run, and afterwards the handle is refused
/// by the driver (reads, writes, submits) while the worker's run region is
/// back at zero, so the next run can allocate what would not have fit
/// twice.
#[test]
fn run_buffers_end_at_wait_all_and_the_next_run_reuses_the_region() {
    const N: u32 = 150 * 1024; // 600 KiB of F32: two do not fit 1 MiB.
    let cluster = Cluster::builder()
        .local(1)
        .worker_binary(strata_bin())
        .device("sim:mem=16MiB,run=1MiB,mode=staged")
        .start()
        .unwrap();
    let w = WorkerId(0);
    assert_eq!(cluster.current_run(), 0);
    let out = cluster.buffer(u64::from(N) * 4).unwrap();
    let out_v = out.tensor(&[N], DType::F32).unwrap();

    // Run 0: fill a run buffer on the device, copy it out to the host.
    let tmp = cluster.run_buffer(w, u64::from(N) * 4).unwrap();
    let tmp_v = tmp.tensor(&[N], DType::F32).unwrap();
    cluster
        .submit(Task::new("fill").output(&tmp_v).scalar_f64(2.5))
        .unwrap();
    cluster
        .submit(Task::new("copy").input(&tmp_v).output(&out_v))
        .unwrap();
    let during = cluster.worker_stats(w).unwrap().run;
    assert_eq!(during.in_use, u64::from(N) * 4, "the run block is held");
    let too_much = cluster.run_buffer(w, u64::from(N) * 4).unwrap_err();
    assert!(
        too_much.to_string().contains("run region"),
        "a second 600 KiB block does not fit this run: {too_much}"
    );
    cluster.wait_all().unwrap();
    assert_eq!(cluster.current_run(), 1);
    assert!(out.to_vec::<f32>().unwrap().iter().all(|&x| x == 2.5));

    // The run ended: the worker reset its run region...
    let after = cluster.worker_stats(w).unwrap().run;
    assert_eq!(after.in_use, 0, "run region cursor back at 0");
    assert_eq!(after.frees, during.frees + 1, "exactly one reset");
    // ...and the driver refuses the handle at once, naming the run.
    for e in [
        cluster.read_device(&tmp, 0, 4).unwrap_err(),
        cluster.write_device(&tmp, 0, &[0; 4]).unwrap_err(),
        cluster
            .submit(Task::new("fill").output(&tmp_v).scalar_f64(1.0))
            .unwrap_err(),
    ] {
        let msg = e.to_string();
        assert!(
            msg.contains("belonged to run 0, which ended at wait_all"),
            "{msg}"
        );
    }

    // Run 1 allocates the same amount again from the reset region.
    let again = cluster.run_buffer(w, u64::from(N) * 4).unwrap();
    let again_v = again.tensor(&[N], DType::F32).unwrap();
    cluster
        .submit(Task::new("fill").output(&again_v).scalar_f64(-1.0))
        .unwrap();
    cluster.wait_all().unwrap();
    // A persistent device buffer is untouched by run ends.
    let keep = cluster.device_buffer(w, 64).unwrap();
    cluster.write_device(&keep, 0, &[9; 64]).unwrap();
    cluster.wait_all().unwrap();
    assert_eq!(cluster.read_device(&keep, 0, 64).unwrap(), vec![9; 64]);
    let end = cluster.worker_stats(w).unwrap().run;
    assert_eq!((end.in_use, end.frees), (0, during.frees + 2));
    assert!(cluster.read_device(&again, 0, 4).is_err());
}

/// A group publishes one completion token (docs/scheduling.md#submitting-check-then-insert): both members write
/// the same bytes — accepted, since members are not compared — and a task
/// that names only the token runs after the whole group, here after the
/// slow member on a worker whose hash kernels take 300 ms.
#[test]
fn a_group_publishes_one_completion_token() {
    let slow = WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--hash-delay-ms", "300"]);
    let fast = WorkerProcess::spawn_unix(test_worker_bin(), &[], &[]);
    let cluster = Cluster::builder()
        .connect(&fast.endpoint.to_string(), None)
        .unwrap()
        .connect(&slow.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    let view = |n: u32| {
        cluster
            .buffer(u64::from(n) * 4)
            .unwrap()
            .tensor(&[n], DType::U32)
            .unwrap()
    };
    let (a, b, token, c) = (view(256), view(256), view(4), view(4));
    let t0 = Instant::now();
    let member = |own: &strata_orchestrator::View, w: u32| {
        Task::new("test.hash.ww")
            .output(own)
            .output(&token)
            .scalar_u64(9)
            .on(WorkerId(w))
    };
    let group = cluster
        .submit_group(vec![member(&a, 0), member(&b, 1)])
        .expect("members writing one token are accepted");
    let after = cluster
        .submit(
            Task::new("test.hash.rw")
                .input(&token)
                .output(&c)
                .scalar_u64(10)
                .on(WorkerId(0)),
        )
        .unwrap();
    cluster.wait(after).unwrap();
    let waited = t0.elapsed();
    cluster.wait(group).unwrap();
    assert!(
        waited >= Duration::from_millis(300),
        "the token's reader finished {waited:?} after submission, before the slow member"
    );
    // Both members wrote the same token (same seed, no inputs).
    assert_ne!(token.read::<u32>().unwrap(), vec![0; 4]);
    assert_ne!(c.read::<u32>().unwrap(), vec![0; 4]);
}

#[test]
fn a_device_spec_no_worker_accepts_fails_the_start_before_any_worker_runs() {
    for (local, in_process) in [(1, 0), (0, 1)] {
        let t0 = Instant::now();
        let e = Cluster::builder()
            .local(local)
            .in_process(in_process)
            .worker_binary(strata_bin())
            .device("gpu")
            .start()
            .expect_err("a gpu device is refused");
        assert!(
            matches!(e, Error::Cluster(ClusterError::Device { .. })),
            "{e:?}"
        );
        let m = e.to_string();
        assert!(
            m.contains("unknown device kind \"gpu\" (known: sim, cuda)"),
            "{m}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{m}");
    }
    // A bad key in a known kind is named too.
    let e = Cluster::builder()
        .in_process(1)
        .device("sim:mem=lots")
        .start()
        .expect_err("a bad size is refused");
    assert!(e.to_string().contains("mem"), "{e}");
}

/// Complex views from Rust, through worker processes: written and read as
/// `num_complex::Complex` (re-exported by the chip runtime), multiplied
/// on a transposed view, and summed, against the same sums done here.
#[test]
fn complex_views_round_trip_and_multiply_through_workers() {
    use strata_chip_runtime::num_complex::Complex;
    let cluster = local(2, &strata_bin());
    let (m, k, n) = (5u32, 4u32, 3u32);
    let at = |i: u32, j: u32| Complex::new(f64::from(i) - 1.5, f64::from(j) * 0.5 + 1.0);
    let bt = |i: u32, j: u32| Complex::new(f64::from(i * j) * 0.25, -f64::from(i + j));
    // a is held transposed: its buffer is k×m row-major, viewed as m×k.
    let abuf = cluster.buffer(u64::from(m * k) * 16).unwrap();
    let stored = abuf.tensor(&[k, m], DType::C128).unwrap();
    let mut a_t = Vec::new();
    for p in 0..k {
        for i in 0..m {
            a_t.push(at(i, p));
        }
    }
    stored.write(&a_t).unwrap();
    let a = abuf.view(0, &[m, k], &[1, m], DType::C128).unwrap();
    let bbuf = cluster.buffer(u64::from(k * n) * 16).unwrap();
    let b = bbuf.tensor(&[k, n], DType::C128).unwrap();
    b.write(&(0..k * n).map(|e| bt(e / n, e % n)).collect::<Vec<_>>())
        .unwrap();
    let c = cluster
        .buffer(u64::from(m * n) * 16)
        .unwrap()
        .tensor(&[m, n], DType::C128)
        .unwrap();
    let r = cluster
        .buffer(u64::from(m) * 16)
        .unwrap()
        .tensor(&[m], DType::C128)
        .unwrap();
    cluster
        .submit(Task::new("matmul").input(&a).input(&b).output(&c))
        .unwrap();
    cluster
        .submit(Task::new("reduce_sum").input(&c).output(&r))
        .unwrap();
    cluster.wait_all().unwrap();
    let got: Vec<Complex<f64>> = c.read().unwrap();
    let sums: Vec<Complex<f64>> = r.read().unwrap();
    for i in 0..m {
        let mut sum = Complex::new(0.0, 0.0);
        for j in 0..n {
            let want: Complex<f64> = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
            let g = got[(i * n + j) as usize];
            assert!(
                (g - want).l1_norm() < 1e-12,
                "c[{i},{j}] = {g}, want {want}"
            );
            sum += want;
        }
        let s = sums[i as usize];
        assert!((s - sum).l1_norm() < 1e-12, "r[{i}] = {s}, want {sum}");
    }
    // Reading as another element type is refused, naming both dtypes.
    let e = c.read::<f64>().unwrap_err().to_string();
    assert!(e.contains("C128") && e.contains("F64"), "{e}");
}
