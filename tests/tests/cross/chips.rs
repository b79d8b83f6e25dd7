//! Chips other than the simulated one, through the real binaries: a CUDA
//! chip where there is no CUDA driver fails at once with one line naming
//! the library (a worker, a cluster, `strata run` and `strata demo`), and
//! a worker whose chip runs only some kernels offers those and names the
//! rest, which the driver names in its refusal.
//!
//! The tests of absence need a machine without a CUDA driver; on one with
//! a driver each says so on one line and checks nothing else. The tests
//! on a GPU need one (or the fake CUDA of `scripts/fakecuda.sh`): without,
//! each says so on one line and passes, unless `STRATA_REQUIRE_CUDA=1`.

use crate::faults::test_worker_bin;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use strata_orchestrator::{Cluster, ClusterError, Error, SubmitError, Task, WorkerId};
use strata_tests::{WorkerProcess, strata_bin};

use crate::faults::within;
use strata_wire::DType;

/// Whether this machine has a CUDA driver (then absence cannot be shown).
fn driver_here(test: &str) -> bool {
    let here = strata_chip_runtime::cuda::device_count().is_ok();
    if here {
        println!("{test}: skipped, a CUDA driver is here and this test shows its absence");
    }
    here
}

/// Whether `cuda:0` is here; if not, one line saying why, or a failure
/// under `STRATA_REQUIRE_CUDA=1`.
pub(crate) fn gpu_here(test: &str) -> bool {
    let why = match strata_chip_runtime::cuda::device_count() {
        Ok(n) if n > 0 => return true,
        Ok(_) => "the CUDA driver sees no GPU".to_owned(),
        Err(e) => e.to_string(),
    };
    assert!(
        std::env::var("STRATA_REQUIRE_CUDA").map_or(true, |v| v != "1"),
        "{test}: STRATA_REQUIRE_CUDA=1 and there is no GPU: {why}"
    );
    println!("{test}: skipped, {why} (STRATA_REQUIRE_CUDA=1 makes this a failure)");
    false
}

fn strata(args: &[&str]) -> (Output, Duration) {
    let t0 = Instant::now();
    let out = Command::new(strata_bin())
        .args(args)
        .output()
        .expect("run strata");
    (out, t0.elapsed())
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_cuda_worker_without_a_driver_exits_at_once_with_one_line_naming_the_library() {
    if driver_here("a_cuda_worker_without_a_driver") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("w.sock").display());
    let (out, took) = strata(&[
        "worker", "--chip", "3", "--device", "cuda:0", "--listen", &listen,
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(out.stdout.is_empty(), "no ready line: {out:?}");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0]
            .starts_with("strata worker: chip 3: no CUDA driver: libcuda.so.1 could not be loaded"),
        "{lines:?}"
    );
    assert!(!dir.path().join("w.sock").exists(), "no socket was bound");
}

/// `cuda:all` names every GPU; a worker owns one. Whether a driver is here
/// or not, the worker says so on one line.
#[test]
fn a_worker_refuses_cuda_all_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("w.sock").display());
    let (out, _) = strata(&["worker", "--device", "cuda:all", "--listen", &listen]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("cuda:all names every GPU and one chip is one GPU"),
        "{lines:?}"
    );
}

#[test]
fn a_cluster_on_cuda_without_a_driver_fails_at_the_start_naming_the_library() {
    if driver_here("a_cluster_on_cuda_without_a_driver") {
        return;
    }
    for (device, local, in_process) in [
        ("cuda:0", 1, 0),
        ("cuda:0", 0, 1),
        ("cuda:all", 0, 0),
        ("cuda:all,mem=1GiB", 2, 0),
        ("cuda:all", 0, 2),
    ] {
        let t0 = Instant::now();
        let e = Cluster::builder()
            .local(local)
            .in_process(in_process)
            .worker_binary(strata_bin())
            .device(device)
            .start()
            .expect_err("no driver");
        assert!(
            matches!(e, Error::Cluster(ClusterError::Device { .. })),
            "{device}: {e:?}"
        );
        assert!(
            e.to_string()
                .contains("no CUDA driver: libcuda.so.1 could not be loaded"),
            "{device}: {e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{device}: {e}");
    }
}

