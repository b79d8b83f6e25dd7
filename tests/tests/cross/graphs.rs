//! `strata run` on graph files and `strata demo --trace`, through the real
//! binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use strata_tests::strata_bin;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `strata` with `TMPDIR` set to `tmp` (so any worker it spawns has
/// its sockets there, and can be found afterwards).
fn strata(args: &[&str], tmp: &Path) -> Output {
    Command::new(strata_bin())
        .args(args)
        .env("TMPDIR", tmp)
        .output()
        .expect("run strata")
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

fn npy_f64(path: &Path) -> (Vec<u64>, Vec<f64>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = npy.shape().to_vec();
    let values = match npy.dtype() {
        npyz::DType::Plain(t) if t.to_string() == "<f4" => npy
            .into_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        npyz::DType::Plain(t) if t.to_string() == "<f8" => npy.into_vec::<f64>().unwrap(),
        npyz::DType::Plain(t) if t.to_string() == "<i4" => npy
            .into_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        other => panic!("{}: unexpected dtype {other:?}", path.display()),
    };
    (shape, values)
}

/// `strata run GRAPH ARGS --out-dir OUT` from `tmp`, which must succeed.
fn run_graph(graph: &Path, args: &[&str], out: &Path, tmp: &Path) {
    let mut all = vec!["run", graph.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend(["--out-dir", out.to_str().unwrap()]);
    let o = strata(&all, tmp);
    assert!(
        o.status.success(),
        "{} {args:?}: {}\n{}",
        graph.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn every_example_graph_runs_and_its_outputs_check_out() {
    let dir = repo().join("examples/graphs");
    let mut graphs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    graphs.sort();
    assert!(graphs.len() >= 5, "{graphs:?}");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    for g in &graphs {
        run_graph(g, &["--local", "2"], &out, tmp.path());
    }
    // The outputs, checked here too (not only by the graphs' expectations).
    let (shape, z) = npy_f64(&out.join("out/elementwise_z.npy"));
    assert_eq!(shape, [4, 256]);
    assert!(z.iter().all(|&v| v == 49.0));
    let (shape, c) = npy_f64(&out.join("out/tiled_matmul_c.npy"));
    assert_eq!(shape, [128, 128]);
    assert!(c.iter().all(|&v| v == 16.0));
    let (_, s) = npy_f64(&out.join("out/device_pipeline_s.npy"));
    assert!(s.iter().all(|&v| (v - 1.0).abs() < 1e-5), "{s:?}");
    let (shape, t) = npy_f64(&out.join("out/transpose_t.npy"));
    assert_eq!(shape, [4, 3]);
    assert_eq!(t, [0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]);
    let (_, v) = npy_f64(&out.join("out/strided_v.npy"));
    assert_eq!(v, [1., 3.].repeat(8));
    // Scoped temporaries: 7 where the fresh t2 was filled, 6 below it
    // (where a recycled byte would show).
    let (shape, acc) = npy_f64(&out.join("out/scoped_acc.npy"));
    assert_eq!(shape, [8, 64]);
    assert_eq!(acc, [[7.0; 4 * 64], [6.0; 4 * 64]].concat());
    assert!(processes_mentioning(tmp.path().to_str().unwrap()).is_empty());
}

#[test]
fn an_output_that_misses_its_expectation_fails_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("examples/graphs/elementwise.json")).unwrap();
    let wrong = text.replace("\"const\": 49.0", "\"const\": 50.0");
    assert_ne!(text, wrong);
    let g = tmp.path().join("wrong.json");
    std::fs::write(&g, wrong).unwrap();
    let o = strata(
        &["run", g.to_str().unwrap(), "--local", "1", "-q"],
        tmp.path(),
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("outputs[0]: element 0 is 49, expected 50"),
        "{err}"
    );
}

#[test]
fn malformed_graphs_name_the_json_path_exit_2_and_leave_no_worker() {
    let cases = [
        (
            "after_unknown.json",
            "tasks[0].after[0]: no earlier task is named \"later\"",
        ),
        ("bad_dtype.json", "buffers.a.dtype: unknown dtype \"f33\""),
        (
            "bad_timeout.json",
            "tasks[0].timeout: 0 seconds can never be met; give a positive number of seconds",
        ),
        (
            "bad_tag.json",
            "tasks[0].args[0].tag: unknown tag \"inptu\"",
        ),
        (
            "device_output.json",
            "outputs[0].view: \"d\" is in worker 0's device memory",
        ),
        (
            "grant.json",
            "tasks[0]: member 0 argument 0: tagged OUTPUT but the buffer grants READ",
        ),
        ("missing_npy.json", "buffers.x.init.npy: "),
        ("not_json.json", "$: "),
        (
            "overlapping_writes.json",
            "tasks[0]: member 0: arguments 0 (INPUT) and 1 (OUTPUT) share bytes",
        ),
        ("scalar_type.json", "tasks[0].scalars[0]: expected a number"),
        (
            "strides_rank.json",
            "views.v.strides: 1 strides for 2 dimensions",
        ),
        (
            "unknown_callable.json",
            "tasks[0].callable: unknown callable \"matmull\"",
        ),
        ("unknown_field.json", "tasks[0].calable: unknown field"),
        (
            "unknown_view.json",
            "tasks[1].args[1].view: unknown view \"c0\"",
        ),
        ("view_out_of_bounds.json", "views.tail: view out of bounds"),
        (
            "worker_index.json",
            "tasks[0].worker: worker 9 does not exist; there are 4",
        ),
        (
            "wrong_arg_count.json",
            "tasks[0].args: matmul takes 3 tensor arguments, got 2",
        ),
        (
            "tag_for_kernel.json",
            "tasks[0].args[0].tag: fill writes this argument: tag it output or output_existing, not input",
        ),
        (
            "device_placement.json",
            "tasks[0].worker: worker 0, but argument 0 is in worker 1's device memory",
        ),
        (
            "empty_buffers.json",
            "buffers: empty: a graph needs at least one buffer",
        ),
        ("unknown_init.json", "buffers.a.init: unknown init \"ones\""),
        (
            "kernel_shapes.json",
            "tasks[1]: kernel matmul@1: argument 1 (b): shape [4, 8] does not chain",
        ),
        (
            "scope_view_after_end.json",
            "tasks[1].args[0].view: unknown view \"t\": it belongs to the scope at tasks[0].scope, which has ended",
        ),
        (
            "scope_output.json",
            "outputs[0].view: unknown view \"t\": it belongs to the scope at tasks[0].scope, which has ended",
        ),
        (
            "alloc_zero_axis.json",
            "tasks[0].scope.alloc.t.shape[1]: 0: every axis needs at least one element",
        ),
        (
            "alloc_bad_dtype.json",
            "tasks[0].scope.alloc.t.dtype: unknown dtype \"float33\"",
        ),
        (
            "alloc_name_taken.json",
            "tasks[0].scope.alloc.a: the name \"a\" is taken",
        ),
        (
            "scope_field.json",
            "tasks[0].scope.allocs: unknown field; expected one of alloc, views, tasks, comment",
        ),
    ];
    let dir = repo().join("tests/graphs/malformed");
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, cases.len(), "every malformed file has a case");
    let tmp = tempfile::tempdir().unwrap();
    for (file, want) in cases {
        let path = dir.join(file);
        let o = strata(&["run", path.to_str().unwrap()], tmp.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{file}: {err}");
        assert!(err.contains(&format!("{file}: {want}")), "{file}: {err}");
        assert!(o.stdout.is_empty(), "{file}: nothing ran");
    }
    assert!(
        processes_mentioning(tmp.path().to_str().unwrap()).is_empty(),
        "a worker was left behind"
    );
}

#[test]
fn demo_trace_has_one_slice_per_task_within_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("trace.json");
    let o = strata(
        &[
            "demo",
            "--workers",
            "2",
            "--size",
            "256",
            "--tile",
            "32",
            "--quiet",
            "--trace",
            trace.to_str().unwrap(),
        ],
        tmp.path(),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("result check: passed"), "{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let start = json["otherData"]["run_start_us"].as_f64().unwrap();
    let end = json["otherData"]["run_end_us"].as_f64().unwrap();
    let slices: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "task")
        .collect();
    // (256/32)³ matmul tasks and 3 per block of rows.
    let tasks = 8 * 8 * 8 + 3 * 8;
    assert_eq!(slices.len(), tasks);
    let mut ids: Vec<u64> = slices
        .iter()
        .map(|s| s["args"]["task"].as_u64().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), tasks, "one slice per task");
    for s in &slices {
        let ts = s["ts"].as_f64().unwrap();
        let dur = s["dur"].as_f64().unwrap();
        assert!(dur >= 0.0);
        assert!(
            ts >= start && ts + dur <= end,
            "slice {s} outside [{start}, {end}]"
        );
    }
    // Transfers are slices of their own, inside their task's: a staged
    // chip copies tiles in (C stays in device memory).
    let transfers: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "transfer")
        .collect();
    assert!(
        transfers.iter().any(|t| t["name"] == "copy in"),
        "no copy-in slice"
    );
    for t in &transfers {
        let task = t["args"]["task"].as_u64().unwrap();
        let outer = slices
            .iter()
            .find(|s| s["args"]["task"].as_u64() == Some(task))
            .unwrap();
        let (ts, dur) = (t["ts"].as_f64().unwrap(), t["dur"].as_f64().unwrap());
        let (ots, odur) = (
            outer["ts"].as_f64().unwrap(),
            outer["dur"].as_f64().unwrap(),
        );
        assert!(
            ts >= ots - 1e-6 && ts + dur <= ots + odur + 1e-6,
            "transfer {t} outside its task's slice {outer}"
        );
    }
    // Tracks are named, and dependency arrows pair up.
    assert!(events.iter().any(|e| e["name"] == "thread_name"));
    let starts = events.iter().filter(|e| e["ph"] == "s").count();
    let finishes = events.iter().filter(|e| e["ph"] == "f").count();
    assert_eq!(starts, finishes);
    assert!(starts > 0, "the matmul chains have edges");
}

