//! Tests of a node's sessions across its modules: a session's end against
//! its queued and running tasks (execution), its tombstone, and its
//! imports.

use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::time::Duration;

use strata_chip_runtime::kernel::Signature;
use strata_chip_runtime::{Kernel, KernelContext, SimDevice};
use strata_proto::TaskId;
use strata_proto::convert::{TaskCompletion, TaskOutcome, TaskRequest};
use strata_wire::TaskArgs;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use strata_chip_runtime::Registry;
use strata_proto::convert::SessionState;
use strata_wire::CanonicalIdentity;
use strata_worker_core::SessionId;

use crate::exec;
use crate::node::{Limits, Node, Session};

/// Holds its lane until the test lets it go.
struct Hold {
    desc: Signature,
    started: Mutex<mpsc::Sender<()>>,
    release: Mutex<mpsc::Receiver<()>>,
}

impl Kernel for Hold {
    fn descriptor(&self) -> &Signature {
        &self.desc
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        let _ = self.started.lock().map_err(|e| e.to_string())?.send(());
        let rx = self.release.lock().map_err(|e| e.to_string())?;
        rx.recv().map_err(|e| e.to_string())
    }
}

/// Counts its runs: the proof that a task ran.
struct Count {
    desc: Signature,
    runs: Arc<AtomicUsize>,
}

