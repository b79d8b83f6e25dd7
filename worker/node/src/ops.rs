//! What a session may ask of its node, in one place: the worker process's
//! gRPC service and the in-process worker both call these, so a worker
//! behaves the same whichever way it is reached. Refusals are a
//! [`NodeError`], which the service maps to gRPC statuses in one place and
//! in-process callers match on.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use strata_chip_runtime::Region;
use strata_proto::convert::{RunEnd, WorkerStats};
use strata_wire::{BufferDescriptor, CanonicalIdentity};
use strata_worker_core::SessionId;
use tracing::{debug, warn};

use crate::node::{DeviceBuffer, Missing, Node, Session};

/// Why a node refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The session has no live device buffer of that identity: never
    /// allocated, freed, or a run buffer whose run ended.
    #[error("{message}")]
    NoBuffer {
        /// The buffer.
        identity: CanonicalIdentity,
        /// The run it belonged to, when it was retired with its run.
        run_ended: Option<u64>,
        /// What to tell the caller.
        message: String,
    },
    /// A device buffer of that identity is already allocated.
    #[error("device buffer {0} is already allocated")]
    AlreadyAllocated(CanonicalIdentity),
    /// A byte range outside the device buffer.
    #[error("range {offset}+{len} is outside the device buffer of {size} bytes")]
    OutOfRange {
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The buffer's size.
        size: u64,
    },
    /// An argument no call could accept.
    #[error("{0}")]
    Invalid(String),
    /// The session ended (or never existed).
    #[error("session {0} is unknown or has ended")]
    SessionEnded(SessionId),
    /// The worker is halted (in-process: [`crate::InProcessWorker::halt`]).
    #[error("the worker is halted")]
    Halted,
    /// The device refused.
    #[error("{0}")]
    Device(strata_chip_runtime::Error),
}

impl NodeError {
    fn missing(why: Missing, identity: &CanonicalIdentity) -> Self {
        NodeError::NoBuffer {
            identity: *identity,
            run_ended: match why {
                Missing::NotAllocated => None,
                Missing::RunEnded { run } => Some(run),
            },
            message: why.describe(identity),
        }
    }
}

impl From<strata_chip_runtime::Error> for NodeError {
    fn from(e: strata_chip_runtime::Error) -> Self {
        NodeError::Device(e)
    }
}

impl Node {
    /// Allocates a device buffer of `nbytes` in `region` for `session`;
    /// returns its device address.
    pub fn device_alloc(
        &self,
        session: &Session,
        identity: CanonicalIdentity,
        nbytes: u64,
        region: Region,
    ) -> Result<u64, NodeError> {
        if nbytes == 0 {
            return Err(NodeError::Invalid(
                "nbytes: a device buffer has at least one byte".into(),
            ));
        }
        let mut buffers = session.device_buffers();
        if buffers.contains_key(&identity) {
            return Err(NodeError::AlreadyAllocated(identity));
        }
        let buffer = match region {
            Region::Run => self.run_region.alloc(nbytes),
            _ => self
                .device
                .alloc(region, nbytes)
                .map(|block| DeviceBuffer::persistent(Arc::clone(&self.device), block)),
        }?;
        let addr = buffer.block.addr;
        buffers.insert(identity, Arc::new(buffer));
        Ok(addr)
    }

    /// Frees a device buffer of `session` (once no running task holds it).
    pub fn device_free(
        &self,
        session: &Session,
        identity: &CanonicalIdentity,
    ) -> Result<(), NodeError> {
        // Dropping the handle frees the block once no running task holds it
        // (a run block: it counts no more towards the run region's reset).
        let removed = session.device_buffers().remove(identity);
        if removed.is_none() {
            let why = session
                .device_buffer(identity)
                .err()
                .unwrap_or(Missing::NotAllocated);
            return Err(NodeError::missing(why, identity));
        }
        drop(removed);
        Ok(())
    }

    /// Ends the session's run: its run buffers retire.
    pub fn end_run(&self, id: SessionId, session: &Session) -> RunEnd {
        let (retired, run) = session.end_run();
        let count = u32::try_from(retired.len()).unwrap_or(u32::MAX);
        // The last holder of a run buffer resets the region as it lets go.
        drop(retired);
        let reset = self.run_region.is_idle();
        debug!(session = %id, retired = count, run, reset, "run ended");
        RunEnd {
            retired: count,
            run,
            reset,
        }
    }

