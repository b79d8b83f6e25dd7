//! Dispatch and completion, a lost worker and its return, backpressure at
//! the window, cancellation and deferred buffer release, through the real
//! actors and worker nodes in this process.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use strata_chip_runtime::kernel::{ArgSpec, DTypes, Rank, Signature};
use strata_chip_runtime::{Kernel, KernelContext, Registry};
use strata_orchestrator_core::{Outcome, WorkerId};
use strata_wire::{Access, DType};

use crate::{Cluster, Error, Task, View};

/// Opened once by the test; `t.gate` tasks wait for it.
#[derive(Default)]
pub(super) struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    pub(super) fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// `t.gate(x: INOUT any)`: waits until the test opens the gate (at most
/// 20 s, then fails: a test that forgets never hangs).
struct GateKernel {
    desc: Signature,
    gate: Arc<Gate>,
}

impl Kernel for GateKernel {
    fn descriptor(&self) -> &Signature {
        &self.desc
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        let open = self.gate.open.lock().map_err(|e| e.to_string())?;
        let (open, _) = self
            .gate
            .opened
            .wait_timeout_while(open, Duration::from_secs(20), |o| !*o)
            .map_err(|e| e.to_string())?;
        if *open {
            Ok(())
        } else {
            Err("the gate never opened".into())
        }
    }
}

/// `n` in-process workers, with the built-in kernels and `t.gate`.
pub(super) fn gated(n: usize, window: usize) -> (Cluster, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let mut kernels = Registry::with_builtins();
    kernels
        .register(Arc::new(GateKernel {
            desc: Signature {
                name: "t.gate".into(),
                version: 1,
                args: vec![ArgSpec {
                    name: "x".into(),
                    access: Access::ReadWrite,
                    dtypes: DTypes::Any,
                    rank: Rank::Any,
                }],
                scalars: vec![],
            },
            gate: Arc::clone(&gate),
        }))
        .expect("register t.gate");
    let cluster = Cluster::builder()
        .in_process(n)
        .kernels(kernels)
        .window(window)
        .health(Duration::from_millis(10), Duration::from_millis(200))
        .start()
        .expect("in-process cluster");
    (cluster, gate)
}

pub(super) fn f32s(c: &Cluster, values: &[f32]) -> View {
    c.buffer_from_slice(values)
        .unwrap()
        .tensor(&[values.len() as u32], DType::F32)
        .unwrap()
}

/// Waits until `cond` holds (at most 10 s).
pub(super) fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub(super) fn in_flight(c: &Cluster, w: u32) -> u64 {
    c.in_process_worker(WorkerId(w))
        .expect("in-process")
        .stats()
        .tasks_in_flight
}

#[test]
fn dispatch_and_completion() {
    let (c, gate) = gated(2, 64);
    let x = f32s(&c, &[1.0; 1024]);
    let y = f32s(&c, &[0.0; 1024]);
    // The gate holds y until every task is in, so both edges are live
    // when their consumers arrive (a finished producer is no edge).
    c.submit(Task::new("t.gate").inout(&y)).unwrap();
    c.submit(Task::new("copy").input(&x).output(&y)).unwrap();
    c.submit(Task::new("axpy").input(&x).inout(&y).scalar_f64(2.0))
        .unwrap();
    // Asked after the submits, on the same queue: all three are in.
    assert_eq!(c.totals().unwrap().edges, 2);
    gate.open();
    let s = c.wait_all().unwrap();
    assert_eq!((s.submitted, s.succeeded, s.edges), (3, 3, 2));
    assert!(y.read::<f32>().unwrap().iter().all(|&v| v == 3.0));
    assert!(s.fd_bytes >= 8192, "buffers passed by fd: {s:?}");
    assert!(c.workers().iter().all(|w| w.fd_passing));
    assert_eq!(c.workers()[1].endpoint, "in-process:1");
}

