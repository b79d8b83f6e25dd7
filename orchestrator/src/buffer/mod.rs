//! Buffers and views, as the driver holds them.
//!
//! A host [`Buffer`] is an anonymous memfd, sealed at its size and mapped
//! shared in the driver, with a fresh identity (this cluster's random
//! owner id, a counter, generation 1). No named shared memory is created,
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

use std::sync::Arc;

use strata_chip_runtime::kernel::Pod;
use strata_orchestrator_core::WorkerId;
use strata_wire::{BufferDescriptor, CanonicalIdentity, DType, Tensor};
use tokio::sync::mpsc;

use crate::error::{BufferError, Error, ViewError};
use crate::mapping;

mod host;
mod view;

pub(crate) use host::{HostShared, Loss};
pub(crate) use strata_proto::recycle::Recycler;
pub use view::View;

/// What the buffer manager hears when a buffer's last user let go.
#[derive(Debug)]
pub(crate) enum Released {
    /// A host buffer; the workers that imported it.
    Host {
        identity: CanonicalIdentity,
        workers: Vec<WorkerId>,
    },
    /// A device buffer on `worker`.
    Device {
        identity: CanonicalIdentity,
        worker: WorkerId,
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
    pub(crate) notify: mpsc::UnboundedSender<Released>,
}

impl Drop for DeviceShared {
    fn drop(&mut self) {
        let _ = self.notify.send(Released::Device {
            identity: *self.desc.identity(),
            worker: self.worker,
        });
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Backing {
    Host(Arc<HostShared>),
    Device(Arc<DeviceShared>),
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
#[derive(Debug, Clone)]
pub struct Buffer {
    pub(crate) backing: Backing,
    /// The narrowed descriptor of a handle taken from a narrowed view;
    /// `None` for the owner's handle.
    narrowed: Option<BufferDescriptor>,
}

impl Buffer {
    pub(crate) fn host(shared: HostShared) -> Self {
        Buffer {
            backing: Backing::Host(Arc::new(shared)),
            narrowed: None,
        }
    }

    pub(crate) fn device(shared: DeviceShared) -> Self {
        Buffer {
            backing: Backing::Device(Arc::new(shared)),
            narrowed: None,
        }
    }

    /// The same buffer through a handle granting what `desc` (its own
    /// descriptor, narrowed) grants.
    pub(crate) fn narrowed_to(&self, desc: BufferDescriptor) -> Self {
        Buffer {
            backing: self.backing.clone(),
            narrowed: Some(desc),
        }
    }

    /// Its wire descriptor (granting what this handle grants).
    pub fn descriptor(&self) -> BufferDescriptor {
        if let Some(d) = self.narrowed {
            return d;
        }
        match &self.backing {
            Backing::Host(h) => h.desc,
            Backing::Device(d) => d.desc,
        }
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
        match &self.backing {
            Backing::Host(_) => None,
            Backing::Device(d) => Some(d.worker),
        }
    }

    /// For a host buffer, the address of byte 0 of the driver's mapping and
    /// its length; `None` for a device buffer. The mapping stays at that
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
        match &self.backing {
            Backing::Host(h) => {
                // Whoever holds the address may write through it at any
                // time no task uses the bytes.
                h.expose();
                Some((h.address(), h.len()))
            }
            Backing::Device(_) => None,
        }
    }

    /// As [`Buffer::host_address`], for an access the caller finishes
    /// before it returns and through which it keeps no pointer: a read
    /// (`write` false) leaves the buffer as it was, and a write counts as
    /// [`Buffer::write_bytes`] does (it exposes the buffer only once a task
    /// has named it). So a buffer filled, or read, this way keeps the
    /// copies chips hold of it from one run to the next.
    pub fn host_address_transient(&self, write: bool) -> Option<(*mut u8, usize)> {
        match &self.backing {
            Backing::Host(h) => {
                if write {
                    h.expose_if_used();
                }
                Some((h.address(), h.len()))
            }
            Backing::Device(_) => None,
        }
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

    fn host_shared(&self) -> Result<&Arc<HostShared>, Error> {
        match &self.backing {
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
