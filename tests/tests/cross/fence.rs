//! Fencing a lost session against the real worker binary: a client that
//! lost its connection comes back naming its old session, which the
//! worker ends at once; the old session's queued tasks never start, and
//! the client can watch its running tasks drain to zero.

use crate::faults::test_worker_bin;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use strata_chip_runtime::KernelHandle;
use strata_client::{Handshake, SessionId, SessionState, TaskStream, WorkerClient};
use strata_proto::TaskId;
use strata_proto::convert::{TaskCompletion, TaskOutcome, TaskRequest};
use strata_tests::{SharedBuffer, WorkerProcess};
use strata_wire::{Access, ArgTag, DType, IdentityMint, TaskArgs, Tensor};

fn mint() -> IdentityMint {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    IdentityMint::new((t as u64 ^ u64::from(std::process::id())).to_le_bytes())
}

async fn session(w: &WorkerProcess) -> (WorkerClient, Handshake) {
    let mut c = WorkerClient::connect(&w.endpoint, None)
        .await
        .expect("connect");
    let hs = c.handshake().await.expect("handshake");
    (c, hs)
}

fn task(id: u64, callable: KernelHandle, tensors: Vec<Tensor>, scalars: Vec<u64>) -> TaskRequest {
    let n = tensors.len();
    TaskRequest {
        id: TaskId(id),
        callable,
        args: TaskArgs::new(tensors, scalars).unwrap(),
        tags: vec![ArgTag::Output; n],
        inline: vec![None; n],
        staged: Vec::new(),
        cache: Vec::new(),
        required_features: strata_proto::convert::Features::NONE,
        priority: 0,
    }
}

/// `fill(buf, value)` over a whole 16-element F32 buffer.
fn fill(id: u64, fill: KernelHandle, buf: &SharedBuffer, value: f64) -> TaskRequest {
    let view = Tensor::row_major(buf.descriptor(), 0, &[16], DType::F32).unwrap();
    task(id, fill, vec![view], vec![value.to_bits()])
}

async fn next_completion(stream: &mut TaskStream) -> TaskCompletion {
    let mut batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("a completion in time")
        .expect("stream ok")
        .expect("stream open");
    assert_eq!(batch.len(), 1, "{batch:?}");
    batch.remove(0)
}

fn signal(w: &WorkerProcess, s: Signal) {
    kill(Pid::from_raw(i32::try_from(w.pid()).unwrap()), s).unwrap();
}

