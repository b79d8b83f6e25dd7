//! What a worker is, as its handshake tells each session.

use strata_wire::KernelHandle;

use crate::{CallableOffer, InstanceId};

/// A worker's facts: its chip and device, the callables it offers and
/// its process. The gRPC handshake carries them (with what only that
/// transport has beside them: the session, the fd channel, the data
/// connection), and an in-process worker reports the same record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerFacts {
    /// Its chip.
    pub chip_id: u32,
    /// Device kind (`sim`).
    pub device_kind: String,
    /// Canonical device spec.
    pub device_spec: String,
    /// Device memory in bytes.
    pub device_memory: u64,
    /// Kernels that may run at once.
    pub lanes: u32,
    /// Callables, sorted by name and version, each checked (its handle is
    /// its signature's digest).
    pub callables: Vec<CallableOffer>,
    /// The process (or in-process node): equal across two handshakes
    /// exactly when the same one answered both.
    pub instance: InstanceId,
}

impl WorkerFacts {
    /// The handles of the callables it offers.
    pub fn handles(&self) -> impl Iterator<Item = KernelHandle> + '_ {
        self.callables.iter().map(|c| c.handle)
    }

    /// The handle of `name@version`, if the worker offers it.
    pub fn callable(&self, name: &str, version: u32) -> Option<KernelHandle> {
        self.callables
            .iter()
            .find(|c| c.name() == name && c.version() == version)
            .map(|c| c.handle)
    }
}
