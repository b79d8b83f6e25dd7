//! What workers can take decides where tasks go, and a task no worker it
//! may go to can take is refused when it is submitted, naming the
//! argument, what it needs and the workers without it; the owner path ids
//! of device buffers' descriptors and the errors that show them.

use strata_orchestrator_core::WorkerId;
use strata_wire::{BackendKind, DType};

use crate::error::{Lack, Need, SubmitError};
use crate::{BackendKinds, Capabilities, Cluster, DTypeSet, Error, Features, Task};

fn cluster(n: usize, device: &str) -> Cluster {
    Cluster::builder()
        .in_process(n)
        .device(device)
        .start()
        .unwrap()
}

fn incapable(e: &Error) -> (&Option<String>, &[Lack]) {
    match e {
        Error::Submit(SubmitError::Incapable { placed, lacks, .. }) => (placed, lacks),
        other => panic!("expected Incapable, got {other:?}"),
    }
}

#[test]
fn workers_say_what_their_tasks_may_use() {
    let c = cluster(2, "sim:mem=64MiB,mode=unified,dtypes=F32|F64");
    for (i, w) in c.workers().iter().enumerate() {
        assert_eq!(
            w.capabilities,
            Capabilities {
                backends: BackendKinds::of([
                    BackendKind::DeviceMalloc,
                    BackendKind::Memfd,
                    BackendKind::PosixShm
                ]),
                dtypes: DTypeSet::of([DType::F32, DType::F64]),
                features: Features::HOST_BYTES,
            }
        );
        assert_eq!(w.path_id as usize, i + 1);
    }
}

/// A dtype no worker's chip has: refused at submit, each argument named
/// with every worker that lacks it; nothing is queued. Pinned to a
/// worker, the refusal names that worker alone.
#[test]
fn a_dtype_no_worker_has_is_refused_at_submit() {
    let c = cluster(2, "sim:mem=64MiB,dtypes=F32|I32");
    let x = c.buffer(64).unwrap().tensor(&[8], DType::F64).unwrap();
    let y = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    let e = c
        .submit(Task::new("copy").input(&x).output(&y))
        .unwrap_err();
    let (placed, lacks) = incapable(&e);
    assert_eq!(placed, &None);
    assert_eq!(
        lacks,
        [Lack {
            arg: Some(0),
            need: Need::DType(DType::F64),
            workers: vec![
                (WorkerId(0), "in-process:0".into()),
                (WorkerId(1), "in-process:1".into())
            ],
        }]
    );
    assert_eq!(
        e.to_string(),
        "submit: member 0: copy@1: no worker that offers it can take it: argument 0 needs dtype F64, which worker 0 (in-process:0) and worker 1 (in-process:1) lack"
    );
    let pinned = c
        .submit(Task::new("copy").input(&y).output(&x).on(WorkerId(1)))
        .unwrap_err();
    assert_eq!(
        pinned.to_string(),
        "submit: member 0: copy@1: placed on worker 1 (in-process:1), which cannot take it: argument 1 needs dtype F64, which worker 1 (in-process:1) lacks"
    );
    // Nothing was queued: the run is empty, and a task it can take runs.
    let z = c.buffer(64).unwrap().tensor(&[16], DType::F32).unwrap();
    c.submit(Task::new("copy").input(&y).output(&z)).unwrap();
    assert_eq!(c.wait_all().unwrap().submitted, 1);
}

/// A feature the task requires decides where it may go: a worker without
/// a device cache cannot take a task that requires one, and a bit no one
/// knows is refused naming the bit.
#[test]
fn a_required_feature_is_checked_at_submit() {
    let unified = cluster(1, "sim:mem=64MiB,mode=unified");
    let x = unified
        .buffer(64)
        .unwrap()
        .tensor(&[16], DType::F32)
        .unwrap();
    let y = unified
        .buffer(64)
        .unwrap()
        .tensor(&[16], DType::F32)
        .unwrap();
    let task = || Task::new("copy").input(&x).output(&y);
    let e = unified
        .submit(task().require(Features::DEVICE_CACHE))
        .unwrap_err();
    assert!(
        e.to_string().ends_with(
            "the task requires feature DEVICE_CACHE, which worker 0 (in-process:0) lacks"
        ),
        "{e}"
    );
    let e = unified
        .submit(task().require(Features::from_bits(1 << 40)))
        .unwrap_err();
    let (_, lacks) = incapable(&e);
    assert_eq!(lacks.len(), 1);
    assert_eq!(lacks[0].need, Need::Feature(Features::from_bits(1 << 40)));
    assert!(
        e.to_string().contains("the task requires feature bit 40"),
        "{e}"
    );
    unified
        .submit(task().require(Features::HOST_BYTES))
        .unwrap();
    unified.wait_all().unwrap();

    let staged = cluster(1, "sim:mem=64MiB");
    let x = staged.buffer_from_slice(&[2.0f32; 16]).unwrap();
    let x = x.tensor(&[16], DType::F32).unwrap();
    let y = staged
        .buffer(64)
        .unwrap()
        .tensor(&[16], DType::F32)
        .unwrap();
    staged
        .submit(
            Task::new("copy")
                .input(&x)
                .output(&y)
                .require(Features::DEVICE_CACHE),
        )
        .unwrap();
    staged.wait_all().unwrap();
    assert_eq!(y.read::<f32>().unwrap(), vec![2.0; 16]);
}

/// A device buffer's descriptor carries its worker's path id (a host
/// buffer's carries none), and the errors that name a buffer's owner show
/// it as `<path#N>`.
#[test]
fn device_buffers_carry_their_owners_path_id() {
    let c = cluster(2, "sim:mem=64MiB");
    let host = c.buffer(64).unwrap();
    assert_eq!(host.descriptor().owner_worker_path_id(), 0);
    let d0 = c.device_buffer(WorkerId(0), 64).unwrap();
    let d1 = c.device_buffer(WorkerId(1), 64).unwrap();
    assert_eq!(d0.descriptor().owner_worker_path_id(), 1);
    assert_eq!(d1.descriptor().owner_worker_path_id(), 2);
    let e = d1.read_bytes(0, 4).unwrap_err();
    assert!(
        e.to_string()
            .contains("lives on worker 1's device (in-process:1 <path#2>)"),
        "{e}"
    );
    let a = d0.tensor(&[16], DType::F32).unwrap();
    let b = d1.tensor(&[16], DType::F32).unwrap();
    let e = c
        .submit(Task::new("copy").input(&a).output(&b))
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "argument 0 lives on worker 0's device (in-process:0 <path#1>) and argument 1 on worker 1's (in-process:1 <path#2>)"
        ),
        "{e}"
    );
    let e = c
        .submit(Task::new("copy").input(&a).output(&a).on(WorkerId(1)))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("but argument 1 lives on worker 0's device (in-process:0 <path#1>)"),
        "{e}"
    );
    // The worker finds it by identity: the path id routes nothing.
    let h = c.buffer_from_slice(&[5.0f32; 16]).unwrap();
    let h = h.tensor(&[16], DType::F32).unwrap();
    c.submit(Task::new("copy").input(&h).output(&a)).unwrap();
    c.wait_all().unwrap();
    let bytes = c.read_device(&d0, 0, 64).unwrap();
    assert_eq!(&bytes[..4], &5.0f32.to_le_bytes());
}
