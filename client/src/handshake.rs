//! What a handshake tells the client about the worker and its session.

use std::path::PathBuf;

use strata_boundary::SessionId;
use strata_proto::convert::{DataOffer, Features, SessionState, WorkerFacts};
use strata_wire::KernelHandle;

/// What the handshake told us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// Our session.
    pub session: SessionId,
    /// What the worker is: chip, device, callables, process.
    pub worker: WorkerFacts,
    /// Fd side channel, for Unix workers.
    pub fd_socket: Option<PathBuf>,
    /// Largest message the worker accepts.
    pub max_message_bytes: u64,
    /// The worker's data connection for this session, when it offers one
    /// ([`crate::DataConnection`]).
    pub data: Option<DataOffer>,
    /// What the worker knew of the previous session named to
    /// [`WorkerClient::handshake_after`](crate::WorkerClient::handshake_after)
    /// (which that handshake ended if it was live); `None` when none was
    /// named.
    pub previous: Option<SessionState>,
}

impl Handshake {
    /// The handle of `name@version`, if the worker offers it.
    pub fn callable(&self, name: &str, version: u32) -> Option<KernelHandle> {
        self.worker.callable(name, version)
    }

    /// Whether the worker takes a shared-memory ring for the session's
    /// tasks ([`crate::FdChannel::attach_ring`]): its
    /// [`Features::RING`].
    pub fn ring(&self) -> bool {
        self.worker.capabilities.features.contains(Features::RING)
    }
}
