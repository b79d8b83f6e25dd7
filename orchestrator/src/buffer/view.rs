//! Views: a validated wire `Tensor` and the buffer that keeps its memory
//! alive; narrowed grants, reshapes, and element reads and writes.

use strata_chip_runtime::kernel::Typed;
use strata_wire::{Access, DType, Tensor};

use super::Buffer;
use super::host::too_big;
use crate::error::{Error, ViewError};
use crate::mapping;

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

    /// The buffer it views, through a handle granting what this view
    /// grants (the owner's handle for a view that was never narrowed).
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
    /// (docs/wire-format.md §3). The grant is what tasks named with the view get: a task
    /// that writes through a READ view is refused at submit (requested
    /// access ⊆ granted access), and a worker refuses it too. It binds
    /// the driver as well: [`View::write`] through a view that does not
    /// grant WRITE is refused, and so are writes through its
    /// [`View::buffer`], whose handle is narrowed with it. (The driver's
    /// reads are not bound by a WRITE-only grant: that grant tells tasks
    /// not to read, and the driver reads what they wrote.)
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
            buffer: self.buffer.narrowed_to(buffer),
        })
    }

    /// The same view, granting READ only: tasks and the driver alike may
    /// only read through it.
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

    /// The same view through a handle that holds its memory
    /// ([`Buffer::pinned`]): for a view of a scope buffer, one whose
    /// [`Buffer::host_address`] stays good while the returned view lives.
    ///
    /// # Errors
    /// [`crate::BufferError::ScopeEnded`] once the buffer's scope has
    /// ended.
    pub fn pinned(&self) -> Result<View, Error> {
        Ok(View {
            tensor: self.tensor,
            buffer: self.buffer.pinned()?,
        })
    }

    /// Refuses what [`View::read`] refuses before it reads a byte: bytes
    /// of a host buffer that are quarantined (a task writing them was lost
    /// without a fence). For code that reads the view's memory in place
    /// ([`Buffer::host_address`]); a device view passes. Cheap: one atomic
    /// load unless the buffer has quarantined bytes.
    ///
    /// # Errors
    /// [`Error::Quarantined`] naming the bytes, the lost task and its
    /// worker; [`crate::BufferError::ScopeEnded`] for a view of a scope
    /// buffer whose scope has ended.
    pub fn check_read(&self) -> Result<(), Error> {
        match self.buffer.backing()? {
            super::Backing::Host(h) => h.check_view(&self.tensor),
            super::Backing::Device(_) => Ok(()),
        }
    }

    /// Refuses what [`View::write`] refuses before it writes a byte: a
    /// view that does not grant WRITE, then quarantined bytes (as
    /// [`View::check_read`]).
    ///
    /// # Errors
    /// [`ViewError::ReadOnly`] naming the buffer and the grant, or
    /// [`Error::Quarantined`].
    pub fn check_write(&self) -> Result<(), Error> {
        self.granted_write()?;
        self.check_read()
    }

    /// The view's elements in row-major index order, as `T` (whose dtype
    /// must be the view's). Host buffers only; read after the tasks that
    /// write the view are done.
    ///
    /// # Errors
    /// A device buffer, a dtype mismatch, or quarantined bytes
    /// ([`Error::Quarantined`]).
    pub fn read<T: Typed>(&self) -> Result<Vec<T>, Error> {
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
    /// A device buffer, an FP4 view, or quarantined bytes.
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
                result = h.mem.map.read(off, &mut out[i * elem..(i + 1) * elem]);
                i += 1;
            }
        });
        result.map_err(|e| h.mapping(e))?;
        Ok(out)
    }

    /// Writes `values` (row-major index order) into the view's elements.
    /// Host buffers only; the view must grant WRITE.
    ///
    /// # Errors
    /// A view that does not grant WRITE ([`ViewError::ReadOnly`]), a
    /// device buffer, a dtype mismatch, a wrong count, or quarantined
    /// bytes ([`Error::Quarantined`]).
    pub fn write<T: Typed>(&self, values: &[T]) -> Result<(), Error> {
        self.granted_write()?;
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
                result = h.mem.map.write(off, &bytes[i * elem..(i + 1) * elem]);
                i += 1;
            }
        });
        result.map_err(|e| h.mapping(e).into())
    }

    /// Refuses a driver write through a view that does not grant WRITE.
    fn granted_write(&self) -> Result<(), ViewError> {
        let granted = self.access();
        if granted.allows_write() {
            Ok(())
        } else {
            Err(ViewError::ReadOnly {
                buffer: *self.tensor.identity(),
                granted,
            })
        }
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
