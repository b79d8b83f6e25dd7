//! The `strata` binary, run as users run it.

use std::path::Path;
use std::process::{Command, Output};

use strata_wire::{DType, TaskArgs, Tensor, check::test_buffer};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("run strata")
}

fn inspect(path: &Path) -> Output {
    strata(&["inspect", path.to_str().unwrap()])
}

fn stdout_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "strata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

#[test]
fn inspect_prints_a_blob_as_json() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/wire/matmul_tile.args");
    let json = stdout_json(&inspect(&path));
    assert_eq!(json["kind"], "task_args");
    assert_eq!(json["tensor_count"], 3);
    assert_eq!(json["scalars"], serde_json::json!([1, 2, 3]));
    let t0 = &json["tensors"][0];
    assert_eq!(t0["dtype"], "F32");
    assert_eq!(t0["shape"], serde_json::json!([64, 64]));
    assert_eq!(t0["strides"], serde_json::json!([256, 1]));
    assert_eq!(t0["byte_offset"], (64 * 256 + 3 * 64) * 4);
    assert_eq!(t0["buffer"]["backend_kind"], "MEMFD");
    assert_eq!(t0["buffer"]["access"], "READWRITE");
    assert_eq!(
        t0["buffer"]["identity"]["owner_instance_id"],
        "6578616d706c6531"
    );
    assert_eq!(t0["buffer"]["identity"]["generation"], 1);
}

#[test]
fn inspect_prints_a_single_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.bin");
    let t = Tensor::new(test_buffer(4096), 16, &[4, 8], &[8, 1], DType::BF16).unwrap();
    std::fs::write(&path, t.encode()).unwrap();
    let json = stdout_json(&inspect(&path));
    assert_eq!(json["kind"], "tensor");
    assert_eq!(json["tensor"]["dtype"], "BF16");
    assert_eq!(json["tensor"]["extent_bytes"], 64);
    assert_eq!(json["tensor"]["contiguous"], true);
    assert_eq!(json["tensor"]["buffer"]["nbytes"], 4096);
}

/// Padding is alignment slack (docs/wire-format.md §1): a blob written by a producer that
/// leaves garbage in every pad (as simpler may) is accepted and printed
/// exactly as the clean blob is, canonical identity hex included.
#[test]
fn inspect_ignores_dirty_padding() {
    let dir = tempfile::tempdir().unwrap();
    let a = Tensor::new(test_buffer(4096), 16, &[4, 8], &[8, 1], DType::BF16).unwrap();
    let b = Tensor::new(test_buffer(8192), 0, &[16], &[2], DType::F32).unwrap();
    let clean = TaskArgs::new(vec![a, b], vec![9]).unwrap().encode();
    let mut dirty = clean.clone();
    for i in 0..2 {
        let at = 8 + 144 * i;
        for pad in [5..8, 28..40, 54..56, 141..144] {
            dirty[at + pad.start..at + pad.end].fill(0xff);
        }
    }
    assert_ne!(dirty, clean);
    let clean_path = dir.path().join("clean.args");
    let dirty_path = dir.path().join("dirty.args");
    std::fs::write(&clean_path, &clean).unwrap();
    std::fs::write(&dirty_path, &dirty).unwrap();
    let want = inspect(&clean_path);
    let got = inspect(&dirty_path);
    assert_eq!(
        got.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        String::from_utf8_lossy(&want.stdout)
    );
    let json = stdout_json(&got);
    assert_eq!(json["tensor_count"], 2);
    let hex = json["tensors"][1]["buffer"]["identity"]["hex"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(hex.ends_with(&"00".repeat(12)), "canonical pad: {hex}");
}

#[test]
fn inspect_rejects_invalid_bytes_with_status_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tensor::new(test_buffer(4096), 0, &[4], &[1], DType::U8).unwrap();
    let mut blob = TaskArgs::new(vec![t, t], vec![]).unwrap().encode();
    blob[8 + 144] = 0; // tensors[1].buffer.magic
    let path = dir.path().join("bad.args");
    std::fs::write(&path, &blob).unwrap();
    let out = inspect(&path);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tensors[1].buffer.magic"), "{err}");
    assert!(out.stdout.is_empty());

    let mut tensor = t.encode();
    tensor[96] = 6; // ndims
    std::fs::write(&path, tensor).unwrap();
    let out = inspect(&path);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid ndims = 6"));

    std::fs::write(&path, [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
    let out = inspect(&path);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tensor_count = -1"));

    std::fs::write(&path, []).unwrap();
    let out = inspect(&path);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated"));
}

#[test]
fn inspect_of_a_missing_file_is_an_io_error() {
    let out = strata(&["inspect", "/nonexistent/strata/file"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/strata/file"));
}

#[test]
fn version_and_help() {
    let out = strata(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("strata {}", env!("CARGO_PKG_VERSION"))
    );
    let out = strata(&["inspect", "--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Examples:"));
    let out = strata(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn demo_runs_end_to_end_and_checks_its_results() {
    let out = strata(&["demo", "--workers", "2", "--size", "128", "--tile", "32"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("strata demo: 2 workers"), "{stdout}");
    let tasks = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("tasks"))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default();
    assert_eq!(
        tasks, "76",
        "(128/32)^3 matmul tasks and 3 per block: {stdout}"
    );
    assert!(stdout.contains("result check: passed"), "{stdout}");
}

#[test]
fn demo_refuses_a_tile_that_does_not_divide_the_size() {
    let out = strata(&["demo", "--size", "100", "--tile", "64"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not divide"));
}

#[test]
fn demo_in_process_runs_the_job_without_worker_processes() {
    let out = strata(&[
        "demo",
        "--in-process",
        "--workers",
        "2",
        "--size",
        "128",
        "--tile",
        "32",
        "--quiet",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("result check: passed"), "{stdout}");
}

#[test]
fn demo_in_process_refuses_worker_addresses() {
    let out = strata(&["demo", "--in-process", "--workers", "unix:/nope.sock"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--in-process"), "{stderr}");
}

#[test]
fn run_in_process_runs_a_graph_file_and_checks_its_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let graph = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/graphs/tiled_matmul.json");
    let out = strata(&[
        "run",
        "--in-process",
        "--local",
        "2",
        "--quiet",
        "--out-dir",
        dir.path().to_str().unwrap(),
        graph.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("out/tiled_matmul_c.npy").is_file());
}
