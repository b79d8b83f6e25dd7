//! Replays the committed fuzz corpus (`wire/fuzz/corpus/<target>/`) through
//! the same oracles the fuzz targets run, so that every input the fuzzer
//! ever kept is rechecked by an ordinary `cargo test`.

use std::path::Path;

use strata_wire::check::{
    check_descriptor_bytes, check_overlap_seed, check_task_args_bytes, check_tensor_bytes,
};

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()));
    let mut n = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        check(&bytes);
        n += 1;
    }
    assert!(n > 0, "corpus {} is empty", dir.display());
    n
}

#[test]
fn tensor_corpus() {
    replay("tensor", check_tensor_bytes);
}

#[test]
fn task_args_corpus() {
    replay("task_args", check_task_args_bytes);
}

#[test]
fn overlap_corpus() {
    replay("overlap", check_overlap_seed);
}

#[test]
fn descriptor_corpus() {
    replay("descriptor", check_descriptor_bytes);
}