#[test]
fn a_lost_worker_quarantines_its_task_and_rejoins_once_fenced() {
    let (c, gate) = gated(2, 64);
    let x = f32s(&c, &[1.0; 16]);
    let z = f32s(&c, &[7.0; 16]);
    let held = c
        .submit(Task::new("t.gate").inout(&x).on(WorkerId(0)))
        .unwrap();
    eventually("the gate task runs", || in_flight(&c, 0) == 1);
    let w0 = c.in_process_worker(WorkerId(0)).unwrap();
    w0.halt();
    eventually("the loss is seen", || !c.is_up(WorkerId(0)));
    // The task may still write x (its kernel is running): quarantined,
    // as soon as the DAG actor has taken the loss in.
    eventually("x is quarantined", || {
        matches!(x.read::<f32>(), Err(Error::Quarantined(_)))
    });
    // A writer of x waits for the fence instead of racing the lost task.
    let writer = c.submit(Task::new("copy").input(&z).output(&x)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let e = x.read::<f32>().unwrap_err();
    assert!(
        matches!(&e, Error::Quarantined(q)
            if q.task == held.id() && q.worker == WorkerId(0) && q.bytes == (0..64)
                && q.callable.starts_with("t.gate") && q.buffer == x.buffer().identity()),
        "{e:?}"
    );
    // Every driver access is refused alike: the in-place checks (what
    // the Python binding calls before handing numpy the memory), writes,
    // and a view of only part of the bytes; a read-only view's write is
    // refused for its grant first.
    let part = x.reshape(8, &[2], &[1], DType::F32).unwrap();
    for e in [
        x.check_read(),
        x.check_write(),
        part.check_read(),
        x.write(&[0.0f32; 16]),
        x.buffer().write_bytes(60, &[0; 4]),
    ] {
        assert!(matches!(e, Err(Error::Quarantined(_))), "{e:?}");
    }
    let ro = x.read_only().unwrap();
    assert!(matches!(ro.check_read(), Err(Error::Quarantined(_))));
    assert!(matches!(
        ro.check_write(),
        Err(Error::View(crate::error::ViewError::ReadOnly { .. }))
    ));
    // Other buffers are untouched by it.
    z.check_write().unwrap();
    // Back, the same node reports the lost session ended with nothing
    // running once the kernel returns: that is the fence.
    w0.resume();
    c.wait_up(WorkerId(0), Duration::from_secs(5)).unwrap();
    gate.open();
    let e = c.wait(held).unwrap_err();
    assert!(
        matches!(&e, Error::Run(r) if matches!(r.outcome, Outcome::EndpointFailure(_))),
        "{e}"
    );
    c.wait(writer).unwrap();
    assert_eq!(x.read::<f32>().unwrap(), vec![7.0; 16]);
    x.check_write().unwrap();
    part.check_read().unwrap();
    // It takes work again.
    let y = f32s(&c, &[0.0; 16]);
    let t = c
        .submit(Task::new("copy").input(&z).output(&y).on(WorkerId(0)))
        .unwrap();
    c.wait(t).unwrap();
    assert_eq!(y.read::<f32>().unwrap(), vec![7.0; 16]);
}

#[test]
fn the_window_bounds_what_runs_on_a_worker() {
    let (c, gate) = gated(1, 2);
    let views: Vec<View> = (0..5).map(|_| f32s(&c, &[0.0; 4])).collect();
    for v in &views {
        c.submit(Task::new("t.gate").inout(v)).unwrap();
    }
    eventually("two tasks run", || in_flight(&c, 0) == 2);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(in_flight(&c, 0), 2, "the window is 2");
    gate.open();
    let s = c.wait_all().unwrap();
    assert_eq!((s.submitted, s.succeeded), (5, 5));
}

#[test]
fn a_waiting_task_cancels_and_a_running_one_does_not() {
    let (c, gate) = gated(1, 64);
    let x = f32s(&c, &[1.0; 8]);
    let y = f32s(&c, &[0.0; 8]);
    let a = c.submit(Task::new("t.gate").inout(&x)).unwrap();
    let b = c.submit(Task::new("copy").input(&x).output(&y)).unwrap();
    eventually("the gate task runs", || in_flight(&c, 0) == 1);
    c.cancel(b).unwrap();
    assert!(c.cancel(a).is_err(), "a running task is not cancelled");
    gate.open();
    // A cancelled task is not a failure of the run.
    let s = c.wait_all().unwrap();
    assert_eq!((s.succeeded, s.cancelled), (1, 1));
    let e = c.wait(b).unwrap_err();
    assert!(
        matches!(&e, Error::Run(r) if r.outcome == Outcome::Cancelled),
        "{e}"
    );
    assert_eq!(
        y.read::<f32>().unwrap(),
        vec![0.0; 8],
        "the cancelled copy never ran"
    );
}

#[test]
fn a_buffer_is_released_on_the_worker_only_after_its_last_task() {
    let (c, gate) = gated(1, 64);
    let w = c.in_process_worker(WorkerId(0)).unwrap();
    let x = f32s(&c, &[1.0; 8]);
    c.submit(Task::new("t.gate").inout(&x)).unwrap();
    eventually("the gate task runs", || in_flight(&c, 0) == 1);
    assert_eq!(w.stats().imports, 1);
    // The driver lets go; the running task still holds the buffer.
    drop(x);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(w.stats().imports, 1, "released under a running task");
    gate.open();
    c.wait_all().unwrap();
    eventually("the worker releases it", || w.stats().imports == 0);
}

#[test]
fn sliced_waits_call_back_between_slices_and_give_up_when_told() {
    let (c, gate) = gated(1, 64);
    let x = f32s(&c, &[0.0; 4]);
    let t = c.submit(Task::new("t.gate").inout(&x)).unwrap();
    let slice = Duration::from_millis(5);
    // Given up at the third slice while the task waits at the gate.
    let mut calls = 0;
    let r = c.wait_while(t, slice, || {
        calls += 1;
        calls < 3
    });
    assert!(!r.unwrap());
    assert_eq!(calls, 3);
    let mut calls = 0;
    assert!(
        c.wait_all_while(slice, || {
            calls += 1;
            false
        })
        .unwrap()
        .is_none()
    );
    assert_eq!(calls, 1);
    assert!(!c.wait_timeout(t, Duration::ZERO).unwrap());
    // Once the gate opens, both waits end with the answer (the given-up
    // wait_all's request is taken over: the run's answer is not lost).
    gate.open();
    assert!(c.wait_while(t, slice, || true).unwrap());
    let summary = c.wait_all_while(slice, || true).unwrap().expect("finished");
    assert_eq!((summary.submitted, summary.succeeded), (1, 1));
    // A finished task's wait answers at once (a zero limit would race the
    // actor's reply on a loaded machine).
    assert!(c.wait_timeout(t, Duration::from_secs(10)).unwrap());
}
