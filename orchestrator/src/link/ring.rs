//! The shared-memory data plane of a local gRPC link (`strata-ring`).
//!
//! When a worker on a Unix socket offers it at the handshake, the link
//! creates a ring memfd (a submission lane and a completion lane), passes
//! it over the fd channel, and from then on writes the session's tasks to
//! the submission lane and reads their completions from the completion
//! lane. gRPC stays the control plane: the handshake, buffer imports,
//! device calls, stats, the health stream, and the task stream, which
//! carries nothing any more but stays open as the session's lifeline — the
//! worker ends the session when it closes, and the driver sees a killed
//! worker by its end exactly as fast as before.
//!
//! Protocol, driver side:
//! 1. [`RingPlane::attach`]: create the memfd, send it with the lanes'
//!    capacities; a refusal (or a worker that does not know rings) leaves
//!    the link on the task stream.
//! 2. `send`: encode each task as a `pb::Task` record, push, publish once
//!    per batch (one futex wake-up at most, none while the worker's reader
//!    is busy). A full lane waits for room off the runtime.
//! 3. Completion records are popped, checked exactly as a completion off
//!    the stream, and handed up in batches — by the cluster's
//!    [`RingPoller`] on the runtime while tasks come and go (the runtime
//!    is awake then, so a completion wakes nobody), and otherwise by the
//!    session's reader thread, parked on the lane's futex.
//! 4. The end: when the lifeline ends, the link closes the ring, waits for
//!    the reader to drain what the worker published, and only then reports
//!    the session closed — no completion is overtaken by the loss.
//!
//! A completion record that is not one, or lane words that are impossible,
//! end the link as a lost health deadline would: the worker is lost, never
//! the driver.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use prost::Message;
use strata_client::FdChannel;
use strata_proto::convert::{TaskCompletion, TaskRequest};
use strata_proto::pb;
use strata_ring::shm::{Capacities, SharedRing};
use strata_ring::watched::Watched;
use strata_ring::{Consumer, Memory, Producer, RingError, Spin, Waited, Which};
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::debug;

use super::{LinkError, LinkEvent};

/// The lanes of every session: 4 MiB each holds thousands of tasks in
/// flight (a no-op record is about 200 bytes) and records up to 2 MiB.
pub(crate) const CAPACITIES: Capacities = Capacities {
    submit: 4 << 20,
    complete: 4 << 20,
};

/// How many idle rounds the runtime's [`RingPoller`] makes (each a check
/// of every lane and a yield of the CPU, a microsecond or two) after the
/// last completion or task before it hands the lanes back to their
/// reader threads.
const POLL_ROUNDS: u32 = 300;

/// And how long it may spend idle at most, however few rounds that was:
/// on a machine whose cores all run kernels, one yield can hand the core
/// to a kernel for a whole time slice (a millisecond or more), and a
/// poller that went on yielding would both take CPU from the kernels and
/// see their completions late. Past this, parked readers (woken in about
/// 10 µs) cost less. And when its last watches found nothing (tasks run
/// longer than it watches), it watches shorter, halving per empty watch
/// down to a sixteenth: long kernels then keep their cores, short tasks,
/// whose completions come while it watches, keep the full watch.
const POLL_IDLE: Duration = Duration::from_micros(50);

/// How long a writer waits for room in one go before looking again (the
/// worker's loss closes the ring, which wakes it sooner).
const ROOM_WAIT: Duration = Duration::from_millis(200);

/// Completions handed up in one event at most.
const BATCH: usize = 1024;

/// The driver's end of one session's ring.
#[derive(Debug)]
pub(crate) struct RingPlane {
    side: Arc<Side>,
    writer: Mutex<Writer>,
    /// Told of every batch written, so that it watches the lanes.
    poller: Option<Arc<RingPoller>>,
    /// Fires (by being dropped) when the reader thread has ended.
    drained: Mutex<Option<oneshot::Receiver<()>>>,
}

#[derive(Debug)]
struct Writer {
    producer: Producer,
    /// One task's encoding, reused.
    record: Vec<u8>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The completion side of a session, shared by its reader thread and the
/// runtime's poller (`strata_ring::watched`: one of the two watches the
/// lane at a time, and whoever reads hands what it read up under the
/// lane's lock, so completions go up in order and none after the
/// reader's last pass).
#[derive(Debug)]
struct Side {
    mem: Arc<dyn Memory>,
    /// The lane, with one record's bytes (reused).
    lane: Watched<Vec<u8>>,
    events: mpsc::UnboundedSender<LinkEvent>,
}

impl Side {
    fn new(mem: Arc<dyn Memory>, events: mpsc::UnboundedSender<LinkEvent>) -> Side {
        Side {
            lane: Watched::new(Consumer::new(Arc::clone(&mem), Which::Complete), Vec::new()),
            mem,
            events,
        }
    }