/// A graph task's `timeout` (seconds) bounds it: a kernel that sleeps past
/// it fails the run at its timeout, with a cause saying so and naming the
/// task by its place in the file, long before the kernel would end.
#[test]
fn a_graph_task_past_its_timeout_fails_the_run_saying_so() {
    let worker =
        strata_tests::WorkerProcess::spawn_unix(crate::faults::test_worker_bin(), &[], &[]);
    let tmp = tempfile::tempdir().unwrap();
    let graph = tmp.path().join("timeout.json");
    std::fs::write(
        &graph,
        r#"{
  "buffers": {"a": {"shape": [64], "dtype": "f32"}},
  "tasks": [
    {"callable": "fill", "args": [{"view": "a", "tag": "output"}], "scalars": [1.0], "timeout": 30},
    {"callable": "test.sleep", "scalars": [5000], "timeout": 0.2}
  ]
}"#,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let o = strata(
        &[
            "run",
            graph.to_str().unwrap(),
            "--workers",
            &worker.endpoint.to_string(),
            "--quiet",
        ],
        tmp.path(),
    );
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tasks[1]")
            && err.contains("TASK_FAILURE")
            && err.contains("timed out after 200 ms"),
        "{err}"
    );
    assert!(took < std::time::Duration::from_secs(4), "took {took:?}");
}

