//! The lane pool: `lanes` threads that run queued jobs, at most one each at
//! a time, with an in-flight count that `wait_idle` can wait on.
//!
//! Protocol (all under the one state lock):
//! 1. `submit` pushes a job and increments `in_flight`, then wakes a lane;
//!    after shutdown it refuses the job.
//! 2. A lane pops a job, releases the lock, runs it (panics are caught),
//!    re-takes the lock and decrements `in_flight`, waking `wait_idle`
//!    callers when it reaches zero.
//! 3. Shutdown (drop) sets the flag and wakes every lane; lanes finish the
//!    queued jobs, then exit, and drop joins them.
//!
//! 4. `run_here` (a pool of one lane only) runs a job on the caller's own
//!    thread when the lane is idle and nothing is queued: it marks the
//!    lane busy and counts the job in flight under the lock, runs it
//!    outside, then frees the lane and wakes the lane thread if jobs
//!    queued meanwhile. The lane thread takes no job while its lane is
//!    lent, so one lane still runs one job at a time, in queue order.
//!
//! LANES-1: `in_flight` = queued jobs + running jobs; every submitted job
//! runs exactly once.
//! LANES-2: at most one job runs as a given lane index at a time (on its
//! thread or lent to a caller).
//!
//! An idle lane spins a while, then yields a while (`LANE_SPIN` and
//! `LANE_YIELDS` checks of `queued`, a hint written under the lock and
//! read without it) before it sleeps on the
//! condition variable: a job submitted in that window costs no futex
//! wake-up, which across two cores is tens of microseconds — more than a
//! small kernel. The hint decides nothing: the lane re-takes the lock and
//! looks at the queue itself, so a stale hint only costs a spin. A
//! timing chip's lanes do not spin (their kernels sleep; with 8 or 64
//! modelled chips on two cores the spinning took the CPU the sleepers
//! needed to wake on time).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::sync::{Arc, AtomicU64, Condvar, Mutex, Ordering, lock, thread, wait};

/// Checks of the queue hint an idle lane makes with a spin hint, then
/// with a yield of the CPU, before it sleeps. Yields, not spins, make
/// most of the window: on two cores shared by a driver, its runtime and
/// the workers, a spinning thread takes the core a peer needs (chain hops
/// measured 165–350 µs with a 50 µs spin, 42–66 µs with 100 spins then
/// 300 yields), while a yield hands it over and returns at once when
/// nobody else wants it.
#[cfg(not(loom))]
const LANE_SPIN: u32 = 100;
#[cfg(not(loom))]
const LANE_YIELDS: u32 = 300;
#[cfg(loom)]
const LANE_SPIN: u32 = 0;
#[cfg(loom)]
const LANE_YIELDS: u32 = 1;

/// A job, given the index of the lane that runs it.
pub(crate) type Job = Box<dyn FnOnce(usize) + Send>;

#[derive(Debug)]
pub(crate) struct LanePool {
    shared: Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    work: Condvar,
    idle: Condvar,
    /// Queued jobs, as of the last change under the lock (a hint).
    queued: AtomicU64,
    /// Whether an idle lane spins and yields before it sleeps.
    spin: bool,
}

struct State {
    queue: VecDeque<Job>,
    in_flight: usize,
    shutdown: bool,
    /// Per lane: running a job (on its thread, or lent to a caller).
    busy: Vec<bool>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("queued", &self.queue.len())
            .field("in_flight", &self.in_flight)
            .field("shutdown", &self.shutdown)
            .finish()
    }
}