    /// The runtime poller's look: the number of completions handed up.
    fn poll(&self) -> usize {
        let mut read = 0;
        self.lane
            .poll(|lane, record| drain(lane, record, &self.events, &mut read));
        read
    }
}

/// Reads every completion published now and hands them up in batches,
/// adding their number to `read`; `false` when the lane is broken (the
/// ring is then closed and the worker reported unhealthy) or nobody
/// listens: nothing more is read.
fn drain(
    lane: &mut Consumer,
    record: &mut Vec<u8>,
    events: &mpsc::UnboundedSender<LinkEvent>,
    read: &mut usize,
) -> bool {
    loop {
        let mut batch = Vec::new();
        let broken = loop {
            match lane.try_pop(record) {
                Ok(true) => match decode(record) {
                    Ok(c) => {
                        batch.push(c);
                        if batch.len() == BATCH {
                            break None;
                        }
                    }
                    Err(why) => break Some(why),
                },
                Ok(false) => break None,
                Err(e) => break Some(e.to_string()),
            }
        };
        let full = batch.len() == BATCH;
        if !batch.is_empty() {
            lane.release();
            *read += batch.len();
            if events.send(LinkEvent::Completions(batch)).is_err() {
                strata_ring::close(&**lane.memory());
                return false;
            }
        }
        if let Some(why) = broken {
            strata_ring::close(&**lane.memory());
            let _ = events.send(LinkEvent::Unhealthy(format!(
                "its completion ring is unusable: {why}"
            )));
            return false;
        }
        if !full {
            return true;
        }
    }
}

impl RingPlane {
    /// Creates a ring for the session behind `fd` and offers it; `Ok(None)`
    /// when the worker refused it (then the task stream carries the tasks).
    /// Completions read off the ring go to `events`; `poller` (the
    /// cluster's) watches the lane while tasks come and go.
    ///
    /// # Errors
    /// The fd channel broke, or this process could not make the memfd or
    /// the reader thread.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped while it waits for the worker's answer, the
    /// worker may have taken a ring nobody reads (the link is then dropped
    /// too, which ends the session).
    pub(crate) async fn attach(
        fd: &mut FdChannel,
        events: mpsc::UnboundedSender<LinkEvent>,
        poller: Option<Arc<RingPoller>>,
    ) -> Result<Option<RingPlane>, LinkError> {
        let internal = |e: RingError| LinkError::Internal(format!("ring: {e}"));
        let (ring, memfd) = SharedRing::create(CAPACITIES).map_err(internal)?;
        let mem: Arc<dyn Memory> = Arc::new(ring);
        let caps = |c: usize| u32::try_from(c).unwrap_or(u32::MAX);
        let answer = fd
            .attach_ring(
                memfd.as_fd(),
                caps(CAPACITIES.submit),
                caps(CAPACITIES.complete),
            )
            .await
            .map_err(|e| LinkError::Unreachable(format!("fd channel: {e}")))?;
        if let Err(why) = answer {
            debug!(%why, "the worker refused the ring: tasks travel on the task stream");
            return Ok(None);
        }
        let (done, drained) = oneshot::channel();
        let side = Arc::new(Side::new(Arc::clone(&mem), events));
        let reader = Arc::clone(&side);
        let (warmed, warm) = oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("strata-ring-reader".into())
            .spawn(move || {
                let _warm = strata_ring::warm_heap();
                let _ = warmed.send(());
                read(&reader, done);
            });
        if let Err(e) = spawned {
            strata_ring::close(&*mem);
            return Err(LinkError::Internal(format!("ring reader thread: {e}")));
        }
        // The first completion waits for no fresh heap page (see
        // `strata_ring::warm_heap`).
        let _ = warm.await;
        if let Some(p) = &poller {
            p.register(&side);
        }
        Ok(Some(RingPlane {
            writer: Mutex::new(Writer {
                producer: Producer::new(Arc::clone(&mem), Which::Submit),
                record: Vec::new(),
            }),
            side,
            poller,
            drained: Mutex::new(Some(drained)),
        }))
    }