/// Every example graph gives on a GPU what it gives on a simulated chip
/// (the oracle): the same bytes, but for floating-point results of
/// library calls, which may round differently (within 1e-12 of the
/// largest magnitude).
#[test]
fn every_example_graph_gives_on_a_gpu_what_it_gives_on_a_simulated_chip() {
    if !crate::chips::gpu_here("every_example_graph_gives_on_a_gpu_what_it_gives_on_sim") {
        return;
    }
    let dir = repo().join("examples/graphs");
    let mut graphs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    graphs.sort();
    let tmp = tempfile::tempdir().unwrap();
    let on = |device: &str, out: &Path| {
        for g in &graphs {
            run_graph(g, &["--local", "1", "--device", device], out, tmp.path());
        }
    };
    let (sim, gpu) = (tmp.path().join("sim"), tmp.path().join("gpu"));
    on("sim", &sim);
    on("cuda:0,mem=512MiB", &gpu);
    let mut compared = 0;
    for e in std::fs::read_dir(sim.join("out")).unwrap() {
        let path = e.unwrap().path();
        let other = gpu.join("out").join(path.file_name().unwrap());
        let (a, b) = (
            std::fs::read(&path).unwrap(),
            std::fs::read(&other).unwrap(),
        );
        compared += 1;
        if a == b {
            continue;
        }
        let ((sa, va), (sb, vb)) = (npy_f64(&path), npy_f64(&other));
        assert_eq!(sa, sb, "{}", path.display());
        let scale = va.iter().fold(0f64, |m, v| m.max(v.abs())).max(1.0);
        let worst = va
            .iter()
            .zip(&vb)
            .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-12 * scale,
            "{}: differs by {worst} on a GPU",
            path.display()
        );
    }
    assert!(compared >= 10, "{compared} outputs compared");
}
