//! An imported fd cannot be pulled out from under a worker.
//!
//! A worker maps a MEMFD import shared; a backing shrunk under the mapping
//! would make each later access raise SIGBUS and kill the worker, with
//! every session it serves. So the worker refuses, when the fd arrives,
//! any fd that is not sealed against shrinking (unsealed memfds, and POSIX
//! shared-memory objects, which cannot be sealed) unless its descriptor
//! names it POSIX_SHM: such an object is imported by copy and never
//! mapped, so shrinking it can only fail the tasks that use it. These
//! tests shrink such fds for real while the same worker serves a second
//! session, and check that the second session's bytes are right before
//! and after and that the worker process is still running.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, ftruncate};
use strata_chip_runtime::KernelHandle;
use strata_client::{FdChannel, TaskStream, WorkerClient};
use strata_proto::TaskId;
use strata_proto::convert::{FailureKind, TaskCompletion, TaskOutcome, TaskRequest};
use strata_tests::{SharedBuffer, WorkerProcess, strata_bin};
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, DType, IdentityMint, ShmName,
    TaskArgs, Tensor,
};

/// Elements of session B's buffer, and how many tasks fill it.
const B_ELEMS: u64 = 64 * 1024;
const B_TASKS: u64 = 64;

fn mint() -> IdentityMint {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    IdentityMint::new((t as u64 ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes())
}

/// One session: a client that made its handshake, its fd channel and its
/// task stream, and the `fill` callable.
struct Session {
    _client: WorkerClient,
    fds: FdChannel,
    stream: TaskStream,
    fill: KernelHandle,
    /// `test.late_fill`, on a test worker.
    late_fill: Option<KernelHandle>,
}

async fn open_session(w: &WorkerProcess) -> Session {
    let mut client = WorkerClient::connect(&w.endpoint, None).await.unwrap();
    let hs = client.handshake().await.unwrap();
    let fill = hs.callable("fill", 1).expect("fill offered");
    let late_fill = hs.callable("test.late_fill", 1);
    let fds = client.fd_channel().await.unwrap();
    let stream = client.open_tasks().await.unwrap();
    Session {
        _client: client,
        fds,
        stream,
        fill,
        late_fill,
    }
}

fn fill_task(s: &Session, id: u64, view: Tensor, value: f64) -> TaskRequest {
    TaskRequest {
        id: TaskId(id),
        callable: s.fill,
        args: TaskArgs::new(vec![view], vec![value.to_bits()]).unwrap(),
        tags: vec![ArgTag::Output],
        inline: vec![None],
        staged: Vec::new(),
        cache: Vec::new(),
        required_features: strata_proto::convert::Features::NONE,
        priority: 0,
    }
}

async fn collect(stream: &mut TaskStream, n: usize) -> HashMap<u64, TaskCompletion> {
    let mut got = HashMap::new();
    while got.len() < n {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("completions in time")
            .expect("stream ok")
            .expect("stream open");
        for c in batch {
            assert!(got.insert(c.id.0, c).is_none(), "a task completed twice");
        }
    }
    got
}

/// Session B: a session on `w` with a sealed buffer of `B_ELEMS` F32,
/// imported and filled once (round 1, checked).
async fn session_b(w: &WorkerProcess, mint: &IdentityMint) -> (Session, SharedBuffer) {
    let mut b = open_session(w).await;
    let b_buf = SharedBuffer::new(mint, B_ELEMS * 4, Access::ReadWrite);
    let acks = b
        .fds
        .import(&[*b_buf.descriptor().identity()], &[b_buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())]);
    send_b(&b, &b_buf, 1).await;
    check_b(&mut b, &b_buf, 1).await;
    (b, b_buf)
}

/// Session B's work: `B_TASKS` fills, each of its own slice of `buf` with
/// `round + slice index`, sent in one batch. Returns once they are sent;
/// [`check_b`] collects and checks them.
async fn send_b(b: &Session, buf: &SharedBuffer, round: u64) {
    let per = B_ELEMS / B_TASKS;
    let tasks: Vec<TaskRequest> = (0..B_TASKS)
        .map(|i| {
            let view = Tensor::new(
                buf.descriptor(),
                i * per * 4,
                &[u32::try_from(per).unwrap()],
                &[1],
                DType::F32,
            )
            .unwrap();
            fill_task(b, round * 1000 + i, view, (round + i) as f64)
        })
        .collect();
    b.stream.send(&tasks).await.unwrap();
}