impl LanePool {
    /// `lanes` threads; with `spin`, an idle one spins and yields a while
    /// before it sleeps (see the module docs), without, it sleeps at once.
    pub(crate) fn new(lanes: usize, spin: bool) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                in_flight: 0,
                shutdown: false,
                busy: vec![false; lanes],
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            queued: AtomicU64::new(0),
            spin,
        });
        let mut threads = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            let shared = Arc::clone(&shared);
            threads.push(spawn(lane, move || run_lane(&shared, lane))?);
        }
        Ok(LanePool { shared, threads })
    }

    /// Queues `job`; gives it back if the pool is shutting down.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        let mut s = lock(&self.shared.state);
        if s.shutdown {
            return Err(job);
        }
        s.queue.push_back(job);
        s.in_flight += 1;
        self.shared
            .queued
            .store(s.queue.len() as u64, Ordering::Relaxed);
        self.shared.work.notify_one();
        Ok(())
    }

    /// Runs `job` on this thread, as lane 0, when the pool has one lane,
    /// that lane is idle and nothing is queued — what a thread that feeds
    /// the device (the ring's reader) saves is the wake-up of the lane
    /// thread. Gives the job back otherwise (then [`LanePool::submit`] it).
    /// With several lanes it always gives it back: a feeding thread held
    /// by one kernel would keep the next from starting on another lane.
    pub(crate) fn run_here(&self, job: Job) -> Result<(), Job> {
        {
            let mut s = lock(&self.shared.state);
            if s.shutdown || s.busy.len() != 1 || s.busy[0] || !s.queue.is_empty() {
                return Err(job);
            }
            s.busy[0] = true;
            s.in_flight += 1;
        }
        // As on a lane: a panic is the job's, not the caller's.
        let _ = catch_unwind(AssertUnwindSafe(|| job(0)));
        let mut s = lock(&self.shared.state);
        s.busy[0] = false;
        s.in_flight -= 1;
        if s.in_flight == 0 {
            self.shared.idle.notify_all();
        }
        if !s.queue.is_empty() || s.shutdown {
            // The lane thread may have parked on the lent lane.
            self.shared.work.notify_all();
        }
        Ok(())
    }

    /// Waits until no job is queued or running.
    pub(crate) fn wait_idle(&self) {
        let mut s = lock(&self.shared.state);
        while s.in_flight > 0 {
            s = wait(&self.shared.idle, s);
        }
    }

    /// Jobs queued or running.
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.shared.state).in_flight
    }
}

#[cfg(not(loom))]
fn spawn(
    lane: usize,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name(format!("strata-lane-{lane}"))
        .spawn(f)
}