    /// Writes `data` at `offset` of a device buffer of `session`.
    pub fn copy_to_device(
        &self,
        session: &Session,
        identity: &CanonicalIdentity,
        offset: u64,
        data: &[u8],
    ) -> Result<(), NodeError> {
        let buf = session
            .device_buffer(identity)
            .map_err(|why| NodeError::missing(why, identity))?;
        in_block(&buf, offset, data.len() as u64)?;
        self.device.copy_to_device(&buf.block, offset, data)?;
        Ok(())
    }

    /// Reads `len` bytes at `offset` of a device buffer of `session`, at
    /// most `limit` of them.
    pub fn copy_from_device(
        &self,
        session: &Session,
        identity: &CanonicalIdentity,
        offset: u64,
        len: u64,
        limit: u64,
    ) -> Result<Vec<u8>, NodeError> {
        if len > limit {
            return Err(NodeError::Invalid(format!(
                "len {len} exceeds what one reply may carry ({} bytes)",
                self.limits.max_message_bytes
            )));
        }
        let buf = session
            .device_buffer(identity)
            .map_err(|why| NodeError::missing(why, identity))?;
        in_block(&buf, offset, len)?;
        let n = usize::try_from(len)
            .map_err(|_| NodeError::Invalid(format!("len {len} does not fit in memory")))?;
        let mut data = vec![0u8; n];
        self.device
            .copy_from_device(&buf.block, offset, &mut data)?;
        Ok(data)
    }

    /// Releases `session`'s imports by identity; returns how many it
    /// held (another session's imports of the same identities stay).
    pub fn release_imports(&self, session: SessionId, identities: &[CanonicalIdentity]) -> u32 {
        identities
            .iter()
            .map(|i| {
                // Its copies on the chip go with it (a dirty one was the
                // orchestrator's to flush first).
                self.device.drop_copies(session.0, Some(i));
                u32::from(self.imports().release(session, i))
            })
            .sum()
    }

    /// Writes `session`'s dirty cached copies of `identities` and of the
    /// byte sets of `views` (of everything when both are empty) back to
    /// host memory; returns the bytes written. The copies stay, clean.
    /// Off the async runtime: it copies.
    pub fn flush(
        &self,
        session: SessionId,
        identities: &[CanonicalIdentity],
        views: &[strata_wire::Tensor],
    ) -> u64 {
        let buffers: std::collections::HashSet<&CanonicalIdentity> = identities.iter().collect();
        let sets: std::collections::HashSet<strata_wire::Footprint> =
            views.iter().map(strata_wire::Footprint::of).collect();
        let all = buffers.is_empty() && sets.is_empty();
        let moved = strata_client::offload::off_runtime(u64::MAX, || {
            self.device.flush(session.0, &|fp| {
                all || buffers.contains(fp.identity()) || sets.contains(fp)
            })
        });
        debug!(session = %session, buffers = identities.len(), moved, "flushed");
        moved
    }

    /// The worker's figures.
    pub fn stats(&self) -> WorkerStats {
        let s = self.device.stats();
        let c = &self.counters;
        WorkerStats {
            persistent: s.arena.persistent,
            run: s.arena.run,
            scratch: s.arena.scratch,
            staged_to_device: s.staged_to_device,
            staged_to_host: s.staged_to_host,
            copied_to_device: s.copied_to_device,
            copied_to_host: s.copied_to_host,
            tasks_succeeded: c.succeeded.load(Ordering::Relaxed),
            tasks_failed: c.failed.load(Ordering::Relaxed),
            kernels_panicked: s.panicked,
            imports: self.imports().len() as u64,
            sessions: self.session_count() as u64,
            tasks_in_flight: self.tasks_in_flight(),
            zeroed: s.zeroed,
            bounced: s.bounced,
            shared: s.shared,
            cache: crate::exec::cache_counters(s.cache),
        }
    }

