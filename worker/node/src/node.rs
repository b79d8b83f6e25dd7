//! The worker's shared state: its chip, its kernels, its imports and its
//! sessions.
//!
//! A session is one orchestrator connection. It owns the buffers it
//! imported and the device buffers it allocated; when it ends (its task
//! stream or its fd channel closes, or the worker shuts down) they are
//! released, and the worker keeps serving other sessions.
//!
//! Run-region buffers live for one *run* of their session: `EndRun` (the
//! driver's `wait_all`) or the session's end retires them, and any later use
//! is refused naming the run that ended ([`Missing::RunEnded`]). One device
//! is shared by every session, so its run region cannot be reset when one
//! session's run ends: the [`RunRegion`] ledger counts the run buffers still
//! held — by a session's map or by a running task's lease — across all
//! sessions, and resets the region wholesale (`Device::end_run`) when the
//! count falls to zero. Allocation and reset are serialized by the ledger's
//! lock, so no run block is carved while the region is being reset, and no
//! reset happens while anyone holds a block.
//!
//! An ended session's tasks never start: its gate is closed at once, and
//! the device checks it when a lane would start the task. What remains of
//! it is a tombstone (`tombstones.rs`) counting the tasks still
//! running, so that its client, back on a new connection, can learn when
//! none can write any more ([`Node::session_state`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use strata_chip_runtime::{Device, DeviceBlock, Region, Registry, StartGate};
use strata_proto::convert::{
    BackendKinds, CallableOffer, Capabilities, Features, InstanceId, SessionState, WorkerFacts,
};
use strata_wire::BackendKind;
use strata_wire::CanonicalIdentity;
use strata_worker_core::SessionId;
use tracing::{info, warn};

use crate::imports::{FdMapper, Imports};
use crate::tombstones::{Running, Tombstones};

/// A device buffer allocated for a session. Tasks that use it hold an
/// `Arc` while they run; the block is freed when the last holder lets go,
/// so a free or a session end never pulls memory from under a running
/// kernel.
#[derive(Debug)]
pub(crate) struct DeviceBuffer {
    device: Arc<dyn Device>,
    pub(crate) block: DeviceBlock,
    /// For a run-region block, the ledger it counts in.
    run: Option<Arc<RunRegion>>,
}

impl DeviceBuffer {
    /// A persistent block.
    pub(crate) fn persistent(device: Arc<dyn Device>, block: DeviceBlock) -> Self {
        DeviceBuffer {
            device,
            block,
            run: None,
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        match &self.run {
            // Run-region blocks go with the run, not one by one: the last
            // holder to let go resets the region.
            Some(run) => run.release(),
            None => {
                let _ = self.device.free(self.block.addr);
            }
        }
    }
}

/// The device's run region as the worker shares it between sessions: how
/// many run buffers are still held, and the reset when none is.
#[derive(Debug)]
pub(crate) struct RunRegion {
    device: Arc<dyn Device>,
    /// Run buffers not yet dropped, over every session (held by a session's
    /// map until its run ends, and by the leases of running tasks).
    live: Mutex<u64>,
}

impl RunRegion {
    pub(crate) fn new(device: Arc<dyn Device>) -> Self {
        RunRegion {
            device,
            live: Mutex::new(0),
        }
    }

    fn live(&self) -> MutexGuard<'_, u64> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates a run block, counted until its buffer drops.
    ///
    /// # Errors
    /// The device's refusal (out of memory in the run region).
    pub(crate) fn alloc(
        self: &Arc<Self>,
        nbytes: u64,
    ) -> Result<DeviceBuffer, strata_chip_runtime::Error> {
        let mut live = self.live();
        let block = self.device.alloc(Region::Run, nbytes)?;
        *live += 1;
        Ok(DeviceBuffer {
            device: Arc::clone(&self.device),
            block,
            run: Some(Arc::clone(self)),
        })
    }

    /// One run buffer fewer; the last one resets the region. Called from
    /// whichever thread drops the last holder — a kernel's completion on a
    /// lane included, which is why `end_run` must not wait for lanes.
    fn release(&self) {
        let mut live = self.live();
        *live = live.saturating_sub(1);
        if *live == 0 {
            match self.device.end_run() {
                Ok(()) => info!("run region reset: no run buffer is held"),
                Err(e) => warn!(error = %e, "run region reset failed"),
            }
        }
    }

    /// Whether no run buffer is held (the region is reset).
    pub(crate) fn is_idle(&self) -> bool {
        *self.live() == 0
    }
}

/// Identities of retired run buffers a session remembers, to say why a
/// later use is refused; past this, the oldest are forgotten (and a use of
/// one is refused as "not allocated").
const MAX_RETIRED: usize = 4096;

/// Why a session has no live device buffer for an identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Never allocated by this session (perhaps by another), or freed.
    NotAllocated,
    /// A run-region buffer of run `run` of this session, which ended.
    RunEnded {
        /// The session's run it belonged to.
        run: u64,
    },
}