    /// The largest task record the submission lane carries.
    pub(crate) fn max_record(&self) -> usize {
        strata_ring::max_record(CAPACITIES.submit)
    }

    /// Writes `tasks` to the submission lane in order and publishes them,
    /// waiting (off the runtime) while the lane is full.
    ///
    /// # Errors
    /// [`LinkError::Lost`] once the ring is closed; a task larger than a
    /// record ([`RingPlane::max_record`]: the dispatcher keeps batches
    /// under it) or a corrupt lane as [`LinkError::Internal`].
    ///
    /// # Cancel safety
    /// Dropped while it waits for room, the tasks not yet written are not
    /// sent (those written are).
    pub(crate) async fn send(&self, tasks: &[TaskRequest]) -> Result<(), LinkError> {
        let mut pending = tasks;
        loop {
            let tail = {
                let mut g = lock(&self.writer);
                let Writer { producer, record } = &mut *g;
                while let Some((task, rest)) = pending.split_first() {
                    record.clear();
                    pb::Task::from(task).encode_raw(record);
                    match producer.try_push(record) {
                        Ok(true) => pending = rest,
                        Ok(false) => break,
                        Err(e) => {
                            producer.publish();
                            return Err(ring_error(e));
                        }
                    }
                }
                producer.publish();
                if let Some(p) = &self.poller {
                    p.busy();
                }
                if pending.is_empty() {
                    return Ok(());
                }
                producer.tail()
            };
            let mem = Arc::clone(&self.side.mem);
            let waited = tokio::task::spawn_blocking(move || {
                Producer::wait_released(
                    &*mem,
                    Which::Submit,
                    tail,
                    Spin::NONE,
                    Some(Instant::now() + ROOM_WAIT),
                )
            })
            .await
            .map_err(|e| LinkError::Internal(format!("waiting for ring room: {e}")))?;
            if waited == Waited::Closed {
                return Err(ring_error(RingError::Closed));
            }
        }
    }

    /// Closes both lanes: the worker's reader and ours stop.
    pub(crate) fn close(&self) {
        strata_ring::close(&*self.side.mem);
        self.side.lane.wake();
    }

    /// Closes the ring and waits until the reader has handed up every
    /// completion the worker published: what the link does before it
    /// reports the session's end.
    pub(crate) async fn close_and_drain(&self) {
        self.close();
        let drained = lock(&self.drained).take();
        if let Some(d) = drained {
            let _ = d.await;
        }
    }
}

impl Drop for RingPlane {
    fn drop(&mut self) {
        self.close();
    }
}

fn ring_error(e: RingError) -> LinkError {
    match e {
        RingError::Closed => LinkError::Lost("the session's ring is closed".into()),
        other => LinkError::Internal(format!("ring: {other}")),
    }
}

/// The reader thread: completion records to [`LinkEvent::Completions`]
/// until the ring closes (then what was published before is still read),
/// whenever the lane is its to watch. Parked at once when there is
/// nothing: while tasks come and go the runtime's poller watches the
/// lane, and a reader spinning beside it would only take the CPU the
/// worker needs. `_done` is dropped when it returns.
fn read(side: &Side, _done: oneshot::Sender<()>) {
    side.lane
        .serve(|lane, record| drain(lane, record, &side.events, &mut 0));
}

/// Watches the completion lanes of every ring of a cluster from its
/// runtime while tasks come and go, so that a completion costs no wake-up
/// of a parked thread: the runtime is awake anyway (it just sent the
/// task), and a reader thread that found the completion would have to
/// wake it (about 10 µs of a 34 µs hop on this machine, measured at the
/// reader's hand-up). After [`POLL_ROUNDS`] idle rounds it hands the
/// lanes back to their reader threads, which park on the lanes' bells.
#[derive(Debug, Default)]
pub(crate) struct RingPoller {
    sides: Mutex<Vec<Weak<Side>>>,
    /// Bumped by every batch written.
    sent: AtomicU64,
    work: Notify,
}

impl RingPoller {
    fn register(&self, side: &Arc<Side>) {
        lock(&self.sides).push(Arc::downgrade(side));
    }

    /// A batch was written: watch the lanes.
    fn busy(&self) {
        self.sent.fetch_add(1, Ordering::Release);
        // Wakes the poller if it waits; stores nothing if it is already
        // watching (a stored permit would buy a second idle spell).
        self.work.notify_waiters();
    }

