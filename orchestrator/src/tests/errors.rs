//! The driver's errors are values a program matches on: each refusal
//! below is provoked through an in-process cluster and checked by variant
//! and fields, not by text.

use strata_orchestrator_core::{CancelError, ScopeError, SubmitReason, TaskId, WorkerId};
use strata_wire::{Access, ArgTag, DType};

use crate::error::{BufferError, ClusterError, SubmitError, ViewError};
use crate::task::TaskHandle;
use crate::{Cluster, Error, Task};

fn one() -> Cluster {
    Cluster::builder().in_process(1).start().unwrap()
}

#[test]
fn a_view_that_does_not_fit_its_buffer_is_the_wire_error() {
    let c = one();
    let b = c.buffer(64).unwrap();
    let e = b.tensor(&[32], DType::F32).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::View(ViewError::Wire(strata_wire::Error::ViewOutOfBounds {
                nbytes: 64,
                ..
            }))
        ),
        "{e:?}"
    );
    assert!(e.to_string().starts_with("view: "), "{e}");
    let v = b.tensor(&[16], DType::F32).unwrap();
    assert!(matches!(
        v.read::<i32>(),
        Err(Error::View(ViewError::DType {
            holds: DType::F32,
            asked: DType::I32
        }))
    ));
    assert!(matches!(
        v.write(&[1.0f32; 3]),
        Err(Error::View(ViewError::Count {
            values: 3,
            elements: 16
        }))
    ));
    // A read-only view cannot be widened again.
    let ro = v.read_only().unwrap();
    assert!(matches!(
        ro.with_access(Access::ReadWrite),
        Err(Error::View(ViewError::Wire(
            strata_wire::Error::AccessWidened { .. }
        )))
    ));
}

#[test]
fn unknown_callables_and_versions_name_what_is_offered() {
    let c = one();
    let x = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    let e = c.submit(Task::new("nope").input(&x)).unwrap_err();
    assert!(
        matches!(&e, Error::Submit(SubmitError::UnknownCallable { name, offered })
            if name == "nope" && offered.iter().any(|o| o == "copy")),
        "{e:?}"
    );
    assert!(e.to_string().contains("unknown callable \"nope\""), "{e}");
    assert!(matches!(
        c.submit(Task::new("copy@x").input(&x)),
        Err(Error::Submit(SubmitError::BadVersion { .. }))
    ));
    assert!(matches!(
        c.callable_signature("copy@99"),
        Err(Error::Submit(SubmitError::UnknownVersion {
            version: 99,
            ..
        }))
    ));
}

#[test]
fn a_tag_the_grant_does_not_allow_is_the_dag_rule() {
    let c = one();
    let b = c.buffer(128).unwrap();
    let x = b.tensor(&[16], DType::F32).unwrap();
    let y = b.tensor_at(64, &[16], DType::F32).unwrap();
    let ro = y.read_only().unwrap();
    let e = c
        .submit(Task::new("copy").input(&x).output(&ro))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Submit(SubmitError::Rejected(
                strata_orchestrator_core::SubmitError {
                    reason: SubmitReason::NotGranted {
                        member: 0,
                        arg: 1,
                        tag: ArgTag::Output,
                        granted: Access::Read,
                    },
                    ..
                }
            ))
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("tagged OUTPUT but the buffer grants READ"),
        "{e}"
    );
    // Input and output sharing bytes within one task.
    assert!(matches!(
        c.submit(Task::new("copy").input(&x).output(&x)),
        Err(Error::Submit(SubmitError::Rejected(
            strata_orchestrator_core::SubmitError {
                reason: SubmitReason::Aliased {
                    first: 0,
                    second: 1,
                    ..
                },
                ..
            }
        )))
    ));
}

