#![allow(missing_docs)] // criterion_group! generates undocumented items

//! Worker round trips over the Unix socket, against a real worker process
//! (`strata-test-worker`, the built-in kernels plus test kernels):
//!
//! - `unary_ping`: one unary tonic call (the floor for any RPC);
//! - `noop_task_round_trip`: one `noop` task sent on the session's task
//!   stream and its completion received;
//! - `noop_throughput_1000_in_flight`: 1,000 `noop` tasks sent (10 batches
//!   of 100) before any completion is read, then all completions; reported
//!   as tasks per second.
//!
//! `cargo bench -p strata-tests --bench worker`

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use strata_client::WorkerClient;
use strata_proto::TaskId;
use strata_proto::convert::TaskRequest;
use strata_tests::WorkerProcess;
use strata_wire::TaskArgs;

fn bench(c: &mut Criterion) {
    let worker = WorkerProcess::spawn_unix(
        Path::new(env!("CARGO_BIN_EXE_strata-test-worker")),
        &[],
        &["--device", "sim:mem=64MiB,lanes=2"],
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (mut client, mut stream, noop) = rt.block_on(async {
        let mut client = WorkerClient::connect(&worker.endpoint, None).await.unwrap();
        let hs = client.handshake().await.unwrap();
        let noop = hs.callable("noop", 1).unwrap();
        let stream = client.open_tasks().await.unwrap();
        (client, stream, noop)
    });
    let mut next_id = 0u64;
    let mut tasks = |n: usize| -> Vec<TaskRequest> {
        (0..n)
            .map(|_| {
                next_id += 1;
                TaskRequest {
                    id: TaskId(next_id),
                    callable: noop,
                    args: TaskArgs::new(vec![], vec![]).unwrap(),
                    tags: vec![],
                    inline: vec![],
                    staged: Vec::new(),
                    cache: Vec::new(),
                    required_features: strata_proto::convert::Features::NONE,
                    priority: 0,
                }
            })
            .collect()
    };

    let mut group = c.benchmark_group("worker_unix");
    group.bench_function("unary_ping", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    client.ping(Vec::new()).await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("noop_task_round_trip", |b| {
        b.iter_custom(|iters| {
            let batches: Vec<Vec<TaskRequest>> = (0..iters).map(|_| tasks(1)).collect();
            rt.block_on(async {
                let start = Instant::now();
                for batch in &batches {
                    stream.send(batch).await.unwrap();
                    let mut got = 0;
                    while got < 1 {
                        got += stream.next().await.unwrap().unwrap().len();
                    }
                }
                start.elapsed()
            })
        })
    });
    group.throughput(Throughput::Elements(1000));
    group.bench_function("noop_throughput_1000_in_flight", |b| {
        b.iter_custom(|iters| {
            let rounds: Vec<Vec<TaskRequest>> = (0..iters).map(|_| tasks(1000)).collect();
            rt.block_on(async {
                let start = Instant::now();
                for round in &rounds {
                    for chunk in round.chunks(100) {
                        stream.send(chunk).await.unwrap();
                    }
                    let mut got = 0;
                    while got < 1000 {
                        got += stream.next().await.unwrap().unwrap().len();
                    }
                }
                start.elapsed()
            })
        })
    });
    group.finish();
    drop(worker);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
