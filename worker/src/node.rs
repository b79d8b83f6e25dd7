//! The worker's shared state: its chip, its kernels, its imports and its
//! sessions.
//!
//! A session is one orchestrator connection. It owns the buffers it
//! imported and the device buffers it allocated; when it ends (its task
//! stream or its fd channel closes, or the worker shuts down) they are
//! released, and the worker keeps serving other sessions.
//!
//! An ended session's tasks never start: its gate is closed at once, and
//! the device checks it when a lane would start the task. What remains of
//! it is a tombstone ([`crate::tombstones`]) counting the tasks still
//! running, so that its client, back on a new connection, can learn when
//! none can write any more ([`Node::session_state`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use strata_chip::{Device, DeviceBlock, Registry, StartGate};
use strata_proto::convert::{InstanceId, SessionState};
use strata_wire::CanonicalIdentity;
use strata_worker_core::SessionId;
use tracing::info;

use crate::imports::{FdMapper, Imports};
use crate::tombstones::Tombstones;

/// A device buffer allocated for a session. Tasks that use it hold an
/// `Arc` while they run; the block is freed when the last holder lets go,
/// so a free or a session end never pulls memory from under a running
/// kernel.
#[derive(Debug)]
pub(crate) struct DeviceBuffer {
    device: Arc<dyn Device>,
    pub(crate) block: DeviceBlock,
}

impl DeviceBuffer {
    pub(crate) fn new(device: Arc<dyn Device>, block: DeviceBlock) -> Self {
        DeviceBuffer { device, block }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Run-region blocks go with the run, not one by one.
        if self.block.region == strata_chip::Region::Persistent {
            let _ = self.device.free(self.block.addr);
        }
    }
}

/// One orchestrator connection.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// Device buffers by identity (DEVICE_MALLOC).
    device_buffers: Mutex<HashMap<CanonicalIdentity, Arc<DeviceBuffer>>>,
    /// Whether a task stream is open.
    pub(crate) streaming: std::sync::atomic::AtomicBool,
    /// Closed when the session ends: every launch of the session carries
    /// it, so a task not yet started never starts after that.
    pub(crate) gate: StartGate,
    /// Tasks received and not yet completed.
    running: AtomicU64,
}

impl Session {
    pub(crate) fn device_buffers(
        &self,
    ) -> MutexGuard<'_, HashMap<CanonicalIdentity, Arc<DeviceBuffer>>> {
        self.device_buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a task from its receipt until the returned guard is dropped,
    /// which its completion closure does once the completion is produced
    /// (or, should the closure be dropped unrun, once nothing can run it).
    pub(crate) fn task_received(self: &Arc<Self>) -> RunningTask {
        self.running.fetch_add(1, Ordering::SeqCst);
        RunningTask {
            session: Arc::clone(self),
        }
    }

    /// Tasks received and not yet completed.
    pub(crate) fn running(&self) -> u64 {
        self.running.load(Ordering::SeqCst)
    }
}

/// One task of a session counted as running; see [`Session::task_received`].
#[derive(Debug)]
pub(crate) struct RunningTask {
    session: Arc<Session>,
}

impl Drop for RunningTask {
    fn drop(&mut self) {
        self.session.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counters beyond the device's own.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) succeeded: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) in_flight: AtomicU64,
}

/// Everything the service, the fd channel and task execution share.
pub(crate) struct Node {
    pub(crate) chip_id: u32,
    pub(crate) device: Arc<dyn Device>,
    pub(crate) kernels: Registry,
    imports: Imports,
    sessions: Mutex<HashMap<SessionId, Arc<Session>>>,
    /// Ended sessions; locked only while `sessions` is held, after it.
    tombstones: Mutex<Tombstones>,
    /// This process, for clients to tell it from a restarted one.
    pub(crate) instance: InstanceId,
    pub(crate) counters: Counters,
    pub(crate) started: Instant,
    pub(crate) fd_socket: Option<std::path::PathBuf>,
    pub(crate) max_message_bytes: usize,
    pub(crate) max_in_flight: usize,
    /// How long a session may go without opening its task stream.
    pub(crate) session_grace: std::time::Duration,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("chip_id", &self.chip_id)
            .field("imports", &self.imports.len())
            .finish()
    }
}

impl Node {
    pub(crate) fn new(
        chip_id: u32,
        device: Arc<dyn Device>,
        kernels: Registry,
        fd_socket: Option<std::path::PathBuf>,
        max_message_bytes: usize,
        max_in_flight: usize,
        session_grace: std::time::Duration,
    ) -> Self {
        Node {
            chip_id,
            device,
            kernels,
            imports: Imports::new(FdMapper),
            sessions: Mutex::new(HashMap::new()),
            tombstones: Mutex::new(Tombstones::default()),
            instance: InstanceId(rand::random::<u64>() | 1),
            counters: Counters::default(),
            started: Instant::now(),
            fd_socket,
            max_message_bytes,
            max_in_flight,
            session_grace,
        }
    }

