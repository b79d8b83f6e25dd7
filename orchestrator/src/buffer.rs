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

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use strata_chip::kernel::{Element, Pod};
use strata_chip::staging;
use strata_core::{Holders, WorkerId};
use strata_wire::{Access, BufferDescriptor, CanonicalIdentity, DType, Tensor};
use tokio::sync::mpsc;

use crate::error::{BufferError, Error, QuarantinedBytes, ViewError};
use crate::mapping::{self, SharedMapping};

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

/// A host buffer's memfd, mapping and bookkeeping.
pub(crate) struct HostShared {
    desc: BufferDescriptor,
    file: File,
    map: SharedMapping,
    imported_on: Holders,
    notify: mpsc::UnboundedSender<Released>,
    /// Views written by tasks lost without a fence, until their quarantine
    /// lifts: the driver's own reads and writes of those bytes are refused
    /// (DESIGN §7). Empty but for the rare loss; the DAG actor marks and
    /// lifts, driver threads check.
    quarantine: std::sync::Mutex<Vec<Mark>>,
}

/// A view of a host buffer quarantined by a lost task.
#[derive(Debug)]
struct Mark {
    view: Tensor,
    loss: Loss,
}

/// A task lost without a fence, as the quarantine of its views names it.
#[derive(Debug, Clone)]
pub(crate) struct Loss {
    pub(crate) task: strata_core::TaskId,
    /// Its callable, `name@version`.
    pub(crate) callable: String,
    pub(crate) worker: WorkerId,
    /// The worker's address, when known.
    pub(crate) address: Option<String>,
}

impl std::fmt::Debug for HostShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostBuffer({}, {} B)",
            self.desc.identity(),
            self.desc.nbytes()
        )
    }
}

