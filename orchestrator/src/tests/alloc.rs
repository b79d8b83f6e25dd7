//! Runtime-managed buffers through the real actors and in-process worker
//! nodes: the pool's recycling (zeroed, a new generation, only once every
//! worker released it), scopes that reclaim what was allocated in them,
//! nested scopes, and every misuse refused by name.

use std::time::Duration;

use strata_orchestrator_core::{ScopeError, WorkerId};
use strata_wire::DType;

use super::actors::{eventually, f32s, gated, in_flight};
use crate::error::{BufferError, SubmitError};
use crate::{Cluster, Error, Task};

fn idle_and_out(c: &Cluster) -> (u64, u64) {
    let s = c.pool_stats();
    (s.idle, s.out)
}

fn scope_ended(e: &Error) -> bool {
    matches!(
        e,
        Error::Buffer(BufferError::ScopeEnded { .. })
            | Error::Submit(SubmitError::DeadArgument { .. })
    )
}

#[test]
fn a_recycled_buffer_comes_back_zeroed_under_a_new_generation_once_released() {
    let (c, gate) = gated(1, 64);
    let w = c.in_process_worker(WorkerId(0)).unwrap();
    let t = c.alloc(&[16, 16], DType::F32).unwrap();
    assert_eq!(t.buffer().nbytes(), 4096, "a page: the smallest class");
    assert_eq!(t.read::<f32>().unwrap(), vec![0.0; 256]);
    let first = t.buffer().identity();
    let fill = c
        .submit(Task::new("fill").output(&t).scalar_f64(5.0))
        .unwrap();
    c.submit(Task::new("t.gate").inout(&t)).unwrap();
    // The task in flight is the gate only once the fill has ended.
    c.wait(fill).unwrap();
    eventually("the gate task runs", || in_flight(&c, 0) == 1);
    assert_eq!(t.read::<f32>().unwrap(), vec![5.0; 256]);
    // The driver lets go while a task still uses it: nothing comes back.
    drop(t);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(idle_and_out(&c), (0, 1));
    assert_eq!(w.stats().imports, 1);
    gate.open();
    c.wait_all().unwrap();
    eventually("it is back in the pool", || idle_and_out(&c) == (1, 0));
    assert_eq!(w.stats().imports, 0, "released before it was recycled");
    let again = c.alloc(&[1000], DType::F32).unwrap();
    let second = again.buffer().identity();
    assert_eq!(second.buffer_id(), first.buffer_id(), "the same memfd");
    assert_eq!(second.generation(), first.generation() + 1);
    assert_eq!(
        again.read::<f32>().unwrap(),
        vec![0.0; 1000],
        "no stale byte"
    );
    // A task sees it zeroed too (the worker maps the new identity).
    let sum = c.alloc(&[1], DType::F32).unwrap();
    c.submit(Task::new("reduce_sum").input(&again).output(&sum))
        .unwrap();
    c.wait_all().unwrap();
    assert_eq!(sum.read::<f32>().unwrap(), vec![0.0]);
    let s = c.pool_stats();
    assert_eq!((s.created, s.reused, s.discarded), (2, 1, 0), "{s:?}");
}

#[test]
fn a_scope_reclaims_its_buffers_once_ended_and_their_tasks_are_done() {
    let (c, gate) = gated(1, 64);
    let x = f32s(&c, &[2.0; 64]);
    let s = c.scope().unwrap();
    let t = s.alloc(&[64], DType::F32).unwrap();
    assert_eq!(t.buffer().scope(), Some(s.id()));
    c.submit(Task::new("copy").input(&x).output(&t)).unwrap();
    c.submit(Task::new("t.gate").inout(&t)).unwrap();
    c.submit(Task::new("axpy").input(&t).inout(&x).scalar_f64(1.0))
        .unwrap();
    eventually("the gate task runs", || in_flight(&c, 0) == 1);
    let kept = t.clone();
    s.end().unwrap();
    // Ended: every use of its handles is refused, though tasks still run.
    for e in [
        kept.read::<f32>().map(drop),
        kept.check_read(),
        kept.write(&[0.0f32; 64]),
        kept.buffer().to_bytes().map(drop),
        kept.buffer().pinned().map(drop),
    ] {
        let e = e.unwrap_err();
        assert!(scope_ended(&e), "{e:?}");
        assert!(e.to_string().contains("which has ended"), "{e}");
    }
    let e = c
        .submit(Task::new("copy").input(&t).output(&x))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Submit(SubmitError::DeadArgument { arg: 0, source, .. })
            if matches!(**source, BufferError::ScopeEnded { .. })),
        "{e:?}"
    );
    assert!(kept.buffer().host_address().is_none());
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(idle_and_out(&c), (0, 1), "held while its tasks run");
    gate.open();
    c.wait_all().unwrap();
    assert_eq!(x.read::<f32>().unwrap(), vec![4.0; 64]);
    eventually("reclaimed", || idle_and_out(&c) == (1, 0));
    // Handles kept past the end are still refused; they never read the
    // recycled memory.
    let reused = c.alloc(&[64], DType::F32).unwrap();
    assert_eq!(
        reused.buffer().identity().buffer_id(),
        t.buffer().identity().buffer_id()
    );
    assert!(scope_ended(&t.read::<f32>().unwrap_err()));
}