impl Missing {
    /// What to tell the caller about `identity`.
    pub(crate) fn describe(self, identity: &CanonicalIdentity) -> String {
        match self {
            Missing::NotAllocated => format!(
                "device buffer {identity} was not allocated by this session (or it was freed)"
            ),
            Missing::RunEnded { run } => format!(
                "device buffer {identity} was a run-region buffer of run {run} of this session, which has ended: its device memory went with the run (allocate a new one in the current run)"
            ),
        }
    }
}

/// A session's runs: the current run number and the run buffers retired.
#[derive(Debug, Default)]
struct Runs {
    current: u64,
    retired: HashMap<CanonicalIdentity, u64>,
    order: VecDeque<CanonicalIdentity>,
}

/// One orchestrator connection.
#[derive(Debug, Default)]
pub struct Session {
    /// The session's id: what it names in the import registry, where it
    /// finds only its own imports.
    pub id: SessionId,
    /// Device buffers by identity (DEVICE_MALLOC): the session's own, the
    /// only ones its tasks and calls can name.
    device_buffers: Mutex<HashMap<CanonicalIdentity, Arc<DeviceBuffer>>>,
    runs: Mutex<Runs>,
    /// Whether a task stream is open.
    pub streaming: std::sync::atomic::AtomicBool,
    /// Why fds this session sent were refused on arrival, by identity, so
    /// that a task naming one fails with that reason instead of a bare
    /// "not imported". At most [`MAX_REMEMBERED_REFUSALS`]: past that a
    /// client that keeps sending refused fds gets the bare message.
    refusals: Mutex<HashMap<CanonicalIdentity, String>>,
    /// Closed when the session ends: every launch of the session carries
    /// it, so a task not yet started never starts after that.
    pub(crate) gate: StartGate,
    /// Tasks received and not yet completed.
    running: AtomicU64,
    /// Set when the session ends, whoever ends it: the task stream's
    /// reader watches it, so that a session the worker ends (its ring was
    /// unusable, its fd channel closed) also ends the driver's lifeline.
    ended: tokio::sync::watch::Sender<bool>,
    /// The session's shared-memory ring, once the driver sent one: closed
    /// when the session ends, which ends its threads.
    ring: Mutex<Option<Arc<dyn strata_ring::Memory>>>,
    /// Bytes staged ahead of tasks and held for the driver to fetch
    /// (remote workers: views larger than one message).
    pub held: Arc<crate::staging::Held>,
    /// What a data connection presents to prove it belongs to this
    /// session (random, drawn when it opens, sent only in its handshake's
    /// reply).
    pub data_secret: [u8; strata_proto::bulk::SECRET_BYTES],
    /// Data connections open on this session.
    pub data_connections: std::sync::atomic::AtomicUsize,
    /// What its handshake said its tasks may use: a task that needs more
    /// is refused ([`FailureKind::Unsupported`](strata_proto::convert::FailureKind::Unsupported)).
    pub capabilities: Capabilities,
}

/// How many refusal reasons one session keeps.
const MAX_REMEMBERED_REFUSALS: usize = 1024;

