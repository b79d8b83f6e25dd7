//! No byte of one session reaches another on a shared worker: session A
//! writes a secret through device scratch, device buffers and the run
//! region and ends; session B then allocates, stages and runs partial
//! writers on the same workers, and no buffer B can read holds a byte of
//! the secret.

use crate::faults::test_worker_bin;
use std::time::{Duration, Instant};

use strata_orchestrator::{Buffer, Cluster, Task, WorkerId};
use strata_tests::WorkerProcess;
use strata_wire::DType;

/// The secret: a word no random buffer of these sizes holds by chance.
const SECRET: u64 = 0x5EC2_E7A5_5EC2_E7A5;

/// Where in `bytes` four consecutive bytes of the secret (at any phase)
/// appear, if anywhere.
fn find_secret(bytes: &[u8]) -> Option<usize> {
    let word = SECRET.to_le_bytes();
    let phases: Vec<[u8; 4]> = (0..4)
        .map(|p| [word[p], word[p + 1], word[p + 2], word[p + 3]])
        .collect();
    bytes.windows(4).position(|w| phases.iter().any(|p| p == w))
}

fn connect_all(workers: &[WorkerProcess]) -> Cluster {
    let mut b = Cluster::builder().window(4);
    for (i, w) in workers.iter().enumerate() {
        let token = (i == 2).then_some("leaks");
        b = b.connect(&w.endpoint.to_string(), token).unwrap();
    }
    b.start().unwrap()
}

/// Session A's work on worker `w`: the secret in a staged input and a
/// staged output (scratch), a kernel's scratch, a persistent device
/// buffer (written by the client and by a kernel) and a run block.
fn write_secret(a: &Cluster, w: WorkerId) {
    let n = 64 * 1024u32;
    let secret_host = a.buffer(u64::from(n) * 8).unwrap();
    secret_host
        .write_slice(0, &vec![SECRET; n as usize])
        .unwrap();
    let src = secret_host.tensor(&[n], DType::U64).unwrap();
    let out = a.buffer(u64::from(n) * 8).unwrap();
    let dst = out.tensor(&[n], DType::U64).unwrap();
    a.submit(Task::new("copy").input(&src).output(&dst).on(w))
        .unwrap();
    a.submit(
        Task::new("test.scratch")
            .scalar_u64(1 << 20)
            .scalar_u64(SECRET)
            .scalar_u64(0)
            .on(w),
    )
    .unwrap();
    for nbytes in [4096u64, 1 << 20, 3 << 20] {
        let d = a.device_buffer(w, nbytes).unwrap();
        a.write_device(&d, 0, &SECRET.to_le_bytes().repeat(nbytes as usize / 8))
            .unwrap();
        let d2 = a.device_buffer(w, nbytes).unwrap();
        let view = d2.tensor(&[(nbytes / 8) as u32], DType::U64).unwrap();
        a.submit(Task::new("fill").output(&view).scalar_u64(SECRET))
            .unwrap();
        let r = a.run_buffer(w, nbytes).unwrap();
        let view = r.tensor(&[(nbytes / 8) as u32], DType::U64).unwrap();
        a.submit(Task::new("fill").output(&view).scalar_u64(SECRET))
            .unwrap();
    }
    a.wait_all().unwrap();
}

