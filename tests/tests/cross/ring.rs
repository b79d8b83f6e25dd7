//! The shared-memory ring against the real `strata worker`: tasks in and
//! completions out through the lanes, backpressure and wrap-around on
//! small lanes, and a hostile client — records that are not tasks, broken
//! framing, memfds that are not rings — ending only its own session.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prost::Message;
use strata_client::{FdChannel, TaskStream, WorkerClient};
use strata_proto::convert::{FailureKind, TaskCompletion, TaskOutcome, TaskRequest};
use strata_proto::pb;
use strata_ring::shm::{Capacities, SharedRing};
use strata_ring::{Consumer, Memory, Producer, Spin, Waited, Which};
use strata_tests::{SharedBuffer, WorkerProcess, strata_bin};
use strata_wire::{Access, ArgTag, DType, Tensor};

use crate::worker::{assert_failed, f32s, mint, session, task};

pub(crate) const SMALL: Capacities = Capacities {
    submit: 4096,
    complete: 4096,
};

const SPIN: Spin = Spin {
    spins: 100,
    yields: 10,
};

fn worker() -> WorkerProcess {
    WorkerProcess::spawn_unix(
        &strata_bin(),
        &["worker"],
        &["--device", "sim:mem=64MiB,lanes=2"],
    )
}

/// Makes a ring of `caps` and hands it to the session of `fds` (which
/// must stay open: its end ends the session).
pub(crate) async fn attach(fds: &mut FdChannel, caps: Capacities) -> std::sync::Arc<dyn Memory> {
    let (ring, fd) = SharedRing::create(caps).unwrap();
    let r = fds
        .attach_ring(
            std::os::fd::AsFd::as_fd(&fd),
            caps.submit as u32,
            caps.complete as u32,
        )
        .await
        .unwrap();
    assert_eq!(r, Ok(()));
    std::sync::Arc::new(ring)
}

/// A fresh session on `w`: its lifeline open, its fd channel (which must
/// stay open) and a small ring attached.
async fn ring_session(
    w: &WorkerProcess,
) -> (
    WorkerClient,
    TaskStream,
    FdChannel,
    std::sync::Arc<dyn Memory>,
) {
    let (mut client, _) = session(w).await;
    let stream = client.open_tasks().await.unwrap();
    let mut fds = client.fd_channel().await.unwrap();
    let mem = attach(&mut fds, SMALL).await;
    (client, stream, fds, mem)
}

/// Waits (10 s at most) until the worker ends the session: its task
/// stream, the lifeline, ends.
async fn until_ended(stream: &mut TaskStream, w: &WorkerProcess) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(_)) = stream.next().await {}
    })
    .await
    .unwrap_or_else(|_| panic!("the session ends: {}", w.log()));
}

/// Imports `buf` on the session of `fds`, which must accept it.
async fn import(fds: &mut FdChannel, buf: &SharedBuffer) {
    let acks = fds
        .import(&[*buf.descriptor().identity()], &[buf.fd()])
        .await
        .unwrap();
    assert_eq!(acks, vec![Ok(())]);
}

/// Writes `tasks` to the submission lane (waiting for room) while reading
/// `n` completions off the completion lane, as a driver would.
pub(crate) async fn run_on_ring(
    mem: &std::sync::Arc<dyn Memory>,
    tasks: Vec<TaskRequest>,
    n: usize,
) -> HashMap<u64, TaskCompletion> {
    let reader = {
        let mem = std::sync::Arc::clone(mem);
        tokio::task::spawn_blocking(move || {
            let mut lane = Consumer::new(mem, Which::Complete);
            let mut got = HashMap::new();
            let mut rec = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while got.len() < n {
                if lane.try_pop(&mut rec).unwrap() {
                    let c =
                        TaskCompletion::try_from(pb::Completion::decode(rec.as_slice()).unwrap())
                            .unwrap();
                    assert!(got.insert(c.id.0, c).is_none(), "a task completed twice");
                    continue;
                }
                assert_eq!(
                    lane.wait(SPIN, Some(deadline)),
                    Waited::Ready,
                    "completions in time"
                );
            }
            lane.release();
            got
        })
    };
    let mem = std::sync::Arc::clone(mem);
    tokio::task::spawn_blocking(move || {
        let mut lane = Producer::new(mem, Which::Submit);
        let deadline = Instant::now() + Duration::from_secs(30);
        for t in &tasks {
            let rec = pb::Task::from(t).encode_to_vec();
            assert!(
                lane.push(&rec, SPIN, Some(deadline)).unwrap(),
                "room in time"
            );
        }
        lane.publish();
    })
    .await
    .unwrap();
    reader.await.unwrap()
}