    /// Serves until the runtime stops.
    pub(crate) async fn run(self: Arc<Self>) {
        let mut seen = 0;
        // Watches in a row that ended with nothing found.
        let mut empty: u32 = 0;
        loop {
            let work = self.work.notified();
            tokio::pin!(work);
            // Registered before the count is read: a batch written after
            // the read wakes it.
            work.as_mut().enable();
            if self.sent.load(Ordering::Acquire) == seen {
                work.await;
            }
            // Taken now, whatever follows: a batch written to a ring that
            // closed since must not keep this loop from waiting again.
            seen = self.sent.load(Ordering::Acquire);
            let mut sides: Vec<Arc<Side>> = {
                let mut all = lock(&self.sides);
                all.retain(|s| s.strong_count() > 0);
                all.iter().filter_map(Weak::upgrade).collect()
            };
            sides.retain(|s| !s.lane.is_closed());
            for s in &sides {
                s.lane.take();
            }
            let mut idle = 0;
            let mut idle_since = std::time::Instant::now();
            let budget = POLL_IDLE / (1 << empty.min(4));
            let mut found = false;
            while idle < POLL_ROUNDS && !sides.is_empty() {
                let now = self.sent.load(Ordering::Acquire);
                let mut read = 0;
                sides.retain(|s| {
                    read += s.poll();
                    if s.lane.is_closed() {
                        // Its reader makes the last pass.
                        s.lane.hand_back();
                        return false;
                    }
                    true
                });
                if read > 0 || now != seen {
                    found |= read > 0;
                    seen = now;
                    idle = 0;
                    idle_since = std::time::Instant::now();
                } else {
                    if idle_since.elapsed() >= budget {
                        break;
                    }
                    idle += 1;
                    std::thread::yield_now();
                }
                tokio::task::yield_now().await;
            }
            for s in &sides {
                s.lane.hand_back();
            }
            empty = if found { 0 } else { empty.saturating_add(1) };
        }
    }
}

/// A completion record, checked as one off the task stream is.
fn decode(record: &[u8]) -> Result<TaskCompletion, String> {
    let c = pb::Completion::decode(record).map_err(|e| format!("not a completion: {e}"))?;
    TaskCompletion::try_from(c).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use strata_proto::TaskId;
    use strata_proto::convert::TaskOutcome;

    use super::*;

    fn completion(id: u64) -> Vec<u8> {
        pb::Completion::from(TaskCompletion::bare(TaskId(id), TaskOutcome::Success)).encode_to_vec()
    }

    fn lane_with(records: &[&[u8]]) -> Arc<dyn Memory> {
        let caps = Capacities {
            submit: 4096,
            complete: 4096,
        };
        let (ring, _fd) = SharedRing::create(caps).unwrap();
        let mem: Arc<dyn Memory> = Arc::new(ring);
        let mut p = Producer::new(Arc::clone(&mem), Which::Complete);
        for r in records {
            assert!(p.try_push(r).unwrap());
        }
        p.publish();
        mem
    }

    fn ids(ev: Option<LinkEvent>) -> Vec<u64> {
        match ev {
            Some(LinkEvent::Completions(b)) => b.iter().map(|c| c.id.0).collect(),
            other => panic!("expected completions, got {other:?}"),
        }
    }

    /// A worker that writes garbage on its completion lane is lost (the
    /// driver is not): the completions before it go up first, then the
    /// loss, naming the lane; the ring is closed.
    #[test]
    fn a_garbage_completion_loses_the_worker_after_the_good_ones() {
        let (good1, good2) = (completion(1), completion(2));
        let mem = lane_with(&[&good1, &good2, &[0xff; 9]]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (done, mut drained) = oneshot::channel();
        read(&Side::new(Arc::clone(&mem), tx), done);
        assert_eq!(ids(rx.try_recv().ok()), vec![1, 2]);
        match rx.try_recv() {
            Ok(LinkEvent::Unhealthy(why)) => {
                assert!(why.contains("completion ring is unusable"), "{why}");
                assert!(why.contains("not a completion"), "{why}");
            }
            other => panic!("expected the loss, got {other:?}"),
        }
        assert!(strata_ring::is_closed(&*mem));
        assert!(drained.try_recv().is_err(), "the reader has ended");
    }

    /// A completion that decodes but fails the checks (a failure without
    /// a cause) loses the worker the same way.
    #[test]
    fn an_unchecked_completion_loses_the_worker() {
        let bad = pb::Completion {
            task_id: 3,
            outcome: pb::Outcome::TaskFailure as i32,
            ..Default::default()
        }
        .encode_to_vec();
        let mem = lane_with(&[&bad]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (done, _drained) = oneshot::channel();
        read(&Side::new(mem, tx), done);
        match rx.try_recv() {
            Ok(LinkEvent::Unhealthy(why)) => assert!(why.contains("cause"), "{why}"),
            other => panic!("expected the loss, got {other:?}"),
        }
    }

    /// Completions the worker published before the ring closed still go
    /// up, and then the reader ends by itself.
    #[test]
    fn completions_published_before_the_close_go_up() {
        let recs: Vec<Vec<u8>> = (1..=3).map(completion).collect();
        let refs: Vec<&[u8]> = recs.iter().map(Vec::as_slice).collect();
        let mem = lane_with(&refs);
        strata_ring::close(&*mem);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (done, _drained) = oneshot::channel();
        read(&Side::new(mem, tx), done);
        assert_eq!(ids(rx.try_recv().ok()), vec![1, 2, 3]);
        assert!(
            rx.try_recv().is_err(),
            "nothing else: the end is the lifeline's to report"
        );
    }

    /// The hand-off between the reader thread and the poller, with real
    /// threads: a worker publishing completions at uneven intervals, the
    /// reader thread, and a stand-in for the runtime's poller that takes
    /// the lane, polls it a while and hands it back, over and over, and
    /// stops half-way. Every completion goes up once, in order, and none
    /// is left behind once the poller stops looking (a lost hand-back
    /// would leave the reader waiting for the lane and the second half
    /// unread: the test fails at its deadline).
    #[test]
    fn the_reader_and_the_poller_hand_the_lane_over_without_losing_a_completion() {
        const N: u64 = 20_000;
        let mem = lane_with(&[]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let side = Arc::new(Side::new(Arc::clone(&mem), tx));
        let (done, mut drained) = oneshot::channel();
        let reader = {
            let side = Arc::clone(&side);
            std::thread::spawn(move || read(&side, done))
        };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let poller = {
            let (side, stop) = (Arc::clone(&side), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut round = 0u64;
                while !stop.load(Ordering::Acquire) {
                    side.lane.take();
                    for _ in 0..(round % 7) * 20 {
                        side.poll();
                        std::thread::yield_now();
                    }
                    side.lane.hand_back();
                    for _ in 0..round % 5 {
                        std::thread::yield_now();
                    }
                    round += 1;
                }
            })
        };
        let producer = {
            let (mem, stop) = (Arc::clone(&mem), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut p = Producer::new(mem, Which::Complete);
                for id in 1..=N {
                    let r = completion(id);
                    while !p.try_push(&r).unwrap() {
                        p.publish();
                        std::thread::yield_now();
                    }
                    if id % 3 == 0 || id % 101 == 0 {
                        p.publish();
                    }
                    if id % 97 == 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    if id == N / 2 {
                        // From here on the reader alone: the poller's last
                        // hand-back must reach it wherever it waits.
                        stop.store(true, Ordering::Release);
                    }
                }
                p.publish();
            })
        };
        let mut next = 1;
        let until = Instant::now() + Duration::from_secs(20);
        while next <= N {
            assert!(
                Instant::now() < until,
                "completion {next} of {N} never came"
            );
            match rx.try_recv() {
                Ok(LinkEvent::Completions(batch)) => {
                    for c in batch {
                        assert_eq!(c.id.0, next, "in order, once each");
                        next += 1;
                    }
                }
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        poller.join().unwrap();
        producer.join().unwrap();
        strata_ring::close(&*mem);
        side.lane.wake();
        reader.join().unwrap();
        assert!(drained.try_recv().is_err(), "the reader has ended");
        assert!(rx.try_recv().is_err(), "nothing more");
    }

    /// A batch counted for a ring that has since closed (no lane left to
    /// watch) leaves the poller waiting again, not looping: on a
    /// one-thread runtime a poller that never waits would keep everything
    /// else from running.
    #[test]
    fn the_poller_waits_again_when_no_lane_is_left_to_watch() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let mem = lane_with(&[]);
        let side = Arc::new(Side::new(Arc::clone(&mem), tx));
        strata_ring::close(&*mem);
        let poller = Arc::new(RingPoller::default());
        poller.register(&side);
        let (done, finished) = std::sync::mpsc::channel();
        let p = Arc::clone(&poller);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async move {
                tokio::spawn(Arc::clone(&p).run());
                for _ in 0..3 {
                    p.busy();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(10))
            .expect("the runtime kept running beside the poller");
    }
}
