//! What a node says its tasks may use, and the refusals of tasks that
//! need more: a required feature it does not know or did not offer the
//! session, a kind of buffer the session does not take, a dtype the chip
//! does not compute on. Each is refused unrun, as
//! [`FailureKind::Unsupported`], and the node serves on.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use strata_chip_runtime::{Registry, SimDevice};
use strata_proto::TaskId;
use strata_proto::convert::{
    BackendKinds, Capabilities, DTypeSet, FailureKind, Features, TaskCompletion, TaskOutcome,
    TaskRequest,
};
use strata_wire::{
    Access, AddressSpace, ArgTag, BackendKind, Backing, BufferDescriptor, CanonicalIdentity, DType,
    TaskArgs, Tensor,
};

use super::{cause, fixture, submit};
use crate::exec;
use crate::node::{Limits, Node, Session};

/// Runs `req` on `session` and waits for its completion.
fn run(node: &Arc<Node>, session: &Arc<Session>, req: TaskRequest) -> TaskCompletion {
    let (tx, rx) = mpsc::channel();
    exec::execute(
        node,
        session,
        req,
        Box::new(move |c| {
            let _ = tx.send(c);
        }),
    );
    rx.recv_timeout(Duration::from_secs(5)).unwrap()
}

fn unsupported(c: &TaskCompletion, needle: &str) {
    match &c.outcome {
        TaskOutcome::Failure(f) => {
            assert_eq!(f.kind, FailureKind::Unsupported, "{f}");
            assert!(f.message.contains(needle), "{f:?} lacks {needle:?}");
        }
        other => panic!("expected an unsupported task, got {other:?}"),
    }
}

#[test]
fn a_node_states_what_its_chip_and_registry_take() {
    let node = |spec: &str| {
        let device = Arc::new(SimDevice::from_spec(spec).unwrap());
        Node::new(0, device, Registry::with_builtins(), Limits::default())
    };
    let staged = node("sim:mem=1MiB");
    assert_eq!(
        staged.capabilities,
        Capabilities {
            backends: BackendKinds::of([
                BackendKind::Memfd,
                BackendKind::PosixShm,
                BackendKind::DeviceMalloc
            ]),
            dtypes: DTypeSet::ALL,
            features: Features::HOST_BYTES | Features::DEVICE_CACHE,
        }
    );
    let unified = node("sim:mem=1MiB,mode=unified,dtypes=F32|I32");
    assert_eq!(
        unified.capabilities.dtypes,
        DTypeSet::of([DType::F32, DType::I32])
    );
    assert_eq!(unified.capabilities.features, Features::HOST_BYTES);
    // The facts a handshake or an in-process worker reports carry them,
    // and require nothing of a driver.
    let facts = unified.facts();
    assert_eq!(facts.capabilities, unified.capabilities);
    assert_eq!(facts.required_features, Features::NONE);
}

/// A task requiring a bit this build does not know, or a known feature
/// the session was not offered, is refused before its callable is even
/// looked up; the session then runs the next task.
#[test]
fn a_task_requiring_what_the_session_lacks_is_refused_unrun() {
    let f = fixture();
    let without_cache = Capabilities {
        features: f
            .node
            .capabilities
            .features
            .difference(Features::DEVICE_CACHE),
        ..f.node.capabilities
    };
    let id = f.node.open_session(without_cache);
    let session = f.node.session(id).unwrap();
    let task = |id: u64, required: Features| TaskRequest {
        id: TaskId(id),
        callable: f.count,
        args: TaskArgs::new(vec![], vec![]).unwrap(),
        tags: vec![],
        inline: vec![],
        staged: Vec::new(),
        cache: Vec::new(),
        required_features: required,
        priority: 0,
    };
    let unknown = run(
        &f.node,
        &session,
        task(1, Features::RING | Features::from_bits(1 << 40)),
    );
    unsupported(
        &unknown,
        "the task requires features this worker does not know: bit 40 (required_features 0x10000000001)",
    );
    let unoffered = run(&f.node, &session, task(2, Features::DEVICE_CACHE));
    unsupported(
        &unoffered,
        "the task requires DEVICE_CACHE, which this worker does not offer this session (it offers HOST_BYTES)",
    );
    assert_eq!(f.runs.load(Ordering::SeqCst), 0, "neither ran");
    let fine = run(&f.node, &session, task(3, Features::HOST_BYTES));
    assert_eq!(fine.outcome, TaskOutcome::Success);
    // The plain path counts from receipt, as the service does.
    let (tx, rx) = mpsc::channel();
    submit(&f, &session, 4, f.count, &tx);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap().outcome,
        TaskOutcome::Success
    );
    assert_eq!(f.runs.load(Ordering::SeqCst), 2);
}