/// 2,000 tasks through 4 KiB lanes (each lane wraps a hundred times and
/// fills, so both sides wait for room): each completes once, on the ring,
/// and did its work; the task stream, the lifeline, carries nothing.
#[tokio::test(flavor = "multi_thread")]
async fn tasks_travel_on_the_ring_and_complete_on_it() {
    let w = worker();
    let (mut client, hs) = session(&w).await;
    assert!(hs.ring(), "a Unix worker offers the ring");
    let fill = hs.callable("fill", 1).unwrap();
    let buf = SharedBuffer::new(&mint(), 2000 * 4, Access::ReadWrite);
    let mut fds = client.fd_channel().await.unwrap();
    import(&mut fds, &buf).await;
    let mut stream = client.open_tasks().await.unwrap();
    let mem = attach(&mut fds, SMALL).await;
    let tasks: Vec<TaskRequest> = (0..2000u64)
        .map(|i| {
            let v = Tensor::new(buf.descriptor(), i * 4, &[1], &[1], DType::F32).unwrap();
            let scalar = (i as f64 + 0.25).to_bits();
            task(i, fill, vec![v], vec![ArgTag::Output], vec![scalar])
        })
        .collect();
    let done = run_on_ring(&mem, tasks, 2000).await;
    assert!(done.values().all(|c| c.outcome == TaskOutcome::Success));
    for (i, v) in f32s(&buf.read(0, 8000)).iter().enumerate() {
        assert_eq!(*v, i as f32 + 0.25, "element {i}");
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), stream.next())
            .await
            .is_err(),
        "nothing comes back on the task stream"
    );
    assert_eq!(client.stats().await.unwrap().tasks_succeeded, 2000);
}

/// A task record whose fields fail the checks fails that task alone, on
/// the ring, naming what was wrong; the session goes on. A record that is
/// not a task, or a broken record header, ends that session — the worker
/// goes on serving another.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_records_fail_their_task_or_end_their_session_never_the_worker() {
    let w = worker();
    // A task naming a callable the worker does not have, and one whose
    // TaskArgs blob is garbage: each fails alone.
    let (mut client, hs) = session(&w).await;
    let fill = hs.callable("fill", 1).unwrap();
    let _stream = client.open_tasks().await.unwrap();
    let mut fds = client.fd_channel().await.unwrap();
    let mem = attach(&mut fds, SMALL).await;
    let mut unknown = task(1, fill, vec![], vec![], vec![]);
    unknown.callable = strata_chip_runtime::KernelHandle([7; 16]);
    let done = run_on_ring(&mem, vec![unknown], 1).await;
    assert_failed(&done[&1], FailureKind::Refused, "callable");
    {
        let mut lane = Producer::new(std::sync::Arc::clone(&mem), Which::Submit);
        let bad = pb::Task {
            task_id: 2,
            callable: fill.0.to_vec(),
            args: vec![0xff; 40],
            tags: vec![],
            inline_inputs: vec![],
            cache: vec![],
            required_features: 0,
            priority: 0,
        };
        assert!(lane.try_push(&bad.encode_to_vec()).unwrap());
        lane.publish();
    }
    let done = run_on_ring(&mem, vec![], 1).await;
    assert_failed(&done[&2], FailureKind::Refused, "args");

    // Bytes that are not a task: the session ends (its lifeline closes),
    // the worker says why.
    let (_client, mut stream, _fds, mem) = ring_session(&w).await;
    {
        let mut lane = Producer::new(std::sync::Arc::clone(&mem), Which::Submit);
        assert!(lane.try_push(&[0xff; 13]).unwrap());
        lane.publish();
    }
    until_ended(&mut stream, &w).await;
    assert!(strata_ring::is_closed(&*mem), "the worker closed the ring");
    assert!(w.log().contains("is not a task"), "{}", w.log());

    // A record header of an unknown kind: the same.
    let (_client, mut stream, _fds, mem) = ring_session(&w).await;
    {
        let mut lane = Producer::new(std::sync::Arc::clone(&mem), Which::Submit);
        assert!(lane.try_push(&[0; 16]).unwrap());
        // Overwrite the header in place: kind 7 does not exist.
        mem.store(Which::Submit).put(4, &7u32.to_le_bytes());
        lane.publish();
    }
    until_ended(&mut stream, &w).await;
    assert!(w.log().contains("record kind 7"), "{}", w.log());

    // The worker still serves: a fresh session on a ring runs a task.
    let (mut client, hs) = session(&w).await;
    let buf = SharedBuffer::new(&mint(), 4, Access::ReadWrite);
    let mut fds = client.fd_channel().await.unwrap();
    import(&mut fds, &buf).await;
    let _stream = client.open_tasks().await.unwrap();
    let mem = attach(&mut fds, SMALL).await;
    let v = Tensor::new(buf.descriptor(), 0, &[1], &[1], DType::F32).unwrap();
    let fill = hs.callable("fill", 1).unwrap();
    let t = task(
        9,
        fill,
        vec![v],
        vec![ArgTag::Output],
        vec![3.0f64.to_bits()],
    );
    let done = run_on_ring(&mem, vec![t], 1).await;
    assert_eq!(done[&9].outcome, TaskOutcome::Success);
    assert_eq!(f32s(&buf.read(0, 4)), vec![3.0]);
}

