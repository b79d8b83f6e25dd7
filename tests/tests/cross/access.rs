//! An alias only narrows access (docs/wire-format.md §3), across the process boundary:
//! a worker serves a task through a descriptor narrower than the import and
//! refuses a wider one, and the driver API derives narrower views only.

use std::path::Path;

use strata_orchestrator::{Cluster, Task};
use strata_proto::convert::{FailureKind, TaskOutcome};
use strata_tests::{SharedBuffer, WorkerProcess, strata_bin};
use strata_wire::{Access, ArgTag, DType, Tensor};

use crate::worker::{assert_failed, f32s, mint, run_all, session, task};

/// One worker, two buffers: `a` imported READWRITE, `b` imported READ.
/// Tasks read `a` through READ-narrowed descriptors (the first use of `a`
/// is such a read, and the worker still maps it as imported) while writing
/// `a` through its full descriptor; a task that writes through a READ
/// descriptor of `a`, and one that names `b` READWRITE (wider than its
/// import), are refused with the reason, and the worker keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_may_narrow_an_import_and_is_refused_a_wider_one() {
    let w = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,lanes=2"],
    );
    let (mut client, hs) = session(&w).await;
    let add = hs.callable("add", 1).unwrap();
    let fill = hs.callable("fill", 1).unwrap();
    let copy = hs.callable("copy", 1).unwrap();
    let mint = mint();
    let mut a = SharedBuffer::new(&mint, 64 * 4, Access::ReadWrite);
    let values: Vec<u8> = (0..64).flat_map(|i| (i as f32).to_le_bytes()).collect();
    a.write(0, &values);
    let b_rw = SharedBuffer::new(&mint, 16 * 4, Access::ReadWrite);
    let b_ro = b_rw.descriptor().narrowed(Access::Read).unwrap();
    let a_rw = a.descriptor();
    let a_ro = a_rw.narrowed(Access::Read).unwrap();

    let mut fds = client.fd_channel().await.unwrap();
    let acks = fds
        .import_as(&[a_rw, b_ro], &[a.fd(), b_rw.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(()), Ok(())]);

    let view = |d, offset: u64| Tensor::new(d, offset * 4, &[16], &[1], DType::F32).unwrap();
    let mut stream = client.open_tasks().await.unwrap();
    // out[48..64] = a[0..16] + a[16..32], both read through READ views
    // (argument 0 is the first use of `a` on this worker).
    let done = run_all(
        &mut stream,
        &[task(
            1,
            add,
            vec![view(a_ro, 0), view(a_ro, 16), view(a_rw, 48)],
            vec![ArgTag::Input, ArgTag::Input, ArgTag::Output],
            vec![],
        )],
    )
    .await;
    assert_eq!(done[&1].outcome, TaskOutcome::Success, "{}", w.log());
    let out = f32s(&a.read(48 * 4, 16 * 4));
    let want: Vec<f32> = (0..16).map(|i| (i + 16 + i) as f32).collect();
    assert_eq!(out, want);

    // Writing through a READ descriptor of `a` is refused; `a` is unchanged.
    let done = run_all(
        &mut stream,
        &[task(
            2,
            fill,
            vec![view(a_ro, 0)],
            vec![ArgTag::Output],
            vec![9f64.to_bits()],
        )],
    )
    .await;
    assert_failed(&done[&2], FailureKind::ImportRefused, "grants READ");
    assert_eq!(a.read(0, 16 * 4), values[..16 * 4]);

    // `b` was imported READ: a READWRITE descriptor of it is wider.
    let done = run_all(
        &mut stream,
        &[task(
            3,
            fill,
            vec![view(b_rw.descriptor(), 0)],
            vec![ArgTag::Output],
            vec![9f64.to_bits()],
        )],
    )
    .await;
    assert_failed(
        &done[&3],
        FailureKind::ImportRefused,
        "the task's descriptor grants READWRITE but the buffer was imported with READ",
    );
    assert_eq!(b_rw.read(0, 16 * 4), vec![0u8; 16 * 4]);

    // The worker keeps serving, and `b` still serves readers: a[0..16] = b.
    let done = run_all(
        &mut stream,
        &[task(
            4,
            copy,
            vec![view(b_ro, 0), view(a_rw, 0)],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        )],
    )
    .await;
    assert_eq!(done[&4].outcome, TaskOutcome::Success, "{}", w.log());
    assert_eq!(f32s(&a.read(0, 16 * 4)), vec![0.0; 16]);
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.imports, 2);
}

fn local_cluster() -> Cluster {
    Cluster::builder()
        .local(1)
        .worker_binary(Path::new(&strata_bin()))
        .start()
        .expect("cluster")
}

/// The driver API: `View::read_only` / `View::with_access` narrow and never
/// widen; a task that writes through a read-only view is refused at submit;
/// a read through it works even as the buffer's first use on the worker,
/// and a later write through the full view then works too.
#[test]
fn a_read_only_view_reads_and_cannot_be_written_or_widened() {
    let cluster = local_cluster();
    let src = cluster.buffer(64 * 4).unwrap();
    let dst = cluster.buffer(64 * 4).unwrap();
    let full = src.tensor(&[64], DType::F32).unwrap();
    full.write(&(0..64).map(|i| i as f32).collect::<Vec<_>>())
        .unwrap();
    let ro = full.read_only().unwrap();
    assert_eq!(
        (full.access(), ro.access()),
        (Access::ReadWrite, Access::Read)
    );
    assert_eq!(ro.tensor().identity(), full.tensor().identity());

    let e = ro.with_access(Access::ReadWrite).unwrap_err().to_string();
    assert!(
        e.contains("access READWRITE is wider than the granted READ"),
        "{e}"
    );
    assert!(ro.with_access(Access::Write).is_err());
    let wo = full.with_access(Access::Write).unwrap();
    assert!(wo.read_only().is_err(), "READ is not within WRITE");
    // A reshaped read-only view stays read-only.
    let half = ro.reshape(0, &[32], &[2], DType::F32).unwrap();
    assert_eq!(half.access(), Access::Read);

    let e = cluster
        .submit(Task::new("fill").output(&ro).scalar_f64(7.0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tagged OUTPUT but the buffer grants READ"),
        "{e}"
    );
    let e = cluster
        .submit(Task::new("fill").output(&half).scalar_f64(7.0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("grants READ"), "{e}");

    // First use of `src` on the worker is through the read-only view.
    let out = dst.tensor(&[64], DType::F32).unwrap();
    let t = cluster
        .submit(Task::new("copy").input(&ro).output(&out))
        .unwrap();
    cluster.wait(t).unwrap();
    assert_eq!(
        out.read::<f32>().unwrap(),
        (0..64).map(|i| i as f32).collect::<Vec<_>>()
    );
    // The worker imported `src` as the buffer grants, so the full view
    // still writes it.
    let t = cluster
        .submit(Task::new("fill").output(&full).scalar_f64(2.5))
        .unwrap();
    cluster.wait(t).unwrap();
    assert!(full.read::<f32>().unwrap().iter().all(|&x| x == 2.5));
    cluster.shutdown().unwrap();
}
