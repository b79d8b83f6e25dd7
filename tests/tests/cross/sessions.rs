//! Imports and device buffers belong to the session that made them (issue
//! 29 §3), through the real `strata worker`: session A imports a memfd
//! and allocates a device buffer and writes a secret into both; session B,
//! a second client of the same worker, names them with A's own
//! descriptors, byte for byte, in tasks (on its task stream and on its
//! ring) and in device calls, and releases A's import by identity. Every
//! attempt is refused naming the buffer, no byte of A's reaches B, and A
//! goes on as before.
//!
//! A worker listens on one endpoint, so a TCP session and a Unix session
//! never share one: over TCP (where host bytes travel inline and nothing
//! is imported) the check is the device buffer, and a host descriptor
//! without inline bytes.

use std::collections::HashMap;

use strata_client::{TaskStream, WorkerClient};
use strata_proto::convert::{FailureKind, TaskCompletion, TaskOutcome, TaskRequest};
use strata_tests::{SharedBuffer, WorkerProcess, strata_bin};
use strata_wire::{Access, ArgTag, CanonicalIdentity, DType, Tensor};

use crate::ring::{SMALL, attach, run_on_ring};
use crate::worker::{assert_failed, device_view, f32s, mint, run_all, session, task};

/// The byte A writes everywhere: B must never see it.
const SECRET: u8 = 0xA5;
/// Bytes of each buffer (1,024 F32).
const NBYTES: u64 = 4096;
const ELEMS: u32 = 1024;

fn host_view(buf: &SharedBuffer) -> Tensor {
    Tensor::new(buf.descriptor(), 0, &[ELEMS], &[1], DType::F32).unwrap()
}

fn not_imported(id: &CanonicalIdentity) -> String {
    format!("buffer {id} was not imported by this session")
}

fn not_allocated(id: &CanonicalIdentity) -> String {
    format!("device buffer {id} was not allocated by this session")
}

fn succeeded(done: &HashMap<u64, TaskCompletion>) {
    for (id, c) in done {
        assert_eq!(c.outcome, TaskOutcome::Success, "task {id}");
    }
}

/// B's device calls on A's device buffer `dev`: a read, a write and a
/// free, each refused naming the buffer.
async fn device_calls_refused(b: &mut WorkerClient, dev: &CanonicalIdentity) {
    let refusals = [
        b.copy_from_device(dev, 0, NBYTES).await.map(|_| ()),
        b.copy_to_device(dev, 0, vec![0; 16]).await,
        b.device_free(dev).await,
    ];
    for (call, r) in ["copy_from_device", "copy_to_device", "device_free"]
        .iter()
        .zip(refusals)
    {
        let e = r.expect_err(&format!("{call} of another session's device buffer"));
        assert!(e.to_string().contains(&not_allocated(dev)), "{call}: {e}");
    }
}

/// Tasks of B naming A's device buffer (`dev` at `addr`): read into B's
/// own `dst`, and overwritten; each fails naming the buffer.
fn device_tasks(
    hs: &strata_client::Handshake,
    first_id: u64,
    dev: CanonicalIdentity,
    addr: u64,
    dst: Tensor,
) -> Vec<TaskRequest> {
    let copy = hs.callable("copy", 1).unwrap();
    let fill = hs.callable("fill", 1).unwrap();
    vec![
        task(
            first_id,
            copy,
            vec![device_view(dev, addr, ELEMS), dst],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        ),
        task(
            first_id + 1,
            fill,
            vec![device_view(dev, addr, ELEMS)],
            vec![ArgTag::Output],
            vec![1.0f64.to_bits()],
        ),
    ]
}

