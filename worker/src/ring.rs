//! The worker's end of a session's shared-memory ring (`strata-ring`):
//! the driver sends the memfd over the fd channel; from then on the
//! session's tasks arrive on the submission lane and their completions
//! leave on the completion lane, while the gRPC task stream stays open as
//! the session's lifeline (its end ends the session, which closes the
//! ring).
//!
//! The ring is input from another process, like a gRPC message: the memfd
//! passes the same arrival checks as a buffer's (tmpfs, sealed against
//! shrinking) and must be exactly the announced layout; every record is
//! decoded as a `pb::Task` and converted with the same checks as a task
//! from the stream. A record that is not a task, or a lane whose words are
//! impossible, ends this session — never the worker; a task that fails
//! its checks fails alone.
//!
//! Two threads per session: the *reader* takes records (spinning briefly
//! while the lane is empty, then parked on its futex) and hands each to
//! the session's [`Intake`], whose backpressure stops it reading; the
//! *flusher* writes completions that found the completion lane full.
//! A completion that fits is written by whoever completes the task (a
//! lane thread, or the reader itself when the device ran the kernel on it:
//! the reader launches with `launch_here`), with no thread hop.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use prost::Message;
use strata_proto::convert::{FailureCause, FailureKind, TaskCompletion, TaskRequest};
use strata_proto::{TaskId, pb};
use strata_ring::shm::{Capacities, SharedRing};
use strata_ring::{Consumer, Memory, Producer, RingError, Spin, Waited, Which};
use strata_worker_node::{CompletionSink, Intake, Node, SessionId};
use tracing::{debug, warn};

/// How long the reader waits on an empty lane before it parks: a few
/// spins, then yields of the CPU (a few hundred microseconds in all), so
/// that the next record of a busy peer costs no wake-up. Yields, not
/// spins: on a machine with fewer cores than busy threads a spinning
/// reader takes the core its peer needs to produce the record (the sim
/// lanes' `LANE_SPIN` says what that cost).
pub(crate) const READER_SPIN: Spin = Spin {
    spins: 100,
    yields: 300,
};

/// Takes `fds` (one: the ring memfd, lanes as `ring` says) for `session`
/// and starts its threads.
pub(crate) async fn attach(
    node: &Arc<Node>,
    offered: bool,
    id: SessionId,
    ring: &pb::FdRing,
    mut fds: Vec<OwnedFd>,
) -> Result<(), String> {
    if !offered {
        return Err("this worker offers no ring (it was started with --no-ring)".into());
    }
    if fds.len() != 1 {
        return Err(format!(
            "a ring frame carries one fd; {} arrived",
            fds.len()
        ));
    }
    let fd = fds.remove(0);
    let session = node
        .session(id)
        .ok_or_else(|| format!("session {id} is unknown or has ended"))?;
    strata_worker_node::check_arrival(&fd, None).map_err(|e| format!("ring memfd: {e}"))?;
    let caps = Capacities {
        submit: ring.submit_capacity as usize,
        complete: ring.complete_capacity as usize,
    };
    let mem: Arc<dyn Memory> = Arc::new(SharedRing::open(&fd, caps).map_err(|e| e.to_string())?);
    drop(fd);
    if !session.set_ring(Arc::clone(&mem)) {
        return Err(format!("session {id} already has a ring"));
    }
    let outbox = Arc::new(Outbox {
        inner: Mutex::new(Inner {
            producer: Producer::new(Arc::clone(&mem), Which::Complete),
            overflow: VecDeque::new(),
        }),
        wake: Condvar::new(),
        mem: Arc::clone(&mem),
    });
    let sink: Arc<dyn CompletionSink> = Arc::clone(&outbox) as _;
    let intake = Intake::new(Arc::clone(node), Arc::clone(&session), sink);
    let rt = tokio::runtime::Handle::current();
    let consumer = Consumer::new(Arc::clone(&mem), Which::Submit);
    let reader_node = Arc::clone(node);
    let (warmed, warm) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(format!("strata-ring-{id}"))
        .spawn(move || {
            let _warm = strata_ring::warm_heap();
            let _ = warmed.send(());
            read(reader_node, id, consumer, intake, rt);
        })
        .and_then(|_| {
            std::thread::Builder::new()
                .name(format!("strata-flush-{id}"))
                .spawn(move || outbox.flush())
        });
    if let Err(e) = spawned {
        strata_ring::close(&*mem);
        return Err(format!("ring threads: {e}"));
    }
    // The driver's first task waits for no fresh heap page (see
    // `strata_ring::warm_heap`): the answer goes once the reader has
    // faulted its own in.
    let _ = warm.await;
    // A session that ended while this was set up closed no ring.
    if node.session(id).is_none() {
        strata_ring::close(&*mem);
    }
    debug!(session = %id, submit = caps.submit, complete = caps.complete, "ring attached");
    Ok(())
}