#[test]
fn an_inner_scope_reclaims_its_own_buffers_and_ends_with_its_outer_one() {
    let c = Cluster::builder().in_process(1).start().unwrap();
    let outer = c.scope().unwrap();
    let a = outer.alloc(&[8], DType::F32).unwrap();
    {
        let inner = outer.scope().unwrap();
        let b = inner.alloc(&[8], DType::F32).unwrap();
        c.submit(Task::new("fill").output(&b).scalar_f64(3.0))
            .unwrap();
        c.submit(Task::new("copy").input(&b).output(&a)).unwrap();
        c.wait_all().unwrap();
        drop(inner);
        assert!(scope_ended(&b.read::<f32>().unwrap_err()));
    }
    eventually("the inner buffer is back", || idle_and_out(&c) == (1, 1));
    assert_eq!(
        a.read::<f32>().unwrap(),
        vec![3.0; 8],
        "the outer one lives"
    );
    // Ending the outer scope ends one still open inside it, first.
    let inner = c.open_scope_in(outer.id()).unwrap();
    let d = c.alloc_in(inner, &[8], DType::F32).unwrap();
    outer.end().unwrap();
    assert!(scope_ended(&a.read::<f32>().unwrap_err()));
    assert!(scope_ended(&d.read::<f32>().unwrap_err()));
    let e = c.alloc_in(inner, &[8], DType::F32).unwrap_err();
    assert!(
        matches!(e, Error::Buffer(BufferError::AllocScope(ScopeError::Ended(s))) if s == inner.0),
        "{e:?}"
    );
    assert!(matches!(
        c.end_scope(inner),
        Err(Error::Submit(SubmitError::Scope(ScopeError::AlreadyEnded(
            _
        ))))
    ));
    assert!(matches!(
        c.open_scope_in(inner),
        Err(Error::Submit(SubmitError::Scope(ScopeError::Ended(_))))
    ));
    // `d` reused the inner buffer's memfd: two in all.
    eventually("all back", || idle_and_out(&c) == (2, 0));
}

#[test]
fn allocations_that_cannot_be_made_say_why() {
    let c = Cluster::builder().in_process(1).start().unwrap();
    let e = c.alloc(&[4, 0], DType::F32).unwrap_err().to_string();
    assert!(e.contains("shape [4, 0] of F32: axis 1 is 0"), "{e}");
    let e = c.alloc(&[], DType::F32).unwrap_err().to_string();
    assert!(e.contains("0 axes"), "{e}");
    let e = c
        .alloc(&[u32::MAX, u32::MAX, u32::MAX], DType::F64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("overflows 64 bits"), "{e}");
    let s = c.open_scope().unwrap();
    c.end_scope(s).unwrap();
    let e = c.alloc_in(s, &[4], DType::F32).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("buffer: cannot allocate: scope {} has ended", s.number())
    );
    let never = crate::Scope(strata_orchestrator_core::ScopeId(999));
    assert!(matches!(
        c.alloc_in(never, &[4], DType::F32),
        Err(Error::Buffer(BufferError::AllocScope(ScopeError::Unknown(
            _
        ))))
    ));
    assert_eq!(c.pool_stats().out, 0, "nothing was taken");
}

#[test]
fn a_pinned_handle_keeps_the_memory_past_its_scope() {
    let c = Cluster::builder().in_process(1).start().unwrap();
    let s = c.scope().unwrap();
    let t = s.alloc(&[4], DType::F32).unwrap();
    t.write(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let pin = t.buffer().pinned().unwrap();
    let (addr, len) = pin.host_address().expect("a pinned handle has an address");
    assert_eq!(len, 4096);
    assert!(
        t.buffer().host_address().is_none(),
        "the lease alone has none"
    );
    drop(s);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(idle_and_out(&c), (0, 1), "the pin holds the memory");
    assert_eq!(pin.host_address(), Some((addr, len)), "at the same address");
    // Every other use is refused, pinned or not.
    assert!(matches!(
        pin.read_bytes(0, 4),
        Err(Error::Buffer(BufferError::ScopeEnded { .. }))
    ));
    drop(pin);
    eventually("back once the pin goes", || idle_and_out(&c) == (1, 0));
}

#[test]
fn a_buffer_imported_by_a_worker_lost_since_is_discarded_not_reused() {
    let (c, gate) = gated(2, 64);
    let x = c.alloc(&[16], DType::F32).unwrap();
    let z = f32s(&c, &[7.0; 16]);
    let held = c
        .submit(Task::new("t.gate").inout(&x).on(WorkerId(0)))
        .unwrap();
    eventually("the gate task runs", || in_flight(&c, 0) == 1);
    let w0 = c.in_process_worker(WorkerId(0)).unwrap();
    w0.halt();
    eventually("the loss is seen", || !c.is_up(WorkerId(0)));
    let writer = c
        .submit(Task::new("copy").input(&z).output(&x).on(WorkerId(1)))
        .unwrap();
    w0.resume();
    c.wait_up(WorkerId(0), Duration::from_secs(5)).unwrap();
    gate.open();
    assert!(c.wait(held).is_err());
    c.wait(writer).unwrap();
    assert_eq!(x.read::<f32>().unwrap(), vec![7.0; 16]);
    drop(x);
    eventually("it is settled", || c.pool_stats().out == 0);
    let s = c.pool_stats();
    assert_eq!((s.idle, s.discarded), (0, 1), "{s:?}");
}