/// What is not a ring is refused with a reason, and the session stays on
/// its task stream: a memfd not sealed against shrinking, one whose size
/// or control words do not match the announced lanes, a second ring, and
/// any ring at a worker started with `--no-ring`.
#[tokio::test(flavor = "multi_thread")]
async fn what_is_not_a_ring_is_refused() {
    let w = worker();
    let (mut client, _) = session(&w).await;
    let _stream = client.open_tasks().await.unwrap();
    let mut fds = client.fd_channel().await.unwrap();

    let unsealed = memfd::MemfdOptions::default()
        .allow_sealing(true)
        .create("not-a-ring")
        .unwrap();
    unsealed.as_file().set_len(SMALL.file_len() as u64).unwrap();
    let r = fds
        .attach_ring(std::os::fd::AsFd::as_fd(unsealed.as_file()), 4096, 4096)
        .await
        .unwrap();
    assert!(r.as_ref().unwrap_err().contains("seal"), "{r:?}");

    let (_ring, fd) = SharedRing::create(SMALL).unwrap();
    let r = fds
        .attach_ring(std::os::fd::AsFd::as_fd(&fd), 8192, 4096)
        .await
        .unwrap();
    assert!(r.as_ref().unwrap_err().contains("bytes"), "{r:?}");
    let r = fds
        .attach_ring(std::os::fd::AsFd::as_fd(&fd), 3000, 4096)
        .await
        .unwrap();
    assert!(r.as_ref().unwrap_err().contains("power of two"), "{r:?}");

    assert_eq!(
        fds.attach_ring(std::os::fd::AsFd::as_fd(&fd), 4096, 4096)
            .await
            .unwrap(),
        Ok(())
    );
    let (_again, fd2) = SharedRing::create(SMALL).unwrap();
    let r = fds
        .attach_ring(std::os::fd::AsFd::as_fd(&fd2), 4096, 4096)
        .await
        .unwrap();
    assert!(
        r.as_ref().unwrap_err().contains("already has a ring"),
        "{r:?}"
    );

    let plain = WorkerProcess::spawn_unix(&strata_bin(), &["worker"], &["--no-ring"]);
    let (mut client, hs) = session(&plain).await;
    assert!(!hs.ring(), "a --no-ring worker offers none");
    let _stream = client.open_tasks().await.unwrap();
    let mut fds = client.fd_channel().await.unwrap();
    let (_ring, fd) = SharedRing::create(SMALL).unwrap();
    let r = fds
        .attach_ring(std::os::fd::AsFd::as_fd(&fd), 4096, 4096)
        .await
        .unwrap();
    assert!(r.as_ref().unwrap_err().contains("no ring"), "{r:?}");
    // Both workers still serve.
    assert_eq!(client.stats().await.unwrap().sessions, 1);
    let (mut c, _) = session(&w).await;
    assert!(c.stats().await.is_ok());
}