fn descriptor(space: AddressSpace, backing: Backing) -> BufferDescriptor {
    BufferDescriptor::new(
        CanonicalIdentity::new([3; 8], 1, 1).unwrap(),
        64,
        space,
        Access::ReadWrite,
        backing,
    )
    .unwrap()
}

/// A DEVICE argument that is not DEVICE_MALLOC, and a HOST argument
/// without its bytes in a session that imports nothing (a TCP session),
/// are kinds the session does not take; the same HOST argument with its
/// bytes runs, whatever its kind.
#[test]
fn a_kind_of_buffer_the_session_does_not_take_is_refused() {
    let f = fixture();
    let fill = f.node.kernels.find("fill", 1).unwrap();
    let tcp_like = Capabilities {
        backends: BackendKinds::of([BackendKind::DeviceMalloc]),
        ..f.node.capabilities
    };
    let id = f.node.open_session(tcp_like);
    let session = f.node.session(id).unwrap();
    let addr = NonZeroU64::new(0x40).unwrap();
    let task = |id: u64, buffer: BufferDescriptor, bytes: Option<Bytes>| TaskRequest {
        id: TaskId(id),
        callable: fill,
        args: TaskArgs::new(
            vec![Tensor::new(buffer, 0, &[16], &[1], DType::F32).unwrap()],
            vec![1f64.to_bits()],
        )
        .unwrap(),
        tags: vec![ArgTag::Output],
        inline: vec![bytes],
        staged: Vec::new(),
        cache: Vec::new(),
        required_features: Features::NONE,
        priority: 0,
    };
    let window = descriptor(AddressSpace::Device, Backing::VmmWindow { addr });
    unsupported(
        &run(&f.node, &session, task(1, window, None)),
        "argument 0: this worker does not take VMM_WINDOW buffers in this session (it takes DEVICE_MALLOC; a HOST buffer's bytes may travel with its task instead)",
    );
    let memfd = descriptor(
        AddressSpace::Host,
        Backing::Memfd {
            st_dev: 1,
            st_ino: 2,
        },
    );
    unsupported(
        &run(&f.node, &session, task(2, memfd, None)),
        "argument 0: this worker does not take MEMFD buffers in this session",
    );
    let with_bytes = run(&f.node, &session, task(3, memfd, Some(Bytes::new())));
    assert_eq!(
        with_bytes.outcome,
        TaskOutcome::Success,
        "{}",
        cause(&with_bytes)
    );
    // A session that imports MEMFD is told the buffer was not imported,
    // as before: its kind is one it takes.
    let unix = f.node.open_session(f.node.capabilities);
    let unix = f.node.session(unix).unwrap();
    let c = run(&f.node, &unix, task(4, memfd, None));
    match &c.outcome {
        TaskOutcome::Failure(cause) => {
            assert_eq!(cause.kind, FailureKind::ImportRefused, "{cause}");
            assert!(
                cause.message.contains("was not imported by this session"),
                "{cause}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A chip with fewer dtypes refuses a launch on another one, naming the
/// argument and what it supports.
#[test]
fn a_dtype_the_chip_lacks_is_refused_at_launch() {
    let device = Arc::new(SimDevice::from_spec("sim:mem=1MiB,dtypes=F32").unwrap());
    let node = Arc::new(Node::new(
        0,
        device,
        Registry::with_builtins(),
        Limits::default(),
    ));
    let fill = node.kernels.find("fill", 1).unwrap();
    let id = node.open_session(node.capabilities);
    let session = node.session(id).unwrap();
    let host = descriptor(
        AddressSpace::Host,
        Backing::Memfd {
            st_dev: 1,
            st_ino: 2,
        },
    );
    let task = |id: u64, dtype: DType| TaskRequest {
        id: TaskId(id),
        callable: fill,
        args: TaskArgs::new(
            vec![Tensor::new(host, 0, &[8], &[1], dtype).unwrap()],
            vec![1f64.to_bits()],
        )
        .unwrap(),
        tags: vec![ArgTag::Output],
        inline: vec![Some(Bytes::new())],
        staged: Vec::new(),
        cache: Vec::new(),
        required_features: Features::NONE,
        priority: 0,
    };
    unsupported(
        &run(&node, &session, task(1, DType::F64)),
        "kernel fill@1: argument 0: this chip does not support dtype F64 (it supports F32)",
    );
    let ok = run(&node, &session, task(2, DType::F32));
    assert_eq!(ok.outcome, TaskOutcome::Success, "{}", cause(&ok));
}