    pub(crate) fn imports(&self) -> &Imports {
        &self.imports
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tombstones(&self) -> MutexGuard<'_, Tombstones> {
        self.tombstones.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a session with a fresh random id (never one a tombstone still
    /// holds, whose state its client may yet ask for).
    pub(crate) fn open_session(&self) -> SessionId {
        let mut sessions = self.sessions();
        loop {
            let id = SessionId(rand::random::<u64>() | 1);
            if self.tombstones().contains(id) {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(v) = sessions.entry(id) {
                v.insert(Arc::new(Session::default()));
                info!(session = %id, "session opened");
                return id;
            }
        }
    }

    /// What this worker knows of session `id`.
    pub(crate) fn session_state(&self, id: SessionId) -> SessionState {
        let sessions = self.sessions();
        let (session, ended) = match sessions.get(&id) {
            Some(s) => (Arc::clone(s), false),
            None => match self.tombstones().get(id, Instant::now()) {
                Some(s) => (s, true),
                None => return SessionState::UNKNOWN,
            },
        };
        SessionState {
            known: true,
            ended,
            running: u32::try_from(session.running()).unwrap_or(u32::MAX),
        }
    }

    pub(crate) fn session(&self, id: SessionId) -> Option<Arc<Session>> {
        self.sessions().get(&id).cloned()
    }

    pub(crate) fn has_session(&self, id: SessionId) -> bool {
        self.sessions().contains_key(&id)
    }

    pub(crate) fn session_count(&self) -> usize {
        self.sessions().len()
    }

    /// Ends a session: releases its imports (mappings go when their running
    /// tasks finish) and frees its device buffers. Idempotent.
    pub(crate) fn end_session(&self, id: SessionId, why: &str) {
        let session = {
            // The tombstone goes in under the sessions lock, so that no
            // `session_state` sees the session neither live nor ended.
            let mut sessions = self.sessions();
            let Some(session) = sessions.remove(&id) else {
                return;
            };
            session.gate.close(format!(
                "session {id} ended ({why}) before the task started"
            ));
            self.tombstones()
                .insert(id, Arc::clone(&session), Instant::now());
            session
        };
        let imports = self.imports.release_session(id);
        // Dropping the map's handles frees each block once no running task
        // holds it.
        let device_buffers = session.device_buffers().drain().count();
        let running = session.running();
        info!(session = %id, why, imports, device_buffers, running, "session ended");
    }

    /// Ends every session (shutdown).
    pub(crate) fn end_all_sessions(&self) {
        let ids: Vec<SessionId> = self.sessions().keys().copied().collect();
        for id in ids {
            self.end_session(id, "worker shutting down");
        }
    }

    pub(crate) fn tasks_in_flight(&self) -> u64 {
        self.counters.in_flight.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;
    use std::time::Duration;

    use strata_chip::kernel::KernelDescriptor;
    use strata_chip::{Kernel, KernelContext, SimDevice};
    use strata_proto::TaskId;
    use strata_proto::convert::{TaskCompletion, TaskOutcome, TaskRequest};
    use strata_wire::TaskArgs;

    use super::*;
    use crate::exec;

    /// Holds its lane until the test lets it go.
    struct Hold {
        desc: KernelDescriptor,
        started: Mutex<mpsc::Sender<()>>,
        release: Mutex<mpsc::Receiver<()>>,
    }

    impl Kernel for Hold {
        fn descriptor(&self) -> &KernelDescriptor {
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
        desc: KernelDescriptor,
        runs: Arc<AtomicUsize>,
    }

    impl Kernel for Count {
        fn descriptor(&self) -> &KernelDescriptor {
            &self.desc
        }
        fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn descriptor(name: &str) -> KernelDescriptor {
        KernelDescriptor {
            name: name.into(),
            version: 1,
            args: vec![],
            scalars: vec![],
        }
    }

    struct Fixture {
        node: Arc<Node>,
        hold: strata_chip::KernelHandle,
        count: strata_chip::KernelHandle,
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
        let node = Node::new(
            0,
            device,
            kernels,
            None,
            1 << 20,
            1024,
            Duration::from_secs(30),
        );
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
        callable: strata_chip::KernelHandle,
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
            TaskOutcome::Failure(cause) => cause,
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
        let id = f.node.open_session();
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
        let a = f.node.open_session();
        let b = f.node.open_session();
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
}
