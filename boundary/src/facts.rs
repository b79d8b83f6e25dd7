//! What a worker is, as its handshake tells each session.

use strata_wire::KernelHandle;

use crate::{CallableOffer, Capabilities, Features, InstanceId};

/// A worker's facts: its chip and device, the callables it offers, what
/// it can take, and its process. The gRPC handshake carries them (with what only that
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
    /// `name@version` of every kernel registered on the worker that its
    /// chip has no body for (a CUDA chip runs only kernels with a CUDA
    /// body), sorted: it does not offer them, and a driver names them
    /// when a task asks for one instead of calling it unknown.
    pub no_body: Vec<String>,
    /// What its tasks may use: the kinds of buffer it resolves arguments
    /// of, its chip's dtypes, its features (for a session over this
    /// transport: a worker on TCP imports no memfd and has no ring).
    pub capabilities: Capabilities,
    /// Features a driver must understand to use this worker: a driver
    /// that does not know one of them refuses the worker.
    pub required_features: Features,
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
