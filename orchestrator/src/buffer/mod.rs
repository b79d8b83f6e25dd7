//! Buffers and views, as the driver holds them.
//!
//! A host [`Buffer`] is an anonymous memfd, sealed at its size and mapped
//! shared in the driver, with a fresh identity (this cluster's random
//! owner id, a counter, generation 1; a pooled memfd handed out again
//! keeps its id and takes the next generation). No named shared memory is created,
//! so a crash leaves nothing behind in `/dev/shm`. A device buffer
//! (DEVICE_MALLOC) lives in one worker's device memory and is reached by
//! identity; a *run* buffer is a device buffer in the run region, whose
//! memory lives until the run ends (`Cluster::wait_all`), handle or not.
//!
//! Lifetime: a buffer is shared by the driver's handles and by every
//! submitted task that names it, until that task is finished (success,
//! failure, skip or cancel alike). When the last of them lets go, the
//! buffer manager is told, and the workers that imported it release their
//! imports (or free the device block). Dropping a handle while tasks still
//! use the buffer therefore defers the release; it is never refused.
//!
//! Runtime-managed buffers (`Cluster::alloc`, `ScopeGuard::alloc`) take
//! their memfd from the cluster's [`pool`], which gets it back once the
//! workers have released it. A scope buffer's handles do not hold its
//! memory: its scope does ([`scoped`]).

use std::sync::Arc;

use strata_chip_runtime::kernel::Pod;
use strata_orchestrator_core::WorkerId;
use strata_wire::{BufferDescriptor, CanonicalIdentity, DType, Tensor};
use tokio::sync::mpsc;

use crate::error::{BufferError, Error, ViewError};
use crate::mapping;

mod exported;
mod host;
mod marks;
pub(crate) mod pool;
pub(crate) mod scoped;
mod view;

pub use exported::{DeviceExport, DeviceMapping};
pub(crate) use host::{HostShared, Memfd};
pub(crate) use marks::{Loss, Marks};
pub use pool::PoolStats;
pub(crate) use pool::{Pool, PoolLimits, Returning};
pub(crate) use scoped::{Lease, ScopeLife, Scoped};
pub(crate) use strata_proto::recycle::Recycler;
pub use view::View;

/// What the buffer manager hears when a buffer's last user let go.
#[derive(Debug)]
pub(crate) enum Released {
    /// A host buffer; the workers that imported it; for a pooled
    /// buffer, its memfd on the way back to the pool.
    Host {
        identity: CanonicalIdentity,
        workers: Vec<WorkerId>,
        returning: Option<Returning>,
    },
    /// A device buffer on `worker`, and the workers that mapped it (a
    /// shared one), each with its incarnation when it took the block (a
    /// worker lost since holds it no more: nothing to free there).
    Device {
        identity: CanonicalIdentity,
        worker: (WorkerId, u64),
        importers: Vec<(WorkerId, u64)>,
    },
}

/// A device buffer's bookkeeping.
#[derive(Debug)]
pub(crate) struct DeviceShared {
    /// Its descriptor, whose `owner_worker_path_id` is `path`'s id.
    pub(crate) desc: BufferDescriptor,
    pub(crate) worker: WorkerId,
    /// Where its worker is, for messages.
    pub(crate) path: crate::paths::WorkerPath,
    /// The worker's incarnation when it was allocated (see
    /// [`crate::Cluster::is_up`]).
    pub(crate) incarnation: u64,
    /// For a run buffer, the cluster's run it belongs to (ended by
    /// `wait_all`); `None` for a persistent device buffer.
    pub(crate) run: Option<u64>,
    /// Views written by tasks lost without a fence, shared with every
    /// mapping of a shared buffer taken here ([`DeviceMapping`]).
    pub(crate) marks: Arc<Marks>,
    /// A shared buffer (region SHARED): other local workers may map it
    /// and run tasks on it in place.
    pub(crate) shared: bool,
    /// The workers that mapped it, with their incarnation then (a worker
    /// lost since holds it no more). Locked while one maps it.
    pub(crate) importers: std::sync::Mutex<Vec<(WorkerId, u64)>>,
    pub(crate) notify: mpsc::UnboundedSender<Released>,
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        let importers = std::mem::take(
            self.importers
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let _ = self.notify.send(Released::Device {
            identity: *self.desc.identity(),
            worker: (self.worker, self.incarnation),
            importers,
        });
    }
}

