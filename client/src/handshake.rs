//! What a handshake tells the client about the worker and its session.

use std::path::PathBuf;

use strata_boundary::SessionId;
use strata_proto::convert::{CallableOffer, DataOffer, InstanceId, SessionState};
use strata_wire::KernelHandle;

/// What the handshake told us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// Our session.
    pub session: SessionId,
    /// The worker's chip.
    pub chip_id: u32,
    /// Device kind.
    pub device_kind: String,
    /// Canonical device spec.
    pub device_spec: String,
    /// Device memory in bytes.
    pub device_memory: u64,
    /// Lanes.
    pub lanes: u32,
    /// Callables, each checked: its handle is its signature's digest.
    pub callables: Vec<CallableOffer>,
    /// Fd side channel, for Unix workers.
    pub fd_socket: Option<PathBuf>,
    /// Whether the worker takes a shared-memory ring for the session's
    /// tasks ([`crate::FdChannel::attach_ring`]).
    pub ring: bool,
    /// Largest message the worker accepts.
    pub max_message_bytes: u64,
    /// The worker's data connection for this session, when it offers one
    /// ([`crate::DataConnection`]).
    pub data: Option<DataOffer>,
    /// The worker process: equal across two handshakes exactly when the
    /// same process answered both.
    pub instance: InstanceId,
    /// What the worker knew of the previous session named to
    /// [`WorkerClient::handshake_after`](crate::WorkerClient::handshake_after)
    /// (which that handshake ended if it was live); `None` when none was
    /// named.
    pub previous: Option<SessionState>,
}

impl Handshake {
    /// The handle of `name@version`, if the worker offers it.
    pub fn callable(&self, name: &str, version: u32) -> Option<KernelHandle> {
        self.callables
            .iter()
            .find(|c| c.name() == name && c.version() == version)
            .map(|c| c.handle)
    }
}
