//! Views: a validated wire `Tensor` and the buffer that keeps its memory
//! alive; narrowed grants, reshapes, and element reads and writes.

use strata_chip::kernel::Element;
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