/// Polls `session_state` until `done` holds, checking `each` on the way.
async fn poll_state(
    client: &mut WorkerClient,
    session: SessionId,
    within: Duration,
    each: impl Fn(&SessionState),
    done: impl Fn(&SessionState) -> bool,
) -> SessionState {
    let deadline = Instant::now() + within;
    loop {
        let s = client.session_state(session).await.expect("session state");
        each(&s);
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "still {s:?} after {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Client A starts a 4 s task on a one-lane worker and queues four fills
/// behind it, the worker is stopped, A's connection dropped, the worker
/// woken, and A comes back naming its old session: the same process
/// answers (same instance), the old session is reported ended with its
/// long task still running, its running count drains to zero, and the
/// queued fills never ran — their buffers keep their zeros and the worker
/// counts them failed. Client C's session, open throughout, is untouched.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_session_is_ended_on_reconnect_and_its_queued_tasks_never_start() {
    let w = WorkerProcess::spawn_unix(
        test_worker_bin(),
        &[],
        &["--device", "sim:mem=64MiB,lanes=1"],
    );
    let mint = mint();

    // C: another client, whose session must live through A's reconnect.
    let (mut c, chs) = session(&w).await;
    let c_buf = SharedBuffer::new(&mint, 64, Access::ReadWrite);
    let mut c_fds = c.fd_channel().await.unwrap();
    let acks = c_fds
        .import(&[*c_buf.descriptor().identity()], &[c_buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())]);
    let mut c_stream = c.open_tasks().await.unwrap();

    // A: one long task, four fills queued behind it on the only lane.
    let (mut a, ahs) = session(&w).await;
    let sleep = ahs.callable("test.sleep", 1).expect("test.sleep");
    let fill_h = ahs.callable("fill", 1).expect("fill");
    let bufs: Vec<SharedBuffer> = (0..4)
        .map(|_| SharedBuffer::new(&mint, 64, Access::ReadWrite))
        .collect();
    let mut a_fds = a.fd_channel().await.unwrap();
    let ids: Vec<_> = bufs.iter().map(|b| *b.descriptor().identity()).collect();
    let fds: Vec<_> = bufs.iter().map(SharedBuffer::fd).collect();
    assert_eq!(a_fds.import(&ids, &fds).await.unwrap(), vec![Ok(()); 4]);
    let a_stream = a.open_tasks().await.unwrap();
    let mut tasks = vec![task(1, sleep, vec![], vec![4000])];
    tasks.extend(
        bufs.iter()
            .enumerate()
            .map(|(i, b)| fill(2 + i as u64, fill_h, b, 7.0)),
    );
    a_stream.send(&tasks).await.unwrap();
    // All five received, and handed to the device (in flight).
    poll_state(
        &mut a,
        ahs.session,
        Duration::from_secs(10),
        |s| assert!(s.known && !s.ended, "{s:?}"),
        |s| s.running == 5,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.stats().await.unwrap().tasks_in_flight < 5 {
        assert!(Instant::now() < deadline, "tasks not in flight");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Stopped, cut off, woken.
    w.hang();
    drop(a_stream);
    drop(a_fds);
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(&w, Signal::SIGCONT);

    let mut b = WorkerClient::connect(&w.endpoint, None).await.unwrap();
    let bhs = b.handshake_after(Some(ahs.session)).await.unwrap();
    assert_eq!(
        bhs.worker.instance, ahs.worker.instance,
        "the same process answered"
    );
    assert_ne!(bhs.session, ahs.session);
    let prev = bhs.previous.expect("the previous session is reported");
    assert!(prev.known && prev.ended, "{prev:?}");
    assert!(
        (1..=5).contains(&prev.running),
        "the 4 s task still runs: {prev:?}"
    );
    assert!(!prev.is_fenced());

    // C is untouched: live, and its work runs (after the long task).
    let cs = c.session_state(chs.session).await.unwrap();
    assert_eq!((cs.known, cs.ended), (true, false));
    c_stream
        .send(&[fill(1, fill_h, &c_buf, 5.0)])
        .await
        .unwrap();

    let fenced = poll_state(
        &mut b,
        ahs.session,
        Duration::from_secs(20),
        |s| assert!(s.known && s.ended, "{s:?}"),
        SessionState::is_fenced,
    )
    .await;
    assert_eq!(fenced.running, 0);
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(buf.read(0, 64), vec![0u8; 64], "queued fill {i} ran");
    }
    let done = next_completion(&mut c_stream).await;
    assert_eq!(done.outcome, TaskOutcome::Success, "{}", w.log());
    assert_eq!(c_buf.read(0, 4), 5.0f32.to_le_bytes());
    let stats = b.stats().await.unwrap();
    assert_eq!(
        (stats.tasks_succeeded, stats.tasks_failed),
        (2, 4),
        "the long task and C's fill ran; A's fills failed"
    );
    let log = w.log();
    assert!(log.contains("session ended"), "{log}");
}

/// Same process, same instance; a restarted worker on the same socket has
/// another and knows nothing of the old sessions. A session never issued
/// is unknown, which proves nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_instance_tells_a_restarted_worker_from_the_same_one() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("w.sock").display());
    let mut w = WorkerProcess::spawn_listening(test_worker_bin(), &[], &listen, &[]);
    let (mut a, ahs) = session(&w).await;
    assert_eq!(ahs.previous, None);
    let never = SessionId(ahs.session.0 ^ 0x0123_4567_89ab_cde0);
    assert_eq!(a.session_state(never).await.unwrap(), SessionState::UNKNOWN);
    let own = a.session_state(ahs.session).await.unwrap();
    assert_eq!((own.known, own.ended, own.running), (true, false, 0));

    // The same process: a's session (idle, no tasks) ends and is fenced.
    let mut b = WorkerClient::connect(&w.endpoint, None).await.unwrap();
    let bhs = b.handshake_after(Some(ahs.session)).await.unwrap();
    assert_eq!(bhs.worker.instance, ahs.worker.instance);
    let prev = bhs.previous.unwrap();
    assert!(prev.is_fenced(), "{prev:?}");
    let refused = a.stats().await.unwrap_err();
    assert!(
        refused.to_string().contains("unknown or has ended"),
        "{refused}"
    );
    // Naming a session never issued ends nothing and proves nothing.
    let mut d = WorkerClient::connect(&w.endpoint, None).await.unwrap();
    let dhs = d.handshake_after(Some(never)).await.unwrap();
    assert_eq!(dhs.previous, Some(SessionState::UNKNOWN));
    let bs = b.session_state(bhs.session).await.unwrap();
    assert_eq!((bs.known, bs.ended), (true, false), "b is still live");

    // Another process on the same socket.
    w.kill();
    drop((a, b, d));
    let w2 = WorkerProcess::spawn_listening(test_worker_bin(), &[], &listen, &[]);
    let mut e = WorkerClient::connect(&w2.endpoint, None).await.unwrap();
    let ehs = e.handshake_after(Some(ahs.session)).await.unwrap();
    assert_ne!(
        ehs.worker.instance, ahs.worker.instance,
        "a restarted worker"
    );
    assert_eq!(ehs.previous, Some(SessionState::UNKNOWN));
    assert_eq!(
        e.session_state(bhs.session).await.unwrap(),
        SessionState::UNKNOWN
    );
}