    /// The `seq`-th health beat of a stream.
    pub fn beat(&self, seq: u64) -> strata_proto::convert::HealthBeat {
        strata_proto::convert::HealthBeat {
            seq,
            tasks_in_flight: self.tasks_in_flight(),
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// A new fd of `session`'s shared device buffer `identity` (region
    /// shared): another process on this host maps the same memory
    /// (`strata_chip_runtime::shared`). Each call gives its own fd.
    ///
    /// # Errors
    /// Why not, for the fd channel's ack: no such session or buffer, a
    /// buffer of another region, a chip that cannot share.
    pub fn export_one(
        &self,
        session: SessionId,
        identity: &CanonicalIdentity,
    ) -> Result<strata_chip_runtime::shared::SharedMemory, String> {
        let state = self
            .session(session)
            .ok_or_else(|| format!("unknown session {session}"))?;
        self.device_export(&state, identity)
            .map_err(|e| e.to_string())
    }

    /// As [`Node::export_one`], for a session in hand.
    ///
    /// # Errors
    /// As [`Node::export_one`].
    pub fn device_export(
        &self,
        session: &Session,
        identity: &CanonicalIdentity,
    ) -> Result<strata_chip_runtime::shared::SharedMemory, NodeError> {
        let buf = session
            .device_buffer(identity)
            .map_err(|why| NodeError::missing(why, identity))?;
        Ok(self.device.export(&buf.block)?)
    }

    /// Maps another worker's shared device buffer `identity` (its export,
    /// `memory`) into this chip for `session`'s tasks, as the session's
    /// device buffer of that identity until it is freed or the session
    /// ends; `session` as the fd channel names it.
    ///
    /// # Errors
    /// As [`Node::device_import`], as text.
    pub fn import_shared_one(
        &self,
        session: SessionId,
        identity: CanonicalIdentity,
        memory: strata_chip_runtime::shared::SharedMemory,
    ) -> Result<(), String> {
        let state = self
            .session(session)
            .ok_or_else(|| format!("unknown session {session}"))?;
        self.device_import(&state, identity, memory)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// As [`Node::import_shared_one`], for a session in hand: the block's
    /// address on this chip.
    ///
    /// # Errors
    /// An identity the session already holds; the chip's refusal (memory
    /// of another place, a descriptor that does not check out).
    pub fn device_import(
        &self,
        session: &Session,
        identity: CanonicalIdentity,
        memory: strata_chip_runtime::shared::SharedMemory,
    ) -> Result<u64, NodeError> {
        let mut buffers = session.device_buffers();
        if buffers.contains_key(&identity) {
            return Err(NodeError::AlreadyAllocated(identity));
        }
        let block = self.device.import(memory)?;
        let buffer = DeviceBuffer::persistent(Arc::clone(&self.device), block);
        buffers.insert(identity, Arc::new(buffer));
        Ok(block.addr)
    }

    /// Imports `fd` for `session` as buffer `identity` (as `grant`, when
    /// given: its descriptor, which tasks may narrow but not widen), after
    /// the arrival checks: tmpfs/shmem, sealed against shrinking unless the
    /// grant names a POSIX_SHM buffer (imported by copy, never mapped). A
    /// refusal is remembered by the session, so a task naming the identity
    /// later fails with its reason.
    pub fn import_one(
        &self,
        session: SessionId,
        identity: CanonicalIdentity,
        grant: Option<BufferDescriptor>,
        fd: OwnedFd,
    ) -> Result<(), String> {
        let state = self.session(session);
        match crate::imports::check_arrival(&fd, grant.as_ref()) {
            Ok(()) => {
                if let Some(s) = &state {
                    s.forget_refusal(&identity);
                }
                match grant {
                    Some(grant) => self.imports().offer_as(session, grant, fd),
                    None => self.imports().offer(session, identity, fd),
                }
                .map_err(|e| e.to_string())?;
                // A session that ended while this fd was on its way has
                // released its imports already: this one would be held
                // for ever under an id nobody can name again. Checked
                // after the offer (the session leaves the table before it
                // releases its imports), so either that release or this
                // one takes it.
                if !self.has_session(session) {
                    self.imports().release(session, &identity);
                    return Err(format!("buffer {identity}: session {session} has ended"));
                }
                Ok(())
            }
            Err(reason) => {
                warn!(%session, %identity, %reason, "import refused");
                if let Some(s) = &state {
                    s.remember_refusal(identity, reason.clone());
                }
                Err(format!("buffer {identity}: {reason}"))
            }
        }
    }
}

/// Checks that `[offset, offset + len)` lies inside `buf`.
fn in_block(buf: &DeviceBuffer, offset: u64, len: u64) -> Result<(), NodeError> {
    match offset.checked_add(len) {
        Some(end) if end <= buf.block.len => Ok(()),
        _ => Err(NodeError::OutOfRange {
            offset,
            len,
            size: buf.block.len,
        }),
    }
}