#[cfg(loom)]
fn spawn(
    _lane: usize,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<thread::JoinHandle<()>> {
    Ok(thread::spawn(f))
}

fn run_lane(shared: &Shared, lane: usize) {
    let mut s = lock(&shared.state);
    loop {
        if s.busy[lane] {
            // Lent to a caller (`run_here`), which wakes us when it is done.
            s = wait(&shared.work, s);
        } else if let Some(job) = s.queue.pop_front() {
            shared.queued.store(s.queue.len() as u64, Ordering::Relaxed);
            s.busy[lane] = true;
            drop(s);
            // A job's own failures are reported through its completion; a
            // panic here (say, in a user's completion callback) must not
            // kill the lane or leak the in-flight count.
            let _ = catch_unwind(AssertUnwindSafe(|| job(lane)));
            s = lock(&shared.state);
            s.busy[lane] = false;
            s.in_flight -= 1;
            if s.in_flight == 0 {
                shared.idle.notify_all();
            }
        } else if s.shutdown {
            return;
        } else {
            drop(s);
            if shared.spin {
                spin_for_work(shared);
            }
            s = lock(&shared.state);
            if s.queue.is_empty() && !s.shutdown {
                s = wait(&shared.work, s);
            }
        }
    }
}

/// Spins, then yields, until the queue hint says a job is queued or the
/// checks run out.
fn spin_for_work(shared: &Shared) {
    let queued = || shared.queued.load(Ordering::Relaxed) != 0;
    for _ in 0..LANE_SPIN {
        if queued() {
            return;
        }
        std::hint::spin_loop();
    }
    for _ in 0..LANE_YIELDS {
        if queued() {
            return;
        }
        thread::yield_now();
    }
}

impl Drop for LanePool {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.work.notify_all();
        // The last owner of the device can be a job on one of its own
        // lanes (an in-process worker's node, dropped after its last task
        // while the driver shuts down): that lane ends by itself once it
        // sees `shutdown`; joining it from itself would fail (EDEADLK).
        #[cfg(not(loom))]
        let own = |t: &thread::JoinHandle<()>| t.thread().id() == thread::current().id();
        #[cfg(loom)]
        let own = |_: &thread::JoinHandle<()>| false;
        for t in self.threads.drain(..) {
            if !own(&t) {
                let _ = t.join();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Many jobs over three lanes all run once; a panicking job does not
    /// take its lane down or leak the in-flight count.
    #[test]
    fn every_job_runs_once_even_after_a_panic() {
        let pool = LanePool::new(3, true).unwrap();
        let count = std::sync::Arc::new(AtomicUsize::new(0));
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        assert!(pool.submit(Box::new(|_| panic!("job panics"))).is_ok());
        for _ in 0..1000 {
            let c = std::sync::Arc::clone(&count);
            assert!(
                pool.submit(Box::new(move |_| {
                    c.fetch_add(1, Ordering::Relaxed);
                }))
                .is_ok()
            );
        }
        pool.wait_idle();
        std::panic::set_hook(prev);
        assert_eq!(count.load(Ordering::Relaxed), 1000);
        assert_eq!(pool.in_flight(), 0);
    }

    /// An idle one-lane pool runs the job on the caller's thread, as lane
    /// 0, before `run_here` returns; a panic in it stays in the job.
    #[test]
    fn an_idle_single_lane_runs_the_job_on_the_caller() {
        let pool = LanePool::new(1, true).unwrap();
        let me = std::thread::current().id();
        let ran = std::sync::Arc::new(std::sync::Mutex::new(None));
        let r = std::sync::Arc::clone(&ran);
        let job: Job = Box::new(move |lane| {
            *r.lock().unwrap() = Some((std::thread::current().id(), lane));
        });
        assert!(pool.run_here(job).is_ok());
        assert_eq!(*ran.lock().unwrap(), Some((me, 0)));
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let ok = pool.run_here(Box::new(|_| panic!("job panics"))).is_ok();
        std::panic::set_hook(prev);
        assert!(ok);
        assert_eq!(pool.in_flight(), 0);
    }

    /// The job comes back (to be queued) when the pool has several lanes,
    /// when its lane is running a job, or when it has shut down.
    #[test]
    fn the_job_comes_back_unless_it_would_start_at_once() {
        let two = LanePool::new(2, true).unwrap();
        assert!(two.run_here(Box::new(|_| {})).is_err(), "several lanes");
        let one = LanePool::new(1, true).unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        assert!(
            one.submit(Box::new(move |_| {
                started_tx.send(()).unwrap();
                let _ = released.recv();
            }))
            .is_ok()
        );
        started.recv().unwrap();
        assert!(one.run_here(Box::new(|_| {})).is_err(), "lane busy");
        release.send(()).unwrap();
        one.wait_idle();
        lock(&one.shared.state).shutdown = true;
        assert!(one.run_here(Box::new(|_| {})).is_err(), "shut down");
    }

    /// A job queued while the lane is lent waits for the lent job (one
    /// lane, one job at a time), then runs on the lane thread.
    #[test]
    fn a_job_queued_while_the_lane_is_lent_runs_after_it() {
        let pool = std::sync::Arc::new(LanePool::new(1, true).unwrap());
        let running = std::sync::Arc::new(AtomicUsize::new(0));
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (p, r, o) = (
            std::sync::Arc::clone(&pool),
            std::sync::Arc::clone(&running),
            std::sync::Arc::clone(&order),
        );
        let lent: Job = Box::new(move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            let (r2, o2) = (std::sync::Arc::clone(&r), std::sync::Arc::clone(&o));
            assert!(
                p.submit(Box::new(move |_| {
                    assert_eq!(r2.fetch_add(1, Ordering::SeqCst), 0, "two jobs at once");
                    o2.lock().unwrap().push("queued");
                    r2.fetch_sub(1, Ordering::SeqCst);
                }))
                .is_ok()
            );
            // Long enough for a lane thread that ignored the loan to start.
            std::thread::sleep(std::time::Duration::from_millis(50));
            o.lock().unwrap().push("lent");
            r.fetch_sub(1, Ordering::SeqCst);
        });
        assert!(pool.run_here(lent).is_ok());
        pool.wait_idle();
        assert_eq!(*order.lock().unwrap(), vec!["lent", "queued"]);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::device::Slot;

    /// Two jobs on two lanes: each runs exactly once (its counter ends at
    /// 1, which a panic inside the job could not hide, since the lanes
    /// swallow panics), each completion is delivered, `wait_idle` returns
    /// only when both ran, and shutdown joins the lanes.
    #[test]
    fn completions_are_neither_lost_nor_duplicated() {
        use crate::sync::{AtomicU64, Ordering};
        loom::model(|| {
            let pool = LanePool::new(2, true).unwrap();
            let runs: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::new(AtomicU64::new(0))).collect();
            let slots: Vec<Arc<Slot<usize>>> = (0..2).map(|_| Arc::new(Slot::new())).collect();
            for (i, (slot, count)) in slots.iter().zip(&runs).enumerate() {
                let (slot, count) = (Arc::clone(slot), Arc::clone(count));
                let submitted = pool.submit(Box::new(move |_lane| {
                    count.fetch_add(1, Ordering::Relaxed);
                    slot.complete(i);
                }));
                assert!(submitted.is_ok());
            }
            for (i, slot) in slots.iter().enumerate() {
                assert_eq!(slot.wait(), Some(i));
            }
            pool.wait_idle();
            assert_eq!(pool.in_flight(), 0);
            drop(pool);
            for count in &runs {
                assert_eq!(count.load(Ordering::Relaxed), 1);
            }
        });
    }

    /// One lane: a caller runs a job on its own thread (`run_here`) while
    /// another submits one. Both run exactly once, never at the same time
    /// (LANES-2), `wait_idle` returns only after both, and the lane thread
    /// does not sleep through a job queued while its lane was lent (the
    /// pool's drop would then hang, which loom reports as a deadlock).
    #[test]
    fn a_lent_lane_runs_one_job_at_a_time_and_loses_none() {
        use crate::sync::{AtomicU64, Ordering};
        loom::model(|| {
            let pool = Arc::new(LanePool::new(1, true).unwrap());
            let running = Arc::new(AtomicU64::new(0));
            let runs = Arc::new(AtomicU64::new(0));
            let job = |running: &Arc<AtomicU64>, runs: &Arc<AtomicU64>| -> Job {
                let (running, runs) = (Arc::clone(running), Arc::clone(runs));
                Box::new(move |_| {
                    assert_eq!(
                        running.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two jobs at once"
                    );
                    runs.fetch_add(1, Ordering::SeqCst);
                    running.fetch_sub(1, Ordering::SeqCst);
                })
            };
            let p = Arc::clone(&pool);
            let other = job(&running, &runs);
            let submitter = thread::spawn(move || assert!(p.submit(other).is_ok()));
            if let Err(back) = pool.run_here(job(&running, &runs)) {
                assert!(pool.submit(back).is_ok());
            }
            submitter.join().unwrap();
            pool.wait_idle();
            assert_eq!(runs.load(Ordering::SeqCst), 2);
            drop(Arc::try_unwrap(pool).ok());
        });
    }

    /// `wait_idle` does not return while a job is still queued or running.
    #[test]
    fn wait_idle_waits_for_running_jobs() {
        use crate::sync::{AtomicU64, Ordering};
        loom::model(|| {
            let pool = LanePool::new(1, true).unwrap();
            let ran = Arc::new(AtomicU64::new(0));
            let r = Arc::clone(&ran);
            assert!(
                pool.submit(Box::new(move |_| r.store(1, Ordering::Relaxed)))
                    .is_ok()
            );
            pool.wait_idle();
            // The lane's lock release and our acquisition order the store.
            assert_eq!(
                ran.load(Ordering::Relaxed),
                1,
                "wait_idle returned before the job ran"
            );
        });
    }
}