/// The reader: records to tasks until the ring closes.
fn read(
    node: Arc<Node>,
    id: SessionId,
    mut ring: Consumer,
    intake: Intake,
    rt: tokio::runtime::Handle,
) {
    let mut buf = Vec::new();
    let mut n = 0u64;
    let why = loop {
        match ring.try_pop(&mut buf) {
            Ok(true) => {
                n += 1;
                let task = match pb::Task::decode(buf.as_slice()) {
                    Ok(t) => t,
                    Err(e) => break format!("ring record {n} is not a task: {e}"),
                };
                let task_id = TaskId(task.task_id);
                let req = TaskRequest::try_from(task).map_err(|e| e.to_string());
                // Backpressure: the lane is not read while the session's
                // tasks in flight are at their limit.
                intake.take_blocking(&rt, task_id, req);
                continue;
            }
            Ok(false) => {}
            Err(e) => break e.to_string(),
        }
        match ring.wait(READER_SPIN, None) {
            Waited::Ready | Waited::TimedOut => {}
            Waited::Closed => return debug!(session = %id, tasks = n, "ring closed"),
        }
    };
    warn!(session = %id, %why, "ring refused: the session ends");
    node.end_session(id, &format!("its ring is unusable ({why})"));
}

/// Where a ring session's completions go.
#[derive(Debug)]
pub(crate) struct Outbox {
    inner: Mutex<Inner>,
    wake: Condvar,
    mem: Arc<dyn Memory>,
}

#[derive(Debug)]
struct Inner {
    producer: Producer,
    /// Encoded completions that found the lane full, oldest first.
    overflow: VecDeque<Vec<u8>>,
}

impl CompletionSink for Outbox {
    /// Writes `c` to the completion lane, or leaves it to the flusher
    /// when the lane is full (a lane thread never waits for the driver).
    fn complete(&self, c: TaskCompletion) {
        let id = c.id;
        let mut rec = pb::Completion::from(c).encode_to_vec();
        let mut g = self.lock();
        let max = g.producer.max_record();
        if rec.len() > max {
            let cause = format!(
                "its completion takes {} bytes, more than the ring carries ({max})",
                rec.len()
            );
            let cause = FailureCause::new(FailureKind::Other, cause);
            rec = pb::Completion::from(TaskCompletion::failed(id, cause)).encode_to_vec();
        }
        if g.overflow.is_empty() {
            match g.producer.try_push(&rec) {
                Ok(true) => return g.producer.publish(),
                Ok(false) => {}
                // Closed or corrupt: the session is ending; its completions
                // have nowhere to go, as with a closed stream.
                Err(_) => return,
            }
        }
        g.overflow.push_back(rec);
        drop(g);
        self.wake.notify_one();
    }
}

impl Outbox {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The flusher: writes what overflowed, waiting for room, until the
    /// ring closes.
    fn flush(&self) {
        loop {
            let mut g = self.lock();
            while g.overflow.is_empty() {
                if strata_ring::is_closed(&*self.mem) {
                    return;
                }
                g = self
                    .wake
                    .wait_timeout(g, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            while let Some(rec) = g.overflow.pop_front() {
                match g.producer.try_push(&rec) {
                    Ok(true) => {}
                    Ok(false) => {
                        g.overflow.push_front(rec);
                        break;
                    }
                    Err(RingError::Closed) => return,
                    Err(e) => {
                        warn!(error = %e, "completion lane unusable");
                        return strata_ring::close(&*self.mem);
                    }
                }
            }
            g.producer.publish();
            if g.overflow.is_empty() {
                continue;
            }
            let tail = g.producer.tail();
            drop(g);
            if Producer::wait_released(&*self.mem, Which::Complete, tail, Spin::NONE, None)
                == Waited::Closed
            {
                return;
            }
        }
    }
}