async fn check_b(b: &mut Session, buf: &SharedBuffer, round: u64) {
    let done = collect(&mut b.stream, B_TASKS as usize).await;
    for (id, c) in &done {
        assert_eq!(c.outcome, TaskOutcome::Success, "session B task {id}");
    }
    let per = usize::try_from(B_ELEMS / B_TASKS).unwrap();
    let bytes = buf.read(0, usize::try_from(B_ELEMS * 4).unwrap());
    for (k, v) in bytes.chunks(4).enumerate() {
        let got = f32::from_le_bytes(v.try_into().unwrap());
        let want = (round + (k / per) as u64) as f32;
        assert_eq!(got, want, "session B element {k} after round {round}");
    }
}

/// Fails unless the worker process is still running (not exited, not
/// killed by a signal, not a zombie).
fn assert_running(w: &WorkerProcess) {
    let pid = Pid::from_raw(i32::try_from(w.pid()).unwrap());
    match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => {}
        other => panic!("the worker is not running: {other:?}; log:\n{}", w.log()),
    }
}

/// Fails unless `c` failed because `desc`'s import was refused for its
/// missing seal.
fn assert_refused(c: &TaskCompletion, desc: &BufferDescriptor, what: &str) {
    match &c.outcome {
        TaskOutcome::Failure(cause) => {
            assert_eq!(cause.kind, FailureKind::ImportRefused, "{cause}");
            let cause = &cause.message;
            let kind = desc.backing().kind().name();
            let id = desc.identity();
            assert!(
                cause.starts_with(&format!(
                    "argument 0: {kind} buffer {id} was refused at import: the fd ({what}"
                )),
                "{cause}"
            );
            assert!(cause.contains("F_SEAL_SHRINK is required"), "{cause}");
        }
        other => panic!("task {} on a refused import: {other:?}", c.id.0),
    }
}

/// The scenario both kinds of unsealable fd go through: session B runs on
/// a sealed buffer; session A passes `unsealed` (described by `desc`) and
/// is refused naming F_SEAL_SHRINK and `what` the fd is; a task naming it
/// fails with the refusal; A shrinks it to nothing while B's tasks are in
/// flight and names it again, failing the same way; B's bytes are right before and after and
/// the worker is still running.
async fn shrink_under_a_shared_worker(unsealed: OwnedFd, desc: BufferDescriptor, what: &str) {
    let w = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,lanes=2"],
    );
    let mint = mint();

    // Session B: a sealed buffer, imported and used.
    let (mut b, b_buf) = session_b(&w, &mint).await;

    // Session A: the unsealed fd is refused at import, in its FdAck, next
    // to a sealed one that is accepted.
    let mut a = open_session(&w).await;
    let a_good = SharedBuffer::new(&mint, 64, Access::ReadWrite);
    let id = *desc.identity();
    let acks = a
        .fds
        .import(
            &[id, *a_good.descriptor().identity()],
            &[unsealed.as_fd(), a_good.fd()],
        )
        .await
        .unwrap();
    let refusal = acks[0].as_ref().expect_err("the unsealed fd is refused");
    assert!(
        refusal.starts_with(&format!("buffer {id}: the fd ({what}")),
        "{refusal}"
    );
    assert!(
        refusal.contains("is not sealed against shrinking"),
        "{refusal}"
    );
    assert!(refusal.contains("F_SEAL_SHRINK is required"), "{refusal}");
    assert!(refusal.contains("MFD_ALLOW_SEALING"), "{refusal}");
    assert_eq!(acks[1], Ok(()));

    // A task naming the refused identity fails with the refusal (without
    // the seal rule it would map the fd here); A's sealed buffer still
    // works in the same batch.
    let refused_view = Tensor::new(desc, 0, &[16], &[1], DType::F32).unwrap();
    let good_view = Tensor::new(a_good.descriptor(), 0, &[16], &[1], DType::F32).unwrap();
    let batch = [
        fill_task(&a, 1, refused_view, 3.0),
        fill_task(&a, 2, good_view, 4.0),
    ];
    a.stream.send(&batch).await.unwrap();
    let done = collect(&mut a.stream, 2).await;
    assert_refused(&done[&1], &desc, what);
    assert_eq!(done[&2].outcome, TaskOutcome::Success);
    assert_eq!(
        a_good.read(0, 64),
        [4f32.to_le_bytes(); 16].concat(),
        "session A's sealed buffer"
    );

    // A shrinks it to nothing while B's next round is in flight, and names
    // it again (without the seal rule, this access to a mapping past the
    // end of its file would kill the worker with SIGBUS).
    send_b(&b, &b_buf, 2).await;
    ftruncate(&unsealed, 0).unwrap();
    assert_eq!(nix::sys::stat::fstat(&unsealed).unwrap().st_size, 0);
    a.stream
        .send(&[fill_task(&a, 3, refused_view, 5.0)])
        .await
        .unwrap();
    let done = collect(&mut a.stream, 1).await;
    assert_refused(&done[&3], &desc, what);
    check_b(&mut b, &b_buf, 2).await;

    // B is still served, with the right bytes, by the same process.
    send_b(&b, &b_buf, 3).await;
    check_b(&mut b, &b_buf, 3).await;
    assert_running(&w);
    assert!(w.log().contains("import refused"), "{}", w.log());
}