impl Kernel for Count {
    fn descriptor(&self) -> &Signature {
        &self.desc
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn descriptor(name: &str) -> Signature {
    Signature {
        name: name.into(),
        version: 1,
        args: vec![],
        scalars: vec![],
    }
}

struct Fixture {
    node: Arc<Node>,
    hold: strata_chip_runtime::KernelHandle,
    count: strata_chip_runtime::KernelHandle,
    runs: Arc<AtomicUsize>,
    started: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
}

/// A node on a one-lane device with the two kernels above.
fn fixture() -> Fixture {
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut kernels = Registry::with_builtins();
    let hold = kernels
        .register(Arc::new(Hold {
            desc: descriptor("test.hold"),
            started: Mutex::new(started_tx),
            release: Mutex::new(release_rx),
        }))
        .unwrap();
    let count = kernels
        .register(Arc::new(Count {
            desc: descriptor("test.count"),
            runs: Arc::clone(&runs),
        }))
        .unwrap();
    let device = Arc::new(SimDevice::from_spec("sim:mem=1MiB,lanes=1").unwrap());
    let limits = Limits {
        max_message_bytes: 1 << 20,
        max_in_flight: 1024,
    };
    let node = Node::new(0, device, kernels, limits);
    Fixture {
        node: Arc::new(node),
        hold,
        count,
        runs,
        started,
        release,
    }
}

/// Runs task `id` of `session` as the service does: counted from
/// receipt until its completion is sent.
fn submit(
    f: &Fixture,
    session: &Arc<Session>,
    id: u64,
    callable: strata_chip_runtime::KernelHandle,
    out: &mpsc::Sender<TaskCompletion>,
) {
    let running = session.task_received();
    let out = out.clone();
    let req = TaskRequest {
        id: TaskId(id),
        callable,
        args: TaskArgs::new(vec![], vec![]).unwrap(),
        tags: vec![],
        inline: vec![],
        staged: Vec::new(),
        cache: Vec::new(),
        required_features: strata_proto::convert::Features::NONE,
        priority: 0,
    };
    exec::execute(
        &f.node,
        session,
        req,
        Box::new(move |c| {
            drop(running);
            let _ = out.send(c);
        }),
    );
}

fn cause(c: &TaskCompletion) -> &str {
    match &c.outcome {
        TaskOutcome::Failure(cause) => &cause.message,
        TaskOutcome::Resend(cause) => cause,
        TaskOutcome::Success => "",
    }
}

/// Ending a session while one task runs and three wait behind it on the
/// only lane: the running one finishes, the three never start (they
/// fail naming the session), a task arriving later fails without
/// reaching the device, and the tombstone counts them all down to 0.
#[test]
fn queued_tasks_of_an_ended_session_never_start() {
    let f = fixture();
    let id = f.node.open_session(f.node.capabilities);
    let session = f.node.session(id).unwrap();
    let (tx, rx) = mpsc::channel();
    submit(&f, &session, 1, f.hold, &tx);
    f.started.recv().unwrap();
    for t in 2..=4 {
        submit(&f, &session, t, f.count, &tx);
    }
    let live = f.node.session_state(id);
    assert_eq!((live.known, live.ended, live.running), (true, false, 4));

    f.node
        .end_session(id, "superseded by a new session of the same client");
    assert!(f.node.session(id).is_none());
    let ended = f.node.session_state(id);
    assert_eq!((ended.known, ended.ended, ended.running), (true, true, 4));
    let launched = f.node.device.stats().launched;
    submit(&f, &session, 5, f.count, &tx);
    let late = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(late.id, TaskId(5));
    assert_eq!(f.node.device.stats().launched, launched, "never launched");

    f.release.send(()).unwrap();
    let mut done: Vec<TaskCompletion> = (0..4)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    done.sort_by_key(|c| c.id);
    assert_eq!(done[0].outcome, TaskOutcome::Success);
    let want = format!(
        "not started: session {id} ended (superseded by a new session of the same client) before the task started"
    );
    for c in done[1..].iter().chain([&late]) {
        assert_eq!(cause(c), want, "task {}", c.id);
    }
    assert_eq!(f.runs.load(Ordering::SeqCst), 0, "a queued task ran");
    assert!(f.node.session_state(id).is_fenced());
    assert_eq!(f.node.tasks_in_flight(), 0);
}

/// A session that never existed is unknown; ending one twice is one
/// end; another session is not touched by it.
#[test]
fn unknown_sessions_and_other_sessions() {
    let f = fixture();
    assert_eq!(
        f.node.session_state(SessionId(12345)),
        SessionState::UNKNOWN
    );
    f.node.end_session(SessionId(12345), "never opened");
    assert_eq!(
        f.node.session_state(SessionId(12345)),
        SessionState::UNKNOWN
    );
    let a = f.node.open_session(f.node.capabilities);
    let b = f.node.open_session(f.node.capabilities);
    f.node.end_session(a, "first");
    f.node.end_session(a, "second");
    let sb = f.node.session(b).unwrap();
    assert!(!sb.gate.is_closed());
    let (tx, rx) = mpsc::channel();
    submit(&f, &sb, 1, f.count, &tx);
    let c = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(c.outcome, TaskOutcome::Success);
    assert_eq!(f.runs.load(Ordering::SeqCst), 1);
    let state = f.node.session_state(b);
    assert_eq!((state.known, state.ended, state.running), (true, false, 0));
    assert!(f.node.session_state(a).is_fenced());
    assert!(f.node.instance.0 != 0);
}

/// An fd that arrives for a session already ended (its fd channel
/// outlived its task stream) is refused and not kept: nothing could
/// name or release it again. A live session's import of the same
/// identity is its own.
#[test]
fn an_import_for_an_ended_session_is_not_kept() {
    let f = fixture();
    let sealed = || {
        let mfd = memfd::MemfdOptions::default()
            .allow_sealing(true)
            .create("late-import")
            .unwrap();
        mfd.as_file().set_len(64).unwrap();
        mfd.add_seals(&[memfd::FileSeal::SealShrink]).unwrap();
        std::os::fd::OwnedFd::from(mfd.into_file())
    };
    let identity = CanonicalIdentity::new([9; 8], 1, 1).unwrap();
    let (a, b) = (
        f.node.open_session(f.node.capabilities),
        f.node.open_session(f.node.capabilities),
    );
    f.node.end_session(a, "task stream closed");
    let err = f.node.import_one(a, identity, None, sealed()).unwrap_err();
    assert_eq!(err, format!("buffer {identity}: session {a} has ended"));
    assert_eq!(f.node.imports().len(), 0, "nothing kept for it");
    f.node.import_one(b, identity, None, sealed()).unwrap();
    assert_eq!(f.node.imports().session_len(b), 1);
    assert_eq!(f.node.release_imports(a, &[identity]), 0);
    assert_eq!(f.node.release_imports(b, &[identity]), 1);
}

mod caps;