/// The memory of a buffer, as tasks hold it.
#[derive(Debug, Clone)]
pub(crate) enum Backing {
    Host(Arc<HostShared>),
    Device(Arc<DeviceShared>),
}

/// How a driver handle holds its buffer.
#[derive(Debug, Clone)]
pub(crate) enum Held {
    /// The memory itself: it lives while the handle does.
    Owned(Backing),
    /// A scope buffer: its scope holds the memory ([`scoped`]).
    Scoped(Scoped),
}

/// A buffer: host memory shared with local workers, or device memory on
/// one worker. Cheap to clone; the memory lives while any clone or any
/// unfinished task uses it.
///
/// The handle the cluster returns is the owner's: the driver reads and
/// writes through it whatever it grants tasks (a READ buffer is filled
/// through it). The handle a narrowed view holds ([`View::buffer`] of a
/// [`View::read_only`] view) carries the narrowed grant: its descriptor
/// and the views made from it grant no more, and the driver's writes
/// through it are refused unless it grants WRITE.
///
/// A buffer of a scope ([`crate::ScopeGuard::alloc`]) is held by its
/// scope, not by its handles: once the scope has ended, every use of a
/// handle is refused ([`BufferError::ScopeEnded`]) and the memory is
/// reclaimed when the scope's tasks are done, handles or not.
#[derive(Debug, Clone)]
pub struct Buffer {
    pub(crate) held: Held,
    /// The narrowed descriptor of a handle taken from a narrowed view;
    /// `None` for the owner's handle.
    narrowed: Option<BufferDescriptor>,
}

impl Buffer {
    pub(crate) fn host(shared: HostShared) -> Self {
        Buffer::owning(Backing::Host(Arc::new(shared)))
    }

    pub(crate) fn owning(backing: Backing) -> Self {
        Buffer {
            held: Held::Owned(backing),
            narrowed: None,
        }
    }

    pub(crate) fn device(shared: DeviceShared) -> Self {
        Buffer::owning(Backing::Device(Arc::new(shared)))
    }

    /// A handle of a scope buffer.
    pub(crate) fn scoped(lease: Lease) -> Self {
        Buffer {
            held: Held::Scoped(Scoped {
                lease: Arc::new(lease),
                pin: None,
            }),
            narrowed: None,
        }
    }

    /// The same buffer through a handle granting what `desc` (its own
    /// descriptor, narrowed) grants.
    pub(crate) fn narrowed_to(&self, desc: BufferDescriptor) -> Self {
        Buffer {
            held: self.held.clone(),
            narrowed: Some(desc),
        }
    }

    /// Its wire descriptor (granting what this handle grants).
    pub fn descriptor(&self) -> BufferDescriptor {
        if let Some(d) = self.narrowed {
            return d;
        }
        match &self.held {
            Held::Owned(Backing::Host(h)) => h.desc,
            Held::Owned(Backing::Device(d)) => d.desc,
            Held::Scoped(s) => s.lease.desc,
        }
    }

    /// Its memory, as a task holds it.
    ///
    /// # Errors
    /// [`BufferError::ScopeEnded`] for a buffer of a scope that has ended.
    pub(crate) fn backing(&self) -> Result<Backing, BufferError> {
        match &self.held {
            Held::Owned(b) => Ok(b.clone()),
            Held::Scoped(s) => s.live().map(Backing::Host),
        }
    }