/// Session B's work on worker `w`, checking everything it can read.
fn look_for_secret(b: &Cluster, w: WorkerId) {
    let name = &format!("{} ({})", w, b.workers()[w.0 as usize].device);
    // New device buffers read as zeros.
    let mut device: Vec<Buffer> = Vec::new();
    for nbytes in [64u64, 4096, 1 << 20, 3 << 20] {
        device.push(b.device_buffer(w, nbytes).unwrap());
        device.push(b.run_buffer(w, nbytes).unwrap());
    }
    for d in &device {
        let bytes = b.read_device(d, 0, d.nbytes()).unwrap();
        assert!(
            bytes.iter().all(|&x| x == 0),
            "{name}: a new device buffer of {} bytes is not zeroed (secret at {:?})",
            d.nbytes(),
            find_secret(&bytes)
        );
    }
    // A kernel's scratch reads as zeros (the kernel fails otherwise).
    b.submit(
        Task::new("test.scratch")
            .scalar_u64(1 << 20)
            .scalar_u64(0)
            .scalar_u64(1)
            .on(w),
    )
    .unwrap();
    // Partial writers on staged views: an OUTPUT that writes some elements
    // (the rest comes back zero or as B's own bytes), an OUTPUT_EXISTING
    // and an INOUT that keep the rest, a strided OUTPUT.
    let n = 64 * 1024u32;
    let mut host: Vec<Buffer> = Vec::new();
    for (i, (callable, tag)) in [
        ("test.partial.w", strata_wire::ArgTag::Output),
        ("test.partial.w", strata_wire::ArgTag::OutputExisting),
        ("test.partial.x", strata_wire::ArgTag::InOut),
    ]
    .into_iter()
    .enumerate()
    {
        let h = b.buffer(u64::from(n) * 8).unwrap();
        let own: Vec<u64> = (0..u64::from(n))
            .map(|k| k * 0x0101_0101 + i as u64)
            .collect();
        h.write_slice(0, &own).unwrap();
        let view = h.tensor(&[n], DType::U64).unwrap();
        b.submit(
            Task::new(callable)
                .arg(&view, tag)
                .scalar_u64(u64::from(w.0))
                .scalar_u64(i as u64)
                .scalar_u64(1)
                .on(w),
        )
        .unwrap();
        host.push(h);
    }
    let h = b.buffer(u64::from(n) * 8).unwrap();
    let strided = h.view(8, &[n / 4], &[3], DType::U64).unwrap();
    b.submit(
        Task::new("test.partial.w")
            .output(&strided)
            .scalar_u64(7)
            .scalar_u64(7)
            .scalar_u64(1)
            .on(w),
    )
    .unwrap();
    host.push(h);
    b.wait_all()
        .unwrap_or_else(|e| panic!("{name}: session B's tasks: {e}"));
    for h in &host {
        let bytes = h.to_bytes().unwrap();
        assert_eq!(
            find_secret(&bytes),
            None,
            "{name}: session A's secret in one of B's host buffers"
        );
    }
    // The run blocks ended with the wait; the persistent ones are still B's.
    for d in device.iter().step_by(2) {
        let bytes = b.read_device(d, 0, d.nbytes()).unwrap();
        assert_eq!(
            find_secret(&bytes),
            None,
            "{name}: secret in a device buffer"
        );
    }
}

#[test]
fn no_byte_of_an_ended_session_reaches_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "leaks").unwrap();
    let token = token.to_str().unwrap();
    // A staged chip on the ring, a unified chip, a staged chip over TCP
    // (host bytes travel; device buffers and scratch are the worker's).
    let workers = [
        WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--device", "sim:mode=staged"]),
        WorkerProcess::spawn_unix(test_worker_bin(), &[], &["--device", "sim:mode=unified"]),
        WorkerProcess::spawn_tcp(
            test_worker_bin(),
            &[],
            &["--token-file", token, "--device", "sim:mode=staged"],
        ),
    ];
    let a = connect_all(&workers);
    let ids: Vec<WorkerId> = a.workers().iter().map(|w| w.id).collect();
    for &w in &ids {
        write_secret(&a, w);
    }
    drop(a);
    let b = connect_all(&workers);
    // A's sessions end on the workers (their device buffers freed, the run
    // region reset) once the workers see them go.
    let deadline = Instant::now() + Duration::from_secs(10);
    for &w in &ids {
        while b.worker_stats(w).unwrap().sessions > 1 {
            assert!(Instant::now() < deadline, "session A never ended on {w}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for &w in &ids {
        look_for_secret(&b, w);
    }
}
