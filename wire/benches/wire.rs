#![allow(missing_docs)] // criterion_group! generates undocumented items

//! Benchmarks of the wire format: `overlap` per view class (one pair per
//! iteration, cycling through 1,024 pre-drawn pairs), the same with
//! precomputed footprints, and decode/validate of a 256-tensor blob.
//!
//! `cargo bench -p strata-wire --bench wire`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use strata_wire::check::{Rng, ViewClass, view_pair};
use strata_wire::{DType, Footprint, TaskArgs, Tensor, overlap};

const PAIRS: usize = 1024;

fn bench_overlap(c: &mut Criterion) {
    let mut group = c.benchmark_group("overlap");
    for class in ViewClass::ALL {
        let mut rng = Rng(42 + class as u64);
        let pairs: Vec<(Tensor, Tensor)> = (0..PAIRS).map(|_| view_pair(class, &mut rng)).collect();
        let mut i = 0;
        group.bench_function(format!("{class:?}"), |b| {
            b.iter(|| {
                i = (i + 1) % PAIRS;
                let (x, y) = &pairs[i];
                overlap(black_box(x), black_box(y))
            })
        });
        let prints: Vec<(Footprint, Footprint)> = pairs
            .iter()
            .map(|(x, y)| (Footprint::of(x), Footprint::of(y)))
            .collect();
        let mut i = 0;
        group.bench_function(format!("{class:?}/footprints"), |b| {
            b.iter(|| {
                i = (i + 1) % PAIRS;
                let (x, y) = &prints[i];
                black_box(x).overlap(black_box(y))
            })
        });
    }
    group.finish();
}

fn bench_blob(c: &mut Criterion) {
    let buf = strata_wire::check::test_buffer(1 << 30);
    let tensors: Vec<Tensor> = (0..256u64)
        .map(|i| Tensor::new(buf, i * 4096, &[16, 64], &[128, 1], DType::F32).unwrap())
        .collect();
    let blob = TaskArgs::new(tensors, (0..128).collect()).unwrap().encode();
    let mut group = c.benchmark_group("task_args_256");
    group.bench_function("decode", |b| {
        b.iter(|| TaskArgs::decode(black_box(&blob)).unwrap())
    });
    group.bench_function("validate", |b| {
        b.iter(|| TaskArgs::validate(black_box(&blob)).unwrap())
    });
    let args = TaskArgs::decode(&blob).unwrap();
    group.bench_function("encode", |b| b.iter(|| black_box(&args).encode()));
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench_overlap, bench_blob
}
criterion_main!(benches);