/// An unsealed memfd (made without MFD_ALLOW_SEALING) is refused at import
/// naming F_SEAL_SHRINK; shrinking it afterwards cannot touch the worker.
#[tokio::test(flavor = "multi_thread")]
async fn an_unsealed_memfd_is_refused_and_shrinking_it_leaves_the_worker_serving() {
    let mfd = memfd::MemfdOptions::default()
        .close_on_exec(true)
        .create("strata-unsealed")
        .unwrap();
    let file = mfd.into_file();
    file.set_len(4096).unwrap();
    let st = nix::sys::stat::fstat(&file).unwrap();
    let desc = BufferDescriptor::new(
        mint().mint().unwrap(),
        4096,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: st.st_dev,
            st_ino: st.st_ino,
        },
    )
    .unwrap();
    shrink_under_a_shared_worker(OwnedFd::from(file), desc, "a memfd").await;
}

/// A POSIX shared-memory object (shm_open, unlinked at once) cannot be
/// sealed. Passed without a descriptor it is refused like any unsealed fd,
/// and shrinking it afterwards cannot touch the worker.
#[tokio::test(flavor = "multi_thread")]
async fn a_posix_shm_object_without_its_descriptor_is_refused_and_shrinking_it_leaves_the_worker_serving()
 {
    let (fd, desc) = posix_object("strata-seal", 4096);
    shrink_under_a_shared_worker(fd, desc, "a POSIX shared-memory object").await;
}

/// A POSIX shared-memory object of `nbytes` named `prefix-<pid>`,
/// unlinked at once, and a READWRITE POSIX_SHM descriptor of it.
fn posix_object(prefix: &str, nbytes: u64) -> (OwnedFd, BufferDescriptor) {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let name = format!("{prefix}-{}", std::process::id());
    let path = format!("/{name}");
    let fd = nix::sys::mman::shm_open(
        path.as_str(),
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
        Mode::S_IRUSR | Mode::S_IWUSR,
    )
    .unwrap();
    nix::sys::mman::shm_unlink(path.as_str()).unwrap();
    ftruncate(&fd, i64::try_from(nbytes).unwrap()).unwrap();
    let desc = BufferDescriptor::new(
        mint().mint().unwrap(),
        nbytes,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::PosixShm {
            name: ShmName::new(&name).unwrap(),
        },
    )
    .unwrap();
    (fd, desc)
}