/// Over a Unix socket, with the fd channel and the ring.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_cannot_name_another_sessions_imports_or_device_buffers_over_unix() {
    let w = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,lanes=2"],
    );
    let mint = mint();
    let region = strata_chip_runtime::Region::Persistent;

    // Session A: a memfd and a device buffer, both holding the secret, and
    // a task that uses both (so the import is mapped when B tries).
    let (mut a, hs) = session(&w).await;
    let mut a_tasks = a.open_tasks().await.unwrap();
    let mut a_fds = a.fd_channel().await.unwrap();
    let mut a_buf = SharedBuffer::new(&mint, NBYTES, Access::ReadWrite);
    a_buf.write(0, &[SECRET; NBYTES as usize]);
    let a_id = *a_buf.descriptor().identity();
    let acks = a_fds
        .import_as(&[a_buf.descriptor()], &[a_buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())]);
    let dev = mint.mint().unwrap();
    let addr = a.device_alloc(&dev, NBYTES, region).await.unwrap();
    a.copy_to_device(&dev, 0, vec![SECRET; NBYTES as usize])
        .await
        .unwrap();
    let copy = hs.callable("copy", 1).unwrap();
    let fill = hs.callable("fill", 1).unwrap();
    let done = run_all(
        &mut a_tasks,
        &[task(
            1,
            copy,
            vec![device_view(dev, addr, ELEMS), host_view(&a_buf)],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        )],
    )
    .await;
    succeeded(&done);

    // Session B: its own buffer, zeroed, to copy into.
    let (mut b, _) = session(&w).await;
    let mut b_tasks = b.open_tasks().await.unwrap();
    let mut b_fds = b.fd_channel().await.unwrap();
    let b_buf = SharedBuffer::new(&mint, NBYTES, Access::ReadWrite);
    let acks = b_fds
        .import_as(&[b_buf.descriptor()], &[b_buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())]);

    // B's tasks name A's import by A's descriptor (read, written, and
    // read-only narrowed) and A's device buffer: each fails naming it.
    let a_read = Tensor::new(
        a_buf.descriptor().narrowed(Access::Read).unwrap(),
        0,
        &[ELEMS],
        &[1],
        DType::F32,
    )
    .unwrap();
    let mut batch = vec![
        task(
            1,
            copy,
            vec![host_view(&a_buf), host_view(&b_buf)],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        ),
        task(
            2,
            copy,
            vec![a_read, host_view(&b_buf)],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        ),
        task(
            3,
            fill,
            vec![host_view(&a_buf)],
            vec![ArgTag::Output],
            vec![2.0f64.to_bits()],
        ),
        task(
            4,
            copy,
            vec![host_view(&b_buf), host_view(&a_buf)],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        ),
    ];
    batch.extend(device_tasks(&hs, 5, dev, addr, host_view(&b_buf)));
    let done = run_all(&mut b_tasks, &batch).await;
    for id in 1..=3 {
        assert_failed(
            &done[&id],
            FailureKind::ImportRefused,
            &format!("argument 0: {}", not_imported(&a_id)),
        );
    }
    assert_failed(
        &done[&4],
        FailureKind::ImportRefused,
        &format!("argument 1: {}", not_imported(&a_id)),
    );
    for id in 5..=6 {
        assert_failed(
            &done[&id],
            FailureKind::ImportRefused,
            &format!("argument 0: {}", not_allocated(&dev)),
        );
    }
    device_calls_refused(&mut b, &dev).await;
    assert_eq!(
        b.release_imports(&[a_id]).await.unwrap(),
        0,
        "B releases nothing of A's"
    );

    // The same on B's ring.
    let mem = attach(&mut b_fds, SMALL).await;
    let mut on_ring = vec![task(
        11,
        copy,
        vec![host_view(&a_buf), host_view(&b_buf)],
        vec![ArgTag::Input, ArgTag::Output],
        vec![],
    )];
    on_ring.extend(device_tasks(&hs, 12, dev, addr, host_view(&b_buf)));
    let done = run_on_ring(&mem, on_ring, 3).await;
    assert_failed(
        &done[&11],
        FailureKind::ImportRefused,
        &format!("argument 0: {}", not_imported(&a_id)),
    );
    for id in 12..=13 {
        assert_failed(
            &done[&id],
            FailureKind::ImportRefused,
            &format!("argument 0: {}", not_allocated(&dev)),
        );
    }
    assert_eq!(
        b_buf.read(0, NBYTES as usize),
        vec![0; NBYTES as usize],
        "no byte of A's reached B's buffer"
    );

    // An identity is a name within a session: B may allocate one A uses,
    // and gets its own block, which its writes do not carry into A's.
    let b_addr = b.device_alloc(&dev, NBYTES, region).await.unwrap();
    assert_ne!(b_addr, addr);
    b.copy_to_device(&dev, 0, vec![0x5B; NBYTES as usize])
        .await
        .unwrap();

    // Handing over the fd is how a session gives another its buffer: B
    // imports A's memfd itself, uses it, and releases it, which leaves
    // A's import of it as it was.
    let acks = b_fds
        .import_as(&[a_buf.descriptor()], &[a_buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())], "B's own import of the same identity");
    let done = run_on_ring(
        &mem,
        vec![task(
            21,
            copy,
            vec![host_view(&a_buf), host_view(&b_buf)],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        )],
        1,
    )
    .await;
    succeeded(&done);
    assert_eq!(b_buf.read(0, 8), vec![SECRET; 8], "given, so readable");
    assert_eq!(b.release_imports(&[a_id]).await.unwrap(), 1);

    // A goes on as before: its device buffer holds the secret (not B's
    // bytes), its import takes a task, it releases and frees its own.
    assert_eq!(
        a.copy_from_device(&dev, 0, NBYTES).await.unwrap(),
        vec![SECRET; NBYTES as usize]
    );
    let done = run_all(
        &mut a_tasks,
        &[task(
            2,
            fill,
            vec![host_view(&a_buf)],
            vec![ArgTag::Output],
            vec![7.0f64.to_bits()],
        )],
    )
    .await;
    succeeded(&done);
    assert_eq!(f32s(&a_buf.read(0, NBYTES as usize)), vec![7.0; 1024]);
    assert_eq!(a.release_imports(&[a_id]).await.unwrap(), 1);
    a.device_free(&dev).await.unwrap();
    assert_eq!(
        b.copy_from_device(&dev, 0, 4).await.unwrap(),
        vec![0x5B; 4],
        "A's free left B's buffer of the same identity"
    );
}

