//! The worker's shared state: its chip, its kernels, its imports and its
//! sessions.
//!
//! A session is one orchestrator connection. It owns the buffers it
//! imported and the device buffers it allocated; when it ends (its task
//! stream or its fd channel closes, or the worker shuts down) they are
//! released, and the worker keeps serving other sessions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use strata_chip::{Device, DeviceBlock, Registry};
use strata_wire::CanonicalIdentity;
use strata_worker_core::SessionId;
use tracing::info;

use crate::imports::{FdMapper, Imports};

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
    /// Why fds this session sent were refused on arrival, by identity, so
    /// that a task naming one fails with that reason instead of a bare
    /// "not imported". At most [`MAX_REMEMBERED_REFUSALS`]: past that a
    /// client that keeps sending refused fds gets the bare message.
    refusals: Mutex<HashMap<CanonicalIdentity, String>>,
}

/// How many refusal reasons one session keeps.
const MAX_REMEMBERED_REFUSALS: usize = 1024;

impl Session {
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

    /// Opens a session with a fresh random id.
    pub(crate) fn open_session(&self) -> SessionId {
        let mut sessions = self.sessions();
        loop {
            let id = SessionId(rand::random::<u64>() | 1);
            if let std::collections::hash_map::Entry::Vacant(v) = sessions.entry(id) {
                v.insert(Arc::new(Session::default()));
                info!(session = %id, "session opened");
                return id;
            }
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
        let Some(session) = self.sessions().remove(&id) else {
            return;
        };
        let imports = self.imports.release_session(id);
        // Dropping the map's handles frees each block once no running task
        // holds it.
        let device_buffers = session.device_buffers().drain().count();
        info!(session = %id, why, imports, device_buffers, "session ended");
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
