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
//! 3. The reader thread pops completion records (spinning briefly, then
//!    parked on the lane's futex), checks each exactly as a completion off
//!    the stream, and hands them up in batches.
//! 4. The end: when the lifeline ends, the link closes the ring, waits for
//!    the reader to drain what the worker published, and only then reports
//!    the session closed — no completion is overtaken by the loss.
//!
//! A completion record that is not one, or lane words that are impossible,
//! end the link as a lost health deadline would: the worker is lost, never
//! the driver.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prost::Message;
use strata_client::FdChannel;
use strata_proto::convert::{TaskCompletion, TaskRequest};
use strata_proto::pb;
use strata_ring::shm::{Capacities, SharedRing};
use strata_ring::{Consumer, Memory, Producer, RingError, Spin, Waited, Which};
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::{LinkError, LinkEvent};

/// The lanes of every session: 4 MiB each holds thousands of tasks in
/// flight (a no-op record is about 200 bytes) and records up to 2 MiB.
pub(crate) const CAPACITIES: Capacities = Capacities {
    submit: 4 << 20,
    complete: 4 << 20,
};

/// How long the reader waits on an empty lane before it parks: a few
/// spins, then yields of the CPU (a few hundred microseconds in all), so
/// that the next record of a busy peer costs no wake-up. Yields, not
/// spins: on a machine with fewer cores than busy threads a spinning
/// reader takes the core its peer needs to produce the record (the sim
/// lanes' `LANE_SPIN` says what that cost).
const READER_SPIN: Spin = Spin {
    spins: 100,
    yields: 300,
};

/// How long a writer waits for room in one go before looking again (the
/// worker's loss closes the ring, which wakes it sooner).
const ROOM_WAIT: Duration = Duration::from_millis(200);

/// Completions handed up in one event at most.
const BATCH: usize = 1024;

/// The driver's end of one session's ring.
#[derive(Debug)]
pub(crate) struct RingPlane {
    mem: Arc<dyn Memory>,
    writer: Mutex<Writer>,
    /// Fires (by being dropped) when the reader thread has ended.
    drained: Mutex<Option<oneshot::Receiver<()>>>,
}

#[derive(Debug)]
struct Writer {
    producer: Producer,
    /// One task's encoding, reused.
    record: Vec<u8>,
}

impl RingPlane {
    /// Creates a ring for the session behind `fd` and offers it; `Ok(None)`
    /// when the worker refused it (then the task stream carries the tasks).
    /// Completions read off the ring go to `events`.
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
        let consumer = Consumer::new(Arc::clone(&mem), Which::Complete);
        let spawned = std::thread::Builder::new()
            .name("strata-ring-reader".into())
            .spawn(move || read(consumer, &events, done));
        if let Err(e) = spawned {
            strata_ring::close(&*mem);
            return Err(LinkError::Internal(format!("ring reader thread: {e}")));
        }
        Ok(Some(RingPlane {
            writer: Mutex::new(Writer {
                producer: Producer::new(Arc::clone(&mem), Which::Submit),
                record: Vec::new(),
            }),
            mem,
            drained: Mutex::new(Some(drained)),
        }))
    }

    /// The largest task record the submission lane carries.
    pub(crate) fn max_record(&self) -> usize {
        strata_ring::max_record(CAPACITIES.submit)
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
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
                let mut g = self.writer();
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
                if pending.is_empty() {
                    return Ok(());
                }
                producer.tail()
            };
            let mem = Arc::clone(&self.mem);
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
        strata_ring::close(&*self.mem);
    }

    /// Closes the ring and waits until the reader has handed up every
    /// completion the worker published: what the link does before it
    /// reports the session's end.
    pub(crate) async fn close_and_drain(&self) {
        self.close();
        let drained = self
            .drained
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
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
/// until the ring closes (then what was published before is still read).
/// `_done` is dropped when it returns.
fn read(mut lane: Consumer, events: &mpsc::UnboundedSender<LinkEvent>, _done: oneshot::Sender<()>) {
    let mut record = Vec::new();
    let mut batch = Vec::new();
    let mut closing = false;
    loop {
        let mut full = false;
        let broken = loop {
            match lane.try_pop(&mut record) {
                Ok(true) => match decode(&record) {
                    Ok(c) => {
                        batch.push(c);
                        if batch.len() == BATCH {
                            full = true;
                            break None;
                        }
                    }
                    Err(why) => break Some(why),
                },
                Ok(false) => break None,
                Err(e) => break Some(e.to_string()),
            }
        };
        if !batch.is_empty() {
            lane.release();
            if events
                .send(LinkEvent::Completions(std::mem::take(&mut batch)))
                .is_err()
            {
                return strata_ring::close(&**lane.memory());
            }
        }
        if let Some(why) = broken {
            strata_ring::close(&**lane.memory());
            let _ = events.send(LinkEvent::Unhealthy(format!(
                "its completion ring is unusable: {why}"
            )));
            return;
        }
        if full {
            continue;
        }
        if closing {
            return;
        }
        match lane.wait(READER_SPIN, None) {
            Waited::Ready | Waited::TimedOut => {}
            // One more pass: records published before the close.
            Waited::Closed => closing = true,
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
        read(Consumer::new(Arc::clone(&mem), Which::Complete), &tx, done);
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
        read(Consumer::new(mem, Which::Complete), &tx, done);
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
        read(Consumer::new(mem, Which::Complete), &tx, done);
        assert_eq!(ids(rx.try_recv().ok()), vec![1, 2, 3]);
        assert!(
            rx.try_recv().is_err(),
            "nothing else: the end is the lifeline's to report"
        );
    }
}