    /// For a buffer of a scope ([`crate::ScopeGuard::alloc`]), that scope.
    pub fn scope(&self) -> Option<crate::Scope> {
        match &self.held {
            Held::Owned(_) => None,
            Held::Scoped(s) => Some(crate::Scope(s.lease.scope.id)),
        }
    }

    /// A handle that holds the buffer's memory: for a buffer of a scope,
    /// one through which [`Buffer::host_address`] gives an address that
    /// stays good while the handle lives, even past the scope's end (the
    /// memory is reclaimed once this handle is dropped too). Every other
    /// use of it is still refused once the scope has ended. For any other
    /// buffer, a clone.
    ///
    /// # Errors
    /// [`BufferError::ScopeEnded`] once the buffer's scope has ended.
    pub fn pinned(&self) -> Result<Buffer, Error> {
        Ok(Buffer {
            held: match &self.held {
                Held::Owned(b) => Held::Owned(b.clone()),
                Held::Scoped(s) => Held::Scoped(s.pin()?),
            },
            narrowed: self.narrowed,
        })
    }

    /// Refuses a driver write through a handle narrowed to exclude WRITE.
    ///
    /// # Errors
    /// [`ViewError::ReadOnly`] naming the buffer and the grant.
    pub(crate) fn check_write(&self) -> Result<(), Error> {
        match self.narrowed {
            Some(d) if !d.access().allows_write() => Err(ViewError::ReadOnly {
                buffer: *d.identity(),
                granted: d.access(),
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// Its identity.
    pub fn identity(&self) -> CanonicalIdentity {
        *self.descriptor().identity()
    }

    /// Its size in bytes.
    pub fn nbytes(&self) -> u64 {
        self.descriptor().nbytes()
    }

    /// For a device buffer, the worker whose device holds it.
    pub fn device_worker(&self) -> Option<WorkerId> {
        match &self.held {
            Held::Owned(Backing::Device(d)) => Some(d.worker),
            Held::Owned(Backing::Host(_)) | Held::Scoped(_) => None,
        }
    }

    /// The host memory a handle may hand out the address of: an owned
    /// host buffer's, or a pinned scope buffer's.
    fn addressable(&self) -> Option<&HostShared> {
        match &self.held {
            Held::Owned(Backing::Host(h)) => Some(h),
            Held::Scoped(Scoped { pin: Some(h), .. }) => Some(h),
            Held::Owned(Backing::Device(_)) | Held::Scoped(Scoped { pin: None, .. }) => None,
        }
    }

    /// For a host buffer, the address of byte 0 of the driver's mapping and
    /// its length; `None` for a device buffer, and for a buffer of a scope
    /// unless this handle is [`Buffer::pinned`]. The mapping stays at that
    /// address while any clone of this `Buffer` (or any unfinished task
    /// using it) lives.
    ///
    /// For handing the memory to foreign code that reads and writes it in
    /// place (the Python binding's numpy arrays). Such access is the
    /// driver's own, as with [`Buffer::write_bytes`], but unchecked: it
    /// bypasses the bounds checks, the handle's grant and the quarantine
    /// of bytes a lost task may still write, so whoever hands the memory
    /// on calls [`View::check_read`] or [`View::check_write`] first (and
    /// hands out read-only memory for a view that does not grant WRITE);
    /// and it must be ordered against the tasks that use the bytes (write
    /// inputs before submitting their readers; read results after their
    /// writers are done).
    pub fn host_address(&self) -> Option<(*mut u8, usize)> {
        let h = self.addressable()?;
        // Whoever holds the address may write through it at any time no
        // task uses the bytes.
        h.expose();
        Some((h.address(), h.len()))
    }

    /// As [`Buffer::host_address`], for an access the caller finishes
    /// before it returns and through which it keeps no pointer: a read
    /// (`write` false) leaves the buffer as it was, and a write counts as
    /// [`Buffer::write_bytes`] does (it exposes the buffer only once a task
    /// has named it). So a buffer filled, or read, this way keeps the
    /// copies chips hold of it from one run to the next.
    pub fn host_address_transient(&self, write: bool) -> Option<(*mut u8, usize)> {
        let h = self.addressable()?;
        if write {
            h.expose_if_used();
        }
        Some((h.address(), h.len()))
    }

    /// A row-major view of `shape` elements of `dtype` from byte 0.
    ///
    /// # Errors
    /// [`Error::View`] when it does not fit the buffer (naming the field).
    pub fn tensor(&self, shape: &[u32], dtype: DType) -> Result<View, Error> {
        self.tensor_at(0, shape, dtype)
    }

    /// A row-major view of `shape` elements of `dtype` from `byte_offset`.
    ///
    /// # Errors
    /// As [`Buffer::tensor`].
    pub fn tensor_at(&self, byte_offset: u64, shape: &[u32], dtype: DType) -> Result<View, Error> {
        let tensor = Tensor::row_major(self.descriptor(), byte_offset, shape, dtype)
            .map_err(ViewError::Wire)?;
        Ok(View {
            tensor,
            buffer: self.clone(),
        })
    }

    /// A strided view: `shape` elements with element `strides` from
    /// `byte_offset`.
    ///
    /// # Errors
    /// As [`Buffer::tensor`].
    pub fn view(
        &self,
        byte_offset: u64,
        shape: &[u32],
        strides: &[u32],
        dtype: DType,
    ) -> Result<View, Error> {
        let tensor = Tensor::new(self.descriptor(), byte_offset, shape, strides, dtype)
            .map_err(ViewError::Wire)?;
        Ok(View {
            tensor,
            buffer: self.clone(),
        })
    }

    fn host_shared(&self) -> Result<Arc<HostShared>, Error> {
        match self.backing()? {
            Backing::Host(h) => Ok(h),
            Backing::Device(d) => Err(BufferError::OnDevice {
                buffer: *d.desc.identity(),
                worker: d.worker,
                path: d.path.clone(),
            }
            .into()),
        }
    }

    /// `len` bytes at `offset` of a host buffer. Read results after the
    /// tasks that write them are done ([`crate::Cluster::wait`]).
    ///
    /// # Errors
    /// A device buffer, quarantined bytes ([`Error::Quarantined`]), or
    /// bytes past the end.
    pub fn read_bytes(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        self.host_shared()?.read(offset, len)
    }

    /// The whole host buffer.
    ///
    /// # Errors
    /// A device buffer.
    pub fn to_bytes(&self) -> Result<Vec<u8>, Error> {
        let h = self.host_shared()?;
        h.read(0, h.len())
    }

    /// The whole host buffer as values of `T`.
    ///
    /// # Errors
    /// A device buffer, or a size that is not a multiple of `T`'s.
    pub fn to_vec<T: Pod>(&self) -> Result<Vec<T>, Error> {
        let bytes = self.to_bytes()?;
        if bytes.len() % std::mem::size_of::<T>() != 0 {
            return Err(BufferError::NotWhole {
                len: bytes.len(),
                size: std::mem::size_of::<T>(),
            }
            .into());
        }
        Ok(mapping::from_bytes(&bytes))
    }

    /// Writes `bytes` at `offset` of a host buffer. Write inputs before
    /// submitting the tasks that read them, or after the tasks that use
    /// those bytes are done.
    ///
    /// # Errors
    /// A handle taken from a view that does not grant WRITE
    /// ([`ViewError::ReadOnly`]), a device buffer, quarantined bytes
    /// ([`Error::Quarantined`]), or bytes past the end.
    pub fn write_bytes(&self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        self.check_write()?;
        let h = self.host_shared()?;
        h.expose_if_used();
        h.write(offset, bytes)
    }

    /// Writes `values` at byte `offset` of a host buffer.
    ///
    /// # Errors
    /// As [`Buffer::write_bytes`].
    pub fn write_slice<T: Pod>(&self, offset: u64, values: &[T]) -> Result<(), Error> {
        self.write_bytes(offset, mapping::as_bytes(values))
    }
}