#[test]
fn strata_run_and_demo_on_cuda_without_a_driver_fail_naming_the_library() {
    if driver_here("strata_run_and_demo_on_cuda_without_a_driver") {
        return;
    }
    let graph = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/graphs/elementwise.json");
    let graph = graph.to_str().unwrap();
    for args in [
        vec!["demo", "--device", "cuda:0", "--quiet"],
        vec!["demo", "--device", "cuda:all", "--quiet"],
        vec!["demo", "--device", "cuda:all", "--workers", "2", "--quiet"],
        vec!["run", graph, "--device", "cuda:0", "--quiet"],
        vec![
            "run",
            graph,
            "--device",
            "cuda:all",
            "--in-process",
            "--quiet",
        ],
    ] {
        let (out, took) = strata(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(took < Duration::from_secs(5), "{args:?}: took {took:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no CUDA driver: libcuda.so.1 could not be loaded"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A worker whose chip runs `copy` and `fill` only (the test worker's
/// `--runs-only`) offers those, names every other kernel it has as
/// without a body, and the driver's refusal of `axpy` names the chip;
/// beside a worker that runs everything, `axpy` goes there, and pinned to
/// the first it is refused naming that worker.
#[test]
fn a_worker_offers_only_what_its_chip_runs_and_the_driver_names_the_rest() {
    let picky = WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--runs-only", "copy,fill"]);
    let cluster = Cluster::builder()
        .connect(&picky.endpoint.to_string(), None)
        .unwrap()
        .local(1)
        .worker_binary(strata_bin())
        .start()
        .unwrap();
    // Local workers come first: the picky one is worker 1.
    let w = &cluster.workers()[1];
    assert_eq!(w.callables, ["copy@1", "fill@1"]);
    assert!(w.no_body.iter().any(|n| n == "axpy@1"), "{:?}", w.no_body);
    assert!(
        w.no_body.iter().any(|n| n.starts_with("test.hash.")),
        "the test worker's own kernels too: {:?}",
        w.no_body
    );
    assert!(cluster.workers()[0].no_body.is_empty());
    let x = cluster.buffer_from_slice(&[1.0f32; 16]).unwrap();
    let x = x.tensor(&[16], DType::F32).unwrap();
    let y = cluster
        .buffer(64)
        .unwrap()
        .tensor(&[16], DType::F32)
        .unwrap();
    cluster
        .submit(Task::new("fill").output(&y).scalar_f64(2.0).on(WorkerId(1)))
        .unwrap();
    cluster
        .submit(Task::new("axpy").input(&x).inout(&y).scalar_f64(3.0))
        .unwrap();
    cluster.wait_all().unwrap();
    assert_eq!(y.read::<f32>().unwrap(), vec![5.0f32; 16]);
    let e = cluster
        .submit(
            Task::new("axpy")
                .input(&x)
                .inout(&y)
                .scalar_f64(1.0)
                .on(WorkerId(1)),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::Submit(SubmitError::NoBody { ids, .. }) if ids == &[WorkerId(1)]),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "submit: callable \"axpy@1\" has no body for the chip of worker 1 ({})",
            w.device
        )
    );
    // A test kernel registered only on the picky worker, where its chip
    // has no body for it: no worker offers it.
    let hash = w
        .no_body
        .iter()
        .find(|n| n.starts_with("test.hash."))
        .unwrap()
        .clone();
    let name = hash.split_once('@').unwrap().0.to_owned();
    let e = cluster.submit(Task::new(&name).input(&x)).unwrap_err();
    assert!(
        matches!(&e, Error::Submit(SubmitError::NoBody { ids, .. }) if ids == &[WorkerId(1)]),
        "{e:?}"
    );
    cluster.shutdown().unwrap();
}

/// `cuda:all` names the chips of the workers a driver starts; beside
/// running workers, with no number asked for, it starts none and asks no
/// CUDA driver: the demo runs on the running worker, driver or not.
#[test]
fn cuda_all_beside_running_workers_starts_none() {
    let w = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &[]);
    let endpoint = w.endpoint.to_string();
    let (out, _) = strata(&[
        "demo",
        "--workers",
        &endpoint,
        "--device",
        "cuda:all",
        "--size",
        "64",
        "--tile",
        "32",
        "--quiet",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A chip that can run nothing more (as a GPU whose context a fault
/// lost: the test worker's `--lose-on noop`) fails the task that lost it
/// with the cause, as a device failure; the worker process then stops and
/// exits 1 naming the cause, so that it can be replaced; the driver sees
/// it down and finishes without hanging.
#[test]
fn a_lost_chip_fails_its_task_and_its_worker_exits_to_be_replaced() {
    let mut w = WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--lose-on", "noop"]);
    let cluster = Cluster::builder()
        .connect(&w.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    let x = cluster.buffer_from_slice(&[1.0f32; 4]).unwrap();
    let x = x.tensor(&[4], DType::F32).unwrap();
    cluster
        .submit(Task::new("fill").output(&x).scalar_f64(2.0))
        .unwrap();
    cluster.wait_all().expect("the chip works before");
    let h = cluster.submit(Task::new("noop")).unwrap();
    let e = cluster.wait(h).unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    let status = w.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(1), "log:\n{}", w.log());
    assert!(w.log().contains("chip lost"), "log:\n{}", w.log());
    within(Duration::from_secs(10), || !cluster.is_up(WorkerId(0))).expect("seen down");
    assert_eq!(x.read::<f32>().unwrap(), vec![2.0f32; 4]);
}

/// `strata devices` says what is here: without a CUDA driver, the
/// simulated chip, the driver's absence naming the library, and exit 1;
/// with a GPU (or the fake), each GPU with its compute capability and
/// mode, each library with its version, and exit 0.
#[test]
fn strata_devices_lists_the_chips_and_what_cuda_lacks() {
    let (out, took) = strata(&["devices"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(text.starts_with("sim: the simulated chip"), "{text}");
    if strata_chip_runtime::cuda::device_count().is_err() {
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(
            text.contains("CUDA driver: no CUDA driver: libcuda.so.1 could not be loaded"),
            "{text}"
        );
        assert!(
            text.trim_end().ends_with("no cuda chip opens here"),
            "{text}"
        );
        return;
    }
    if !gpu_here("strata_devices_lists_the_chips_and_what_cuda_lacks") {
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("CUDA driver: CUDA 13."), "{text}");
    let gpu = text
        .lines()
        .find(|l| l.starts_with("cuda:0: "))
        .unwrap_or_else(|| panic!("no cuda:0 line: {text}"));
    assert!(
        gpu.contains("compute capability") && gpu.contains("compute mode"),
        "{gpu}"
    );
    for lib in ["NVRTC: ", "cuBLAS: 13.", "cuSOLVER: "] {
        assert!(text.lines().any(|l| l.starts_with(lib)), "{lib}: {text}");
    }
    assert!(text.contains("chips that open here: sim, cuda:0"), "{text}");
}

/// The demo on a GPU: every result checked against its reference, the
/// chip named in the header line.
#[test]
fn the_demo_runs_on_a_gpu() {
    if !gpu_here("the_demo_runs_on_a_gpu") {
        return;
    }
    let (out, _) = strata(&[
        "demo",
        "--device",
        "cuda:0,mem=1GiB",
        "--size",
        "128",
        "--tile",
        "32",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("strata demo: 1 worker (cuda:0"), "{text}");
    assert!(text.contains("result check: passed"), "{text}");
}

/// The tiled Cholesky with its matrix in device memory, as a GPU library
/// keeps it: right in F32 and F64, and its tile tasks move no byte
/// between host and chip nor copy one on the chip (the host-buffer run of the same job moves its
/// tiles in and every written one back) — on a simulated chip, and on
/// `cuda:0` where there is one.
#[test]
fn a_cholesky_in_device_memory_moves_no_tile_between_host_and_chip() {
    use strata_orchestrator::demo::{MatrixHome, cholesky_runs_in};
    let mut chips = vec!["sim"];
    if gpu_here("a_cholesky_in_device_memory_moves_no_tile_between_host_and_chip") {
        chips.push("cuda:0,mem=512MiB");
    }
    for device in chips {
        let cluster = Cluster::builder()
            .local(1)
            .worker_binary(strata_bin())
            .device(device)
            .start()
            .expect("cluster");
        for home in [MatrixHome::Host, MatrixHome::Device(WorkerId(0))] {
            let runs = [
                (cholesky_runs_in::<f32>(&cluster, 256, 64, 2, home), 1e-5),
                (cholesky_runs_in::<f64>(&cluster, 256, 64, 2, home), 1e-12),
            ];
            for (r, tol) in runs {
                for r in r.unwrap_or_else(|e| panic!("{device}, {home:?}: {e}")) {
                    let s = &r.summary;
                    assert_eq!((r.tasks, s.succeeded), (20, 20), "{device}, {home:?}");
                    assert!(r.ok(tol), "{device}, {home:?}: residual {}", r.max_abs_err);
                    let moved = (s.to_device_bytes, s.from_device_bytes, s.on_chip_bytes);
                    if home == MatrixHome::Host {
                        assert!(moved.0 > 0 && moved.1 > 0, "{device}: {moved:?}");
                    } else {
                        assert_eq!(moved, (0, 0, 0), "{device}: tiles moved or copied");
                    }
                }
            }
        }
        cluster.shutdown().expect("shutdown");
    }
}

/// A kernel that faults on a GPU loses its context: its task fails naming
/// the driver's error, nothing it wrote comes back, the worker exits 1 to
/// be replaced, and the driver sees it down and does not hang.
#[test]
fn a_faulting_kernel_loses_the_gpu_and_its_worker_exits() {
    if !gpu_here("a_faulting_kernel_loses_the_gpu_and_its_worker_exits") {
        return;
    }
    let mut w =
        WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--device", "cuda:0,mem=256MiB"]);
    let cluster = Cluster::builder()
        .connect(&w.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    let x = cluster.buffer_from_slice(&[1.0f32; 1024]).unwrap();
    let x = x.tensor(&[1024], DType::F32).unwrap();
    cluster
        .submit(Task::new("fill").output(&x).scalar_f64(2.0))
        .unwrap();
    cluster.wait_all().expect("the GPU works before");
    let h = cluster
        .submit(Task::new("test.cuda_fault").output(&x))
        .unwrap();
    let e = cluster.wait(h).unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    let status = w.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(1), "log:\n{}", w.log());
    assert!(w.log().contains("chip lost"), "log:\n{}", w.log());
    within(Duration::from_secs(10), || !cluster.is_up(WorkerId(0))).expect("seen down");
    assert_eq!(x.read::<f32>().unwrap(), vec![2.0f32; 1024]);
}

/// A spawned GPU worker whose context a kernel lost is replaced (with
/// `respawn`): a new process on a new context, where the next tasks run
/// and see the bytes the lost task never wrote.
#[test]
fn a_spawned_gpu_worker_that_lost_its_context_is_replaced_and_serves_on() {
    if !gpu_here("a_spawned_gpu_worker_that_lost_its_context_is_replaced") {
        return;
    }
    let cluster = Cluster::builder()
        .local(1)
        .device("cuda:0,mem=256MiB")
        .worker_binary(test_worker_bin())
        .respawn(1)
        .start()
        .unwrap();
    let w = WorkerId(0);
    let first = cluster.worker_pid(w).unwrap();
    let x = cluster.buffer_from_slice(&[1.0f32; 256]).unwrap();
    let x = x.tensor(&[256], DType::F32).unwrap();
    cluster
        .submit(Task::new("fill").output(&x).scalar_f64(2.0))
        .unwrap();
    cluster.wait_all().expect("the GPU works before");
    let h = cluster
        .submit(Task::new("test.cuda_fault").output(&x))
        .unwrap();
    let e = cluster.wait(h).unwrap_err().to_string();
    assert!(e.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    // The worker sees its chip lost and exits; the cluster starts another.
    within(Duration::from_secs(20), || {
        cluster.worker_pid(w).is_some_and(|p| p != first)
    })
    .expect("a new process");
    cluster
        .wait_up(w, Duration::from_secs(20))
        .expect("replaced and rejoined");
    assert!(cluster.wait_all().is_err(), "the run reports the loss");
    assert_eq!(x.read::<f32>().unwrap(), vec![2.0f32; 256]);
    // The failed task's output stays poisoned for tasks until a task
    // writes it whole: here, on the replacement.
    cluster
        .submit(Task::new("fill").output(&x).scalar_f64(3.0))
        .unwrap();
    let y = cluster.buffer(1024).unwrap();
    let y = y.tensor(&[256], DType::F32).unwrap();
    let add = cluster
        .submit(Task::new("add").input(&x).input(&x).output(&y))
        .unwrap();
    cluster.wait(add).expect("the replacement serves");
    assert_eq!(y.read::<f32>().unwrap(), vec![6.0f32; 256]);
    assert_eq!(cluster.worker_stats(w).unwrap().tasks_succeeded, 2);
}

/// How many of `n` unpinned 64×64 F32 matmuls a node of a simulated chip
/// (worker 0, `--device sim_spec`) and a GPU (worker 1, its worker's
/// environment `gpu_env`) each ran, after three pinned ones on each taught
/// the performance models their times; and whether every output equals
/// the product computed here (inputs of small integers: exact in F32).
fn mixed_node(sim_spec: &str, gpu_env: &[(&str, &str)], k: usize, n: usize) -> (u64, u64, bool) {
    let sim = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--device", sim_spec]);
    let gpu = WorkerProcess::spawn_unix_with(
        &strata_bin(),
        &["worker"],
        &["--device", "cuda:0,mem=256MiB"],
        gpu_env,
    );
    let cluster = Cluster::builder()
        .connect(&sim.endpoint.to_string(), None)
        .unwrap()
        .connect(&gpu.endpoint.to_string(), None)
        .unwrap()
        .start()
        .unwrap();
    let t0 = Instant::now();
    let a_vals: Vec<f32> = (0..k * k).map(|i| (i % 3) as f32).collect();
    let b_vals: Vec<f32> = (0..k * k).map(|i| (i % 5) as f32 - 2.0).collect();
    let a = cluster.alloc(&[k as u32, k as u32], DType::F32).unwrap();
    let b = cluster.alloc(&[k as u32, k as u32], DType::F32).unwrap();
    a.write(&a_vals).unwrap();
    b.write(&b_vals).unwrap();
    let mut want = vec![0f32; k * k];
    for i in 0..k {
        for j in 0..k {
            want[i * k + j] = (0..k).map(|l| a_vals[i * k + l] * b_vals[l * k + j]).sum();
        }
    }
    let out = |c: &Cluster| {
        c.buffer((k * k * 4) as u64)
            .unwrap()
            .tensor(&[k as u32, k as u32], DType::F32)
            .unwrap()
    };
    let matmul = |c: &strata_orchestrator::View| Task::new("matmul").input(&a).input(&b).output(c);
    let mut outs = Vec::new();
    for w in [
        WorkerId(0),
        WorkerId(1),
        WorkerId(0),
        WorkerId(1),
        WorkerId(0),
        WorkerId(1),
    ] {
        let c = out(&cluster);
        cluster.submit(matmul(&c).on(w)).unwrap();
        cluster.wait_all().unwrap();
        outs.push(c);
    }
    let ran = |w| cluster.worker_stats(w).unwrap().tasks_succeeded;
    let (s0, g0) = (ran(WorkerId(0)), ran(WorkerId(1)));
    for _ in 0..n {
        let c = out(&cluster);
        cluster.submit(matmul(&c)).unwrap();
        outs.push(c);
    }
    cluster.wait_all().unwrap();
    let exact = outs.iter().all(|c| c.read::<f32>().unwrap() == want);
    println!("{n} tasks on a mixed node in {:.0?}", t0.elapsed());
    (ran(WorkerId(0)) - s0, ran(WorkerId(1)) - g0, exact)
}

/// A node with a simulated chip and a GPU places each task where its
/// models say it finishes first, from the GPU's own (device-timed)
/// reports. A GPU made slow (the fake CUDA's 20 ms per stream operation)
/// gets almost none of the tasks: were its reports to understate the
/// device's time (a kernel timed as its queueing), it would look fast and
/// get them all, and were the models blind to the kind of chip, the split
/// would be even (both checked by breaking them). A
/// simulated chip made slow (a timing chip of 1 GFlop/s: 34 ms per
/// 256×256 product, about what the fake GPU's CPU takes) does not keep
/// them all: the split follows the times (25 to 15 here). On a real GPU
/// the second case alone runs, and the GPU gets most. Without a fake or
/// real GPU it says so and passes.
#[test]
fn a_node_with_a_gpu_and_a_cpu_chip_places_each_task_where_it_finishes_first() {
    if !gpu_here("a_node_with_a_gpu_and_a_cpu_chip_places_each_task_where_it_finishes_first") {
        return;
    }
    let fake = std::env::var("STRATA_FAKE_CUDA").is_ok_and(|v| v == "1");
    if fake {
        let (sim, gpu, exact) = mixed_node("sim", &[("FAKECUDA_DELAY_US", "20000")], 64, 40);
        println!("a slow GPU: the simulated chip ran {sim}, the GPU {gpu} of 40");
        assert!(exact, "every product is right");
        assert!(
            sim >= 30,
            "the faster chip ran {sim} of 40 ({gpu} on the slow GPU)"
        );
    }
    let (sim, gpu, _) = mixed_node("sim:timing=on,gflops=1", &[], 256, 40);
    println!("a slow simulated chip: it ran {sim}, the GPU {gpu} of 40");
    let least = if fake { 4 } else { 30 };
    assert!(
        gpu >= least,
        "the GPU ran {gpu} of 40 ({sim} on the slow chip)"
    );
}