impl HostShared {
    /// A zeroed memfd of `nbytes`, sealed against resizing, mapped here.
    pub(crate) fn create(
        identity: CanonicalIdentity,
        nbytes: u64,
        access: strata_wire::Access,
        notify: mpsc::UnboundedSender<Released>,
    ) -> Result<Self, BufferError> {
        if nbytes == 0 {
            return Err(BufferError::Empty);
        }
        let fail = |step: &'static str| {
            move |source: io::Error| BufferError::Memfd {
                step,
                nbytes,
                source,
            }
        };
        let mfd = memfd::MemfdOptions::default()
            .close_on_exec(true)
            .allow_sealing(true)
            .create("strata-buffer")
            .map_err(memfd_io)
            .map_err(fail("memfd_create"))?;
        mfd.as_file().set_len(nbytes).map_err(fail("ftruncate"))?;
        mfd.add_seals(&[
            memfd::FileSeal::SealShrink,
            memfd::FileSeal::SealGrow,
            memfd::FileSeal::SealSeal,
        ])
        .map_err(memfd_io)
        .map_err(fail("sealing the memfd"))?;
        let file = mfd.into_file();
        let meta = file.metadata().map_err(fail("fstat"))?;
        let desc = BufferDescriptor::new(
            identity,
            nbytes,
            strata_wire::AddressSpace::Host,
            access,
            strata_wire::Backing::Memfd {
                st_dev: meta.dev(),
                st_ino: meta.ino(),
            },
        )
        .map_err(BufferError::Descriptor)?;
        let map = SharedMapping::new(&file).map_err(fail("mmap"))?;
        Ok(HostShared {
            desc,
            file,
            map,
            imported_on: Holders::new(),
            notify,
            quarantine: std::sync::Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn descriptor(&self) -> &BufferDescriptor {
        &self.desc
    }

    /// The memfd, to pass to a local worker.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Records that `worker` imported the buffer (so it is told to release
    /// it later).
    pub(crate) fn imported_by(&self, worker: WorkerId) {
        self.imported_on.mark(worker);
    }

    /// The view's bytes, packed run after run (what travels to a remote
    /// worker).
    pub(crate) fn pack(&self, view: &Tensor) -> Result<Vec<u8>, BufferError> {
        let first = usize::try_from(view.byte_offset()).map_err(|_| too_big())?;
        let mut out = vec![0u8; usize::try_from(staging::packed_len(view)).map_err(|_| too_big())?];
        let mut at = 0usize;
        let mut result = Ok(());
        staging::for_each_run(view, |off, len| {
            if result.is_ok() {
                result = self.map.read(first + off, &mut out[at..at + len]);
                at += len;
            }
        });
        result.map_err(|e| self.mapping(e))?;
        Ok(out)
    }

    /// Writes a view's packed bytes back, run after run.
    pub(crate) fn unpack(&self, view: &Tensor, packed: &[u8]) -> Result<(), BufferError> {
        let want = staging::packed_len(view);
        if packed.len() as u64 != want {
            return Err(BufferError::PackedLength {
                got: packed.len(),
                want,
            });
        }
        let first = usize::try_from(view.byte_offset()).map_err(|_| too_big())?;
        let mut at = 0usize;
        let mut result = Ok(());
        staging::for_each_run(view, |off, len| {
            if result.is_ok() {
                result = self.map.write(first + off, &packed[at..at + len]);
                at += len;
            }
        });
        result.map_err(|e| self.mapping(e))
    }

    /// The mapping refused bytes past its end (its only failure).
    fn mapping(&self, e: mapping::OutOfRange) -> BufferError {
        BufferError::OutOfRange {
            bytes: e.offset as u64..e.end as u64,
            nbytes: self.desc.nbytes(),
        }
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, Vec<Mark>> {
        self.quarantine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Quarantines `view`: the lost task writes it.
    pub(crate) fn quarantine(&self, view: Tensor, loss: Loss) {
        self.marks().push(Mark { view, loss });
    }

    /// Lifts what `task` quarantined: it can no longer write.
    pub(crate) fn lift(&self, task: strata_core::TaskId) {
        self.marks().retain(|m| m.loss.task != task);
    }

    /// Refuses a driver access to `view`'s bytes while any of them is
    /// quarantined.
    fn check_view(&self, view: &Tensor) -> Result<(), Error> {
        let marks = self.marks();
        match marks
            .iter()
            .find(|m| strata_wire::overlap(&m.view, view) != strata_wire::Overlap::Disjoint)
        {
            None => Ok(()),
            Some(m) => Err(quarantined(self, m).into()),
        }
    }

    /// As [`HostShared::check_view`], for `len` bytes at `offset`.
    fn check_range(&self, offset: u64, len: usize) -> Result<(), Error> {
        let end = offset.saturating_add(len as u64);
        let marks = self.marks();
        match marks.iter().find(|m| {
            let start = m.view.byte_offset();
            start < end && offset < start.saturating_add(m.view.extent_bytes())
        }) {
            None => Ok(()),
            Some(m) => Err(quarantined(self, m).into()),
        }
    }

    pub(crate) fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        self.check_range(offset, len)?;
        let offset = usize::try_from(offset).map_err(|_| too_big())?;
        let mut out = vec![0u8; len];
        self.map
            .read(offset, &mut out)
            .map_err(|e| self.mapping(e))?;
        Ok(out)
    }

    pub(crate) fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        self.check_range(offset, bytes.len())?;
        let offset = usize::try_from(offset).map_err(|_| too_big())?;
        self.map
            .write(offset, bytes)
            .map_err(|e| self.mapping(e).into())
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

fn quarantined(h: &HostShared, m: &Mark) -> QuarantinedBytes {
    let start = m.view.byte_offset();
    QuarantinedBytes {
        buffer: *h.desc.identity(),
        bytes: start..start.saturating_add(m.view.extent_bytes()),
        task: m.loss.task,
        callable: m.loss.callable.clone(),
        worker: m.loss.worker,
        address: m.loss.address.clone(),
    }
}

fn too_big() -> BufferError {
    BufferError::AddressSpace
}

/// The io error inside a memfd error (every variant holds one).
fn memfd_io(e: memfd::Error) -> io::Error {
    match e {
        memfd::Error::Create(e) | memfd::Error::AddSeals(e) | memfd::Error::GetSeals(e) => e,
    }
}

impl Drop for HostShared {
    fn drop(&mut self) {
        let workers = self.imported_on.take();
        // After the cluster is gone nobody listens; the workers are gone too.
        let _ = self.notify.send(Released::Host {
            identity: *self.desc.identity(),
            workers,
        });
    }
}

/// A device buffer's bookkeeping.
#[derive(Debug)]
pub(crate) struct DeviceShared {
    pub(crate) desc: BufferDescriptor,
    pub(crate) worker: WorkerId,
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
#[derive(Debug, Clone)]
pub struct Buffer {
    pub(crate) backing: Backing,
}

impl Buffer {
    pub(crate) fn host(shared: HostShared) -> Self {
        Buffer {
            backing: Backing::Host(Arc::new(shared)),
        }
    }

    pub(crate) fn device(shared: DeviceShared) -> Self {
        Buffer {
            backing: Backing::Device(Arc::new(shared)),
        }
    }

    /// Its wire descriptor.
    pub fn descriptor(&self) -> BufferDescriptor {
        match &self.backing {
            Backing::Host(h) => h.desc,
            Backing::Device(d) => d.desc,
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
            }
            .into()),
        }
    }

    /// `len` bytes at `offset` of a host buffer. Read results after the
    /// tasks that write them are done ([`crate::Cluster::wait`]).
    ///
    /// # Errors
    /// A device buffer, or bytes past the end.
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
    /// A device buffer, or bytes past the end.
    pub fn write_bytes(&self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        self.host_shared()?.write(offset, bytes)
    }

    /// Writes `values` at byte `offset` of a host buffer.
    ///
    /// # Errors
    /// As [`Buffer::write_bytes`].
    pub fn write_slice<T: Pod>(&self, offset: u64, values: &[T]) -> Result<(), Error> {
        self.write_bytes(offset, mapping::as_bytes(values))
    }
}

/// A typed, strided view of a buffer: what task arguments name.
#[derive(Debug, Clone)]
pub struct View {
    pub(crate) tensor: Tensor,
    pub(crate) buffer: Buffer,
}

impl View {
    /// The wire tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The buffer it views.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// Its shape.
    pub fn shape(&self) -> &[u32] {
        self.tensor.shape()
    }

    /// Its dtype.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// What this view grants the tasks that name it: its buffer's grant,
    /// or less if it was narrowed.
    pub fn access(&self) -> Access {
        self.tensor.buffer().access()
    }

    /// The same view granting only `access`, which must be within what this
    /// view grants: a derived view may narrow access, never widen it
    /// (DESIGN §3). The grant is what tasks named with the view get: a task
    /// that writes through a READ view is refused at submit (requested
    /// access ⊆ granted access), and a worker refuses it too. The driver's
    /// own [`View::write`] is the buffer owner's and is not limited by it.
    ///
    /// # Errors
    /// [`Error::View`] naming both accesses when `access` is wider.
    pub fn with_access(&self, access: Access) -> Result<View, Error> {
        let buffer = self
            .tensor
            .buffer()
            .narrowed(access)
            .map_err(ViewError::Wire)?;
        let tensor = Tensor::new(
            buffer,
            self.tensor.byte_offset(),
            self.tensor.shape(),
            self.tensor.strides(),
            self.tensor.dtype(),
        )
        .map_err(ViewError::Wire)?;
        Ok(View {
            tensor,
            buffer: self.buffer.clone(),
        })
    }

    /// The same view, granting READ only.
    ///
    /// # Errors
    /// [`Error::View`] when this view grants WRITE only (READ is not
    /// within it).
    pub fn read_only(&self) -> Result<View, Error> {
        self.with_access(Access::Read)
    }

    /// The same bytes seen with another shape, strides, offset or dtype,
    /// granting what this view grants (a narrowed view stays narrowed).
    ///
    /// # Errors
    /// As [`Buffer::view`].
    pub fn reshape(
        &self,
        byte_offset: u64,
        shape: &[u32],
        strides: &[u32],
        dtype: DType,
    ) -> Result<View, Error> {
        let tensor = Tensor::new(*self.tensor.buffer(), byte_offset, shape, strides, dtype)
            .map_err(ViewError::Wire)?;
        Ok(View {
            tensor,
            buffer: self.buffer.clone(),
        })
    }

    /// The view's elements in row-major index order, as `T` (whose dtype
    /// must be the view's). Host buffers only; read after the tasks that
    /// write the view are done.
    ///
    /// # Errors
    /// A device buffer or a dtype mismatch.
    pub fn read<T: Element>(&self) -> Result<Vec<T>, Error> {
        if T::DTYPE != self.dtype() {
            return Err(ViewError::DType {
                holds: self.dtype(),
                asked: T::DTYPE,
            }
            .into());
        }
        let bytes = self.read_elements()?;
        Ok(mapping::from_bytes(&bytes))
    }

    /// The view's element bytes in row-major index order (whole bytes;
    /// FP4 views are refused).
    ///
    /// # Errors
    /// A device buffer or an FP4 view.
    pub fn read_elements(&self) -> Result<Vec<u8>, Error> {
        let h = self.buffer.host_shared()?;
        h.check_view(&self.tensor)?;
        let elem = elem_bytes(self.dtype())?;
        let t = &self.tensor;
        let n = usize::try_from(t.element_count()).map_err(|_| too_big())?;
        let mut out = vec![0u8; n * elem];
        let mut i = 0usize;
        let mut result = Ok(());
        for_each_element(t, |off| {
            if result.is_ok() {
                result = h.map.read(off, &mut out[i * elem..(i + 1) * elem]);
                i += 1;
            }
        });
        result.map_err(|e| h.mapping(e))?;
        Ok(out)
    }

    /// Writes `values` (row-major index order) into the view's elements.
    /// Host buffers only.
    ///
    /// # Errors
    /// A device buffer, a dtype mismatch or a wrong count.
    pub fn write<T: Element>(&self, values: &[T]) -> Result<(), Error> {
        if T::DTYPE != self.dtype() {
            return Err(ViewError::DType {
                holds: self.dtype(),
                asked: T::DTYPE,
            }
            .into());
        }
        if values.len() as u64 != self.tensor.element_count() {
            return Err(ViewError::Count {
                values: values.len(),
                elements: self.tensor.element_count(),
            }
            .into());
        }
        let h = self.buffer.host_shared()?;
        h.check_view(&self.tensor)?;
        let bytes = mapping::as_bytes(values);
        let elem = std::mem::size_of::<T>();
        let mut i = 0usize;
        let mut result = Ok(());
        for_each_element(&self.tensor, |off| {
            if result.is_ok() {
                result = h.map.write(off, &bytes[i * elem..(i + 1) * elem]);
                i += 1;
            }
        });
        result.map_err(|e| h.mapping(e).into())
    }
}

fn elem_bytes(dtype: DType) -> Result<usize, ViewError> {
    match dtype.bits() {
        4 => Err(ViewError::SubByte(dtype)),
        bits => Ok(bits as usize / 8),
    }
}

/// Calls `f(byte offset)` for every element of a whole-byte view, in
/// row-major index order.
fn for_each_element(t: &Tensor, mut f: impl FnMut(usize)) {
    let elem = (t.dtype().bits() / 8) as usize;
    let shape: Vec<usize> = t.shape().iter().map(|&s| s as usize).collect();
    let strides: Vec<usize> = t.strides().iter().map(|&s| s as usize * elem).collect();
    let base = t.byte_offset() as usize;
    let mut idx = vec![0usize; shape.len()];
    loop {
        let off: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
        f(base + off);
        let mut axis = shape.len();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < shape[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
}