#[test]
fn a_worker_that_does_not_exist_is_named() {
    let c = one();
    let ghost = WorkerId(7);
    assert!(matches!(
        c.worker_stats(ghost),
        Err(Error::Submit(SubmitError::NoWorker { worker })) if worker == ghost
    ));
    assert!(matches!(
        c.device_buffer(ghost, 64),
        Err(Error::Submit(SubmitError::NoWorker { worker })) if worker == ghost
    ));
    let x = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    assert!(matches!(
        c.submit(Task::new("copy").input(&x).output(&x).on(ghost)),
        Err(Error::Submit(SubmitError::UnknownPlacement { worker, workers: 1, .. })) if worker == ghost
    ));
}

#[test]
fn a_group_with_two_members_on_one_worker_names_the_later_member() {
    let c = Cluster::builder().in_process(2).start().unwrap();
    let view = || c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    let fill = |w: u32| {
        Task::new("fill")
            .output(&view())
            .scalar_f64(1.0)
            .on(WorkerId(w))
    };
    for (places, member) in [(vec![0, 0], 1), (vec![1, 0, 1], 2)] {
        let r = c.submit_group(places.iter().map(|&w| fill(w)).collect());
        assert!(
            matches!(
                &r,
                Err(Error::Submit(SubmitError::WorkerTaken { member: m, worker }))
                    if *m == member && *worker == WorkerId(places[member])
            ),
            "{places:?}: {r:?}"
        );
    }
    let g = c.submit_group(vec![fill(1), fill(0)]).unwrap();
    c.wait(g).unwrap();
}

#[test]
fn buffers_refuse_by_kind_and_range() {
    let c = one();
    let b = c.buffer(64).unwrap();
    let e = b.read_bytes(60, 8).unwrap_err();
    assert!(
        matches!(&e, Error::Buffer(BufferError::OutOfRange { bytes, nbytes: 64 }) if *bytes == (60..68)),
        "{e:?}"
    );
    assert!(matches!(
        c.read_device(&b, 0, 4),
        Err(Error::Buffer(BufferError::OnHost { .. }))
    ));
    assert!(matches!(
        c.buffer(0),
        Err(Error::Buffer(BufferError::Empty))
    ));
    let odd = c.buffer(6).unwrap();
    assert!(matches!(
        odd.to_vec::<f32>(),
        Err(Error::Buffer(BufferError::NotWhole { len: 6, size: 4 }))
    ));
    let d = c.device_buffer(WorkerId(0), 64).unwrap();
    assert!(matches!(
        d.read_bytes(0, 4),
        Err(Error::Buffer(BufferError::OnDevice {
            worker: WorkerId(0),
            ..
        }))
    ));
}

#[test]
fn cancel_and_scope_refusals_are_the_core_errors() {
    let c = one();
    let e = c.cancel(TaskHandle(TaskId(999))).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Submit(SubmitError::Cancel {
                task: TaskId(999),
                reason: CancelError::NotLive(_) | CancelError::Unknown(_),
            })
        ),
        "{e:?}"
    );
    let s = c.open_scope().unwrap();
    c.end_scope(s).unwrap();
    assert!(matches!(
        c.end_scope(s),
        Err(Error::Submit(SubmitError::Scope(ScopeError::AlreadyEnded(
            _
        ))))
    ));
    let b = c.buffer(8).unwrap();
    assert!(matches!(
        c.scope_buffer(s, &b),
        Err(Error::Submit(SubmitError::Scope(ScopeError::Ended(_))))
    ));
}

#[test]
fn a_cluster_without_workers_or_with_a_bad_address_does_not_start() {
    assert!(matches!(
        Cluster::builder().start(),
        Err(Error::Cluster(ClusterError::NoWorkers))
    ));
    assert!(matches!(
        Cluster::builder().connect("carrier-pigeon:42", None),
        Err(Error::Cluster(ClusterError::Address { address, .. })) if address == "carrier-pigeon:42"
    ));
}

#[test]
fn the_error_stays_small_enough_to_return_by_value() {
    // clippy's result_large_err fires at 128 bytes; a new payload that
    // grows the enum past it belongs in a Box.
    assert!(std::mem::size_of::<Error>() < 128);
}