/// With its POSIX_SHM descriptor the same object is imported by copy,
/// never mapped: tasks read and write its bytes; shrinking it while a
/// task that writes it runs fails that task (its writes are not stored
/// and the object is not grown back), the next task on it fails at its
/// read, and the same worker process goes on serving another session with
/// the right bytes.
#[tokio::test(flavor = "multi_thread")]
async fn a_posix_shm_object_is_copied_and_a_shrink_mid_task_fails_only_that_task() {
    let w = WorkerProcess::spawn_unix(
        crate::faults::test_worker_bin(),
        &[],
        &["--device", "sim:mem=64MiB,lanes=2"],
    );
    let mint = mint();
    let (object, desc) = posix_object("strata-copied", 4096);

    // Session B: a sealed buffer, imported and used.
    let (mut b, b_buf) = session_b(&w, &mint).await;

    // Session A: the object, with its descriptor, is accepted.
    let mut a = open_session(&w).await;
    let acks = a.fds.import_as(&[desc], &[object.as_fd()]).await.unwrap();
    assert_eq!(acks, vec![Ok(())]);
    let late_fill = a.late_fill.expect("test.late_fill offered");
    let late = |id: u64, view: Tensor, ms: u64, value: u64| TaskRequest {
        id: TaskId(id),
        callable: late_fill,
        args: TaskArgs::new(vec![view], vec![ms, value]).unwrap(),
        tags: vec![ArgTag::Output],
        inline: vec![None],
        staged: Vec::new(),
        cache: Vec::new(),
        required_features: strata_proto::convert::Features::NONE,
        priority: 0,
    };
    // Elements 16..32 filled with 7 (a task's write lands in the object,
    // and only its view: the bytes around it stay zero), then 0..16
    // filled by `fill`.
    let middle = Tensor::new(desc, 64, &[16], &[1], DType::F32).unwrap();
    let head = Tensor::new(desc, 0, &[16], &[1], DType::F32).unwrap();
    a.stream
        .send(&[late(1, middle, 0, 7), fill_task(&a, 2, head, 3.0)])
        .await
        .unwrap();
    let done = collect(&mut a.stream, 2).await;
    for id in [1, 2] {
        assert_eq!(done[&id].outcome, TaskOutcome::Success, "task {id}");
    }
    let mut bytes = vec![0u8; 4096];
    nix::sys::uio::pread(&object, &mut bytes, 0).unwrap();
    let f32_at = |k: usize| f32::from_le_bytes(bytes[4 * k..4 * k + 4].try_into().unwrap());
    assert!((0..16).all(|k| f32_at(k) == 3.0));
    assert!((16..32).all(|k| f32_at(k) == 7.0));
    assert!((32..1024).all(|k| f32_at(k) == 0.0));

    // A task that writes the object runs for a second; the object is cut
    // to 64 bytes while it runs and B's next round is in flight.
    let tail = Tensor::new(desc, 2048, &[16], &[1], DType::F32).unwrap();
    a.stream.send(&[late(3, tail, 1500, 9)]).await.unwrap();
    send_b(&b, &b_buf, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    ftruncate(&object, 64).unwrap();
    let done = collect(&mut a.stream, 1).await;
    match &done[&3].outcome {
        TaskOutcome::Failure(cause) => {
            assert_eq!(cause.kind, FailureKind::Device, "{cause}");
            assert!(
                cause
                    .message
                    .contains("the task ran, but its writes could not be stored"),
                "{cause}"
            );
            assert!(cause.message.contains("now holds 64 bytes"), "{cause}");
        }
        other => panic!("a task whose object shrank while it ran: {other:?}"),
    }
    assert_eq!(
        nix::sys::stat::fstat(&object).unwrap().st_size,
        64,
        "a refused write-back does not grow the object back"
    );
    // The next task on it fails at its read, before it runs.
    a.stream.send(&[late(4, tail, 0, 9)]).await.unwrap();
    let done = collect(&mut a.stream, 1).await;
    match &done[&4].outcome {
        TaskOutcome::Failure(cause) => {
            assert_eq!(cause.kind, FailureKind::ImportRefused, "{cause}");
            assert!(
                cause.message.contains("shrank it after the import"),
                "{cause}"
            );
        }
        other => panic!("a task on a shrunk object: {other:?}"),
    }
    check_b(&mut b, &b_buf, 2).await;

    // B is still served, with the right bytes, by the same process.
    send_b(&b, &b_buf, 3).await;
    check_b(&mut b, &b_buf, 3).await;
    assert_running(&w);
}

/// What protects the worker is the seal: a sealed memfd that is imported
/// and mapped cannot be shrunk by its owner (EPERM), and tasks on it keep
/// running with the right bytes.
#[tokio::test(flavor = "multi_thread")]
async fn a_sealed_import_in_use_cannot_be_shrunk() {
    let w = WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,lanes=2"],
    );
    let mint = mint();
    let mut b = open_session(&w).await;
    let buf = SharedBuffer::new(&mint, B_ELEMS * 4, Access::ReadWrite);
    let acks = b
        .fds
        .import(&[*buf.descriptor().identity()], &[buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())]);
    send_b(&b, &buf, 1).await;
    check_b(&mut b, &buf, 1).await;

    // Mapped by the worker now; with tasks in flight, the owner tries to
    // shrink it, to nothing and by one byte.
    send_b(&b, &buf, 2).await;
    assert_eq!(ftruncate(buf.fd(), 0), Err(Errno::EPERM));
    let nbytes = i64::try_from(B_ELEMS * 4).unwrap();
    assert_eq!(ftruncate(buf.fd(), nbytes - 1), Err(Errno::EPERM));
    assert_eq!(
        nix::sys::stat::fstat(buf.fd()).unwrap().st_size,
        nbytes,
        "the size did not change"
    );
    check_b(&mut b, &buf, 2).await;
    send_b(&b, &buf, 3).await;
    check_b(&mut b, &buf, 3).await;
    assert_running(&w);
}