/// Over TCP with a token: device buffers, and a host descriptor with no
/// inline bytes (nothing is imported over TCP).
#[tokio::test(flavor = "multi_thread")]
async fn a_session_cannot_name_another_sessions_device_buffers_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "sessions").unwrap();
    let w = WorkerProcess::spawn_tcp(
        &strata_bin(),
        &["worker"],
        &[
            "--device",
            "sim:mem=64MiB,lanes=2",
            "--token-file",
            token.to_str().unwrap(),
        ],
    );
    let connect = || async {
        let mut c = WorkerClient::connect(&w.endpoint, Some("sessions"))
            .await
            .unwrap();
        let hs = c.handshake().await.unwrap();
        let tasks: TaskStream = c.open_tasks().await.unwrap();
        (c, hs, tasks)
    };
    let mint = mint();
    let region = strata_chip_runtime::Region::Persistent;

    // A: the secret in a device buffer, copied by a task into a second.
    let (mut a, hs, mut a_tasks) = connect().await;
    let (dev, dev2) = (mint.mint().unwrap(), mint.mint().unwrap());
    let addr = a.device_alloc(&dev, NBYTES, region).await.unwrap();
    let addr2 = a.device_alloc(&dev2, NBYTES, region).await.unwrap();
    a.copy_to_device(&dev, 0, vec![SECRET; NBYTES as usize])
        .await
        .unwrap();
    let copy = hs.callable("copy", 1).unwrap();
    let a_copy = |id| {
        task(
            id,
            copy,
            vec![
                device_view(dev, addr, ELEMS),
                device_view(dev2, addr2, ELEMS),
            ],
            vec![ArgTag::Input, ArgTag::Output],
            vec![],
        )
    };
    succeeded(&run_all(&mut a_tasks, &[a_copy(1)]).await);

    // B: its own device buffer to copy into; tasks and calls naming A's
    // are refused, and so is a host buffer it never sent bytes for.
    let (mut b, _, mut b_tasks) = connect().await;
    let b_dev = mint.mint().unwrap();
    let b_addr = b.device_alloc(&b_dev, NBYTES, region).await.unwrap();
    b.copy_to_device(&b_dev, 0, vec![0; NBYTES as usize])
        .await
        .unwrap();
    let never_sent = SharedBuffer::new(&mint, NBYTES, Access::ReadWrite);
    let mut batch = device_tasks(&hs, 1, dev, addr, device_view(b_dev, b_addr, ELEMS));
    batch.push(task(
        3,
        copy,
        vec![host_view(&never_sent), device_view(b_dev, b_addr, ELEMS)],
        vec![ArgTag::Input, ArgTag::Output],
        vec![],
    ));
    let done = run_all(&mut b_tasks, &batch).await;
    for id in 1..=2 {
        assert_failed(
            &done[&id],
            FailureKind::ImportRefused,
            &format!("argument 0: {}", not_allocated(&dev)),
        );
    }
    // Over TCP a host buffer without its bytes is a kind the session
    // does not take (no fd reaches it), whoever imported what elsewhere.
    assert_failed(
        &done[&3],
        FailureKind::Unsupported,
        "argument 0: this worker does not take MEMFD buffers in this session (it takes DEVICE_MALLOC; a HOST buffer's bytes may travel with its task instead)",
    );
    device_calls_refused(&mut b, &dev).await;
    assert_eq!(
        b.copy_from_device(&b_dev, 0, NBYTES).await.unwrap(),
        vec![0; NBYTES as usize],
        "no byte of A's reached B's buffer"
    );

    // A goes on as before.
    succeeded(&run_all(&mut a_tasks, &[a_copy(2)]).await);
    for id in [&dev, &dev2] {
        assert_eq!(
            a.copy_from_device(id, 0, NBYTES).await.unwrap(),
            vec![SECRET; NBYTES as usize]
        );
    }
    a.device_free(&dev).await.unwrap();
    a.device_free(&dev2).await.unwrap();
}