impl Session {
    /// Takes `ring` as the session's, to be closed when the session ends
    /// (which ends the threads that serve it); false if it has one already.
    pub fn set_ring(&self, ring: Arc<dyn strata_ring::Memory>) -> bool {
        let mut slot = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return false;
        }
        *slot = Some(ring);
        true
    }

    /// Fires once the session has ended.
    pub fn ended(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ended.subscribe()
    }

    fn close_ring(&self) {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(ring) = ring {
            strata_ring::close(&*ring);
        }
    }

    pub(crate) fn device_buffers(
        &self,
    ) -> MutexGuard<'_, HashMap<CanonicalIdentity, Arc<DeviceBuffer>>> {
        self.device_buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn refusals(&self) -> MutexGuard<'_, HashMap<CanonicalIdentity, String>> {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records why the fd sent for `identity` was refused.
    pub(crate) fn remember_refusal(&self, identity: CanonicalIdentity, reason: String) {
        let mut refusals = self.refusals();
        if refusals.len() < MAX_REMEMBERED_REFUSALS || refusals.contains_key(&identity) {
            refusals.insert(identity, reason);
        }
    }

    /// Forgets a refusal: a later fd for `identity` was accepted.
    pub(crate) fn forget_refusal(&self, identity: &CanonicalIdentity) {
        self.refusals().remove(identity);
    }

    /// Why the fd sent for `identity` was refused, if it was.
    pub(crate) fn refusal(&self, identity: &CanonicalIdentity) -> Option<String> {
        self.refusals().get(identity).cloned()
    }

    fn runs(&self) -> MutexGuard<'_, Runs> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live device buffer of `identity`, or why there is none.
    pub(crate) fn device_buffer(
        &self,
        identity: &CanonicalIdentity,
    ) -> Result<Arc<DeviceBuffer>, Missing> {
        // The map's lock is held while the retired set is read (lock order:
        // map, then runs, as in `end_run`), so a buffer being retired is
        // seen in one place or the other, never in neither.
        let map = self.device_buffers();
        if let Some(b) = map.get(identity) {
            return Ok(Arc::clone(b));
        }
        match self.runs().retired.get(identity) {
            Some(&run) => Err(Missing::RunEnded { run }),
            None => Err(Missing::NotAllocated),
        }
    }

    /// Ends the session's current run: takes its run buffers out of the
    /// map (the caller drops them, outside the map's lock) and remembers
    /// their identities. Returns them and the new run number.
    pub(crate) fn end_run(&self) -> (Vec<Arc<DeviceBuffer>>, u64) {
        let mut map = self.device_buffers();
        let ids: Vec<CanonicalIdentity> = map
            .iter()
            .filter(|(_, b)| b.block.region == Region::Run)
            .map(|(id, _)| *id)
            .collect();
        let taken: Vec<Arc<DeviceBuffer>> = ids.iter().filter_map(|id| map.remove(id)).collect();
        let mut runs = self.runs();
        let ended = runs.current;
        for id in ids {
            if runs.retired.insert(id, ended).is_none() {
                runs.order.push_back(id);
            }
        }
        while runs.order.len() > MAX_RETIRED {
            if let Some(old) = runs.order.pop_front() {
                runs.retired.remove(&old);
            }
        }
        runs.current += 1;
        (taken, runs.current)
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

impl Running for Arc<Session> {
    fn running(&self) -> u64 {
        Session::running(self)
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

/// Default for [`Limits::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 65_536;

/// What a node allows each session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest message a call may carry or answer with (a device read
    /// larger than this is refused); `usize::MAX` where nothing is encoded.
    pub max_message_bytes: usize,
    /// Tasks of one session received and not yet completed, past which the
    /// session's intake waits (backpressure on whoever sends them).
    pub max_in_flight: usize,
}

impl Default for Limits {
    /// No message limit (an in-process caller's), and
    /// [`DEFAULT_MAX_IN_FLIGHT`].
    fn default() -> Self {
        Limits {
            max_message_bytes: usize::MAX,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

/// One chip's worker node: everything its sessions, its imports and task
/// execution share. Whatever serves it (the worker process's gRPC service,
/// fd channel, ring and data connections, or an [`crate::InProcessWorker`])
/// holds it in an `Arc` and calls it.
pub struct Node {
    /// The chip's number, as handshakes report it.
    pub chip_id: u32,
    /// The chip.
    pub device: Arc<dyn Device>,
    /// The run region's ledger, shared by every session.
    pub(crate) run_region: Arc<RunRegion>,
    /// The callables the chip runs.
    pub kernels: Registry,
    imports: Imports,
    sessions: Mutex<HashMap<SessionId, Arc<Session>>>,
    /// Ended sessions; locked only while `sessions` is held, after it.
    tombstones: Mutex<Tombstones<Arc<Session>>>,
    /// This process, for clients to tell it from a restarted one.
    pub instance: InstanceId,
    pub(crate) counters: Counters,
    /// When the node started (health beats report the uptime).
    pub started: Instant,
    /// What each session may do.
    pub limits: Limits,
    /// What tasks on this node may use, as the chip and the import
    /// registry have it (a session may be offered less: one without an fd
    /// channel imports nothing).
    pub capabilities: Capabilities,
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
    /// What this node is, as its handshakes report it: its capabilities
    /// are the node's own (what a session reached by calls, or over a Unix
    /// socket with its fd channel, may use).
    pub fn facts(&self) -> WorkerFacts {
        let info = self.device.info();
        WorkerFacts {
            chip_id: self.chip_id,
            device_kind: info.kind,
            device_spec: info.spec,
            device_memory: info.memory,
            lanes: u32::try_from(info.lanes).unwrap_or(u32::MAX),
            callables: self.offers(),
            no_body: self.no_body(),
            capabilities: self.capabilities,
            required_features: Features::NONE,
            instance: self.instance,
        }
    }

    /// What tasks on a node over `device` may use: the kinds the import
    /// registry maps ([`crate::imports::IMPORTED_KINDS`]) and its own
    /// device buffers (DEVICE_MALLOC, by identity), the dtypes the chip
    /// computes on, bytes that travel with a task, and the device cache
    /// when the chip keeps one.
    fn capabilities_of(device: &dyn Device) -> Capabilities {
        let info = device.info();
        let mut features = Features::HOST_BYTES;
        if info.caches {
            features = features | Features::DEVICE_CACHE;
        }
        Capabilities {
            backends: BackendKinds::of(crate::imports::IMPORTED_KINDS)
                .with(BackendKind::DeviceMalloc),
            dtypes: info.dtypes,
            features,
        }
    }

    /// The callables this node offers (the registered kernels its chip
    /// runs), sorted by name and version.
    fn offers(&self) -> Vec<CallableOffer> {
        let mut offers: Vec<CallableOffer> = self
            .kernels
            .descriptors()
            .filter(|d| self.chip_runs(d))
            .map(|d| CallableOffer::of(d.clone()))
            .collect();
        offers.sort_by(|a, b| (a.name(), a.version()).cmp(&(b.name(), b.version())));
        offers
    }

    /// `name@version` of the registered kernels its chip has no body
    /// for, sorted by name and version: not offered, but named.
    fn no_body(&self) -> Vec<String> {
        let mut missing: Vec<(&str, u32)> = self
            .kernels
            .descriptors()
            .filter(|d| !self.chip_runs(d))
            .map(|d| (d.name.as_str(), d.version))
            .collect();
        missing.sort_unstable();
        missing
            .into_iter()
            .map(|(name, version)| format!("{name}@{version}"))
            .collect()
    }

    /// Whether the chip runs the kernel `d` describes.
    fn chip_runs(&self, d: &strata_chip_runtime::Signature) -> bool {
        self.kernels
            .get(d.handle())
            .is_ok_and(|k| self.device.runs(k.as_ref()))
    }

    /// A node for chip `chip_id` on `device`, running `kernels`.
    pub fn new(chip_id: u32, device: Arc<dyn Device>, kernels: Registry, limits: Limits) -> Self {
        Node {
            chip_id,
            capabilities: Node::capabilities_of(device.as_ref()),
            run_region: Arc::new(RunRegion::new(Arc::clone(&device))),
            device,
            kernels,
            imports: Imports::new(FdMapper),
            sessions: Mutex::new(HashMap::new()),
            tombstones: Mutex::new(Tombstones::default()),
            instance: InstanceId(rand::random::<u64>() | 1),
            counters: Counters::default(),
            started: Instant::now(),
            limits,
        }
    }

    pub(crate) fn imports(&self) -> &Imports {
        &self.imports
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tombstones(&self) -> MutexGuard<'_, Tombstones<Arc<Session>>> {
        self.tombstones.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a session with a fresh random id (never one a tombstone still
    /// holds, whose state its client may yet ask for), whose tasks may use
    /// `capabilities` (what its handshake said: at most the node's own).
    pub fn open_session(&self, capabilities: Capabilities) -> SessionId {
        let mut sessions = self.sessions();
        loop {
            let id = SessionId(rand::random::<u64>() | 1);
            if self.tombstones().contains(id) {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(v) = sessions.entry(id) {
                v.insert(Arc::new(Session {
                    id,
                    data_secret: rand::random(),
                    capabilities,
                    ..Session::default()
                }));
                info!(session = %id, "session opened");
                return id;
            }
        }
    }

    /// What this worker knows of session `id`.
    pub fn session_state(&self, id: SessionId) -> SessionState {
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

    /// Live session `id`.
    pub fn session(&self, id: SessionId) -> Option<Arc<Session>> {
        self.sessions().get(&id).cloned()
    }

    /// Whether session `id` is live.
    pub fn has_session(&self, id: SessionId) -> bool {
        self.sessions().contains_key(&id)
    }

    pub(crate) fn session_count(&self) -> usize {
        self.sessions().len()
    }

    /// Ends a session: releases its imports (mappings go when their running
    /// tasks finish), frees its device buffers and retires its run buffers
    /// (the run region resets once no one else holds any). Idempotent.
    pub fn end_session(&self, id: SessionId, why: &str) {
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
        session.close_ring();
        session.held.clear();
        session.ended.send_replace(true);
        let imports = self.imports.release_session(id);
        // Its copies on the chip, dirty ones included, are dropped unwritten:
        // its driver treats what was never flushed as lost.
        let copies = self.device.drop_copies(id.0, None);
        // Dropping the map's handles frees each block once no running task
        // holds it.
        let device_buffers = session.device_buffers().drain().count();
        let running = session.running();
        info!(session = %id, why, imports, copies, device_buffers, running, "session ended");
    }

    /// Ends every session (shutdown).
    pub fn end_all_sessions(&self) {
        let ids: Vec<SessionId> = self.sessions().keys().copied().collect();
        for id in ids {
            self.end_session(id, "worker shutting down");
        }
    }

    /// Tasks running on the chip or waiting for a lane, over every session.
    pub fn tasks_in_flight(&self) -> u64 {
        self.counters.in_flight.load(Ordering::Relaxed)
    }
}
