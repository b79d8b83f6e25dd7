//! The worker-local materialized argument (docs/wire-format.md §7).

use crate::{AddressSpace, DType, Error, Tensor};

/// A tensor argument after materialization on the consuming worker: the
/// resolved backing range in the chip's address space plus the view geometry.
///
/// It never travels on the wire; its fixed 128-byte, 64-byte-aligned layout
/// is what kernels receive, one cache line pair per argument:
///
/// | offset | field |
/// |---|---|
/// | 0 | `addr` (u64): start of the resolved backing |
/// | 8 | `size` (u64): bytes of the backing |
/// | 16 | `start_offset` (u64): index of element 0, in elements (nibbles for FP4) |
/// | 24 | `shapes[5]` (u32) |
/// | 44 | `strides[5]` (u32, elements) |
/// | 64 | `ndims` (u32) |
/// | 68 | `dtype` (u8) |
/// | 69 | `address_space` (u8) |
/// | 70 | `contiguous` (u8, 0 or 1) |
/// | 71 | pad to 128 |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct ChipTensor {
    addr: u64,
    size: u64,
    start_offset: u64,
    shapes: [u32; 5],
    strides: [u32; 5],
    ndims: u32,
    dtype: u8,
    address_space: u8,
    contiguous: u8,
    _pad: [u8; 57],
}

impl ChipTensor {
    /// Materializes `view` onto a backing resolved at `addr` with `size`
    /// bytes in `space`.
    ///
    /// # Errors
    /// [`Error::ViewOutOfBounds`] naming `backing` when the view reaches past
    /// `size` bytes, and [`Error::InvalidField`] naming `addr` when the
    /// backing range wraps the address space.
    pub fn from_view(
        view: &Tensor,
        addr: u64,
        size: u64,
        space: AddressSpace,
    ) -> Result<Self, Error> {
        if addr.checked_add(size).is_none() {
            return Err(Error::invalid(
                "addr",
                addr,
                "backing range wraps the address space",
            ));
        }
        if view.end_byte() > size {
            return Err(Error::ViewOutOfBounds {
                field: "backing".into(),
                byte_offset: view.byte_offset(),
                extent: view.extent_bytes(),
                nbytes: size,
            });
        }
        let mut c = ChipTensor::geometry(view, space);
        c.addr = addr;
        c.size = size;
        c.start_offset = match view.dtype().bits() {
            4 => view.byte_offset() * 2,
            bits => view.byte_offset() / u64::from(bits / 8),
        };
        Ok(c)
    }

    /// The view geometry at address 0, start offset 0.
    fn geometry(view: &Tensor, space: AddressSpace) -> Self {
        let mut shapes = [0u32; 5];
        let mut strides = [0u32; 5];
        for ((d, s), (&shape, &stride)) in shapes
            .iter_mut()
            .zip(strides.iter_mut())
            .zip(view.shape().iter().zip(view.strides()))
        {
            *d = shape;
            *s = stride;
        }
        ChipTensor {
            addr: 0,
            size: 0,
            start_offset: 0,
            shapes,
            strides,
            // ndims is 1..=5.
            ndims: u32::try_from(view.ndims()).unwrap_or(0),
            dtype: view.dtype().code(),
            address_space: space.code(),
            contiguous: u8::from(view.is_contiguous()),
            _pad: [0; 57],
        }
    }

    /// Materializes `view` onto a staged copy of its bytes: `addr` holds the
    /// view's `extent_bytes()` bytes, from its first byte on, laid out as in
    /// the buffer (same strides), so element 0 is at `addr`.
    ///
    /// # Errors
    /// [`Error::InvalidField`] naming `addr` when the copy would wrap the
    /// address space.
    pub fn staged(view: &Tensor, addr: u64, space: AddressSpace) -> Result<Self, Error> {
        let extent = view.extent_bytes();
        if addr.checked_add(extent).is_none() {
            return Err(Error::invalid(
                "addr",
                addr,
                "staged copy wraps the address space",
            ));
        }
        let mut c = ChipTensor::geometry(view, space);
        c.addr = addr;
        c.size = extent;
        Ok(c)
    }

    /// Materializes `view` onto a packed copy of its elements at `addr`:
    /// element after element, axes by decreasing stride
    /// ([`crate::geometry::packed_strides`]), so the copy holds no byte
    /// between elements.
    ///
    /// # Errors
    /// [`Error::InvalidField`] naming `strides` for a view that does not
    /// pack, and `addr` when the copy would wrap the address space.
    pub fn packed(view: &Tensor, addr: u64, space: AddressSpace) -> Result<Self, Error> {
        let Some(strides) = crate::geometry::packed_strides(view) else {
            return Err(Error::invalid(
                "strides",
                u64::from(view.strides().first().copied().unwrap_or(0)),
                "the view's elements overlap, interleave or are smaller than a byte: it does not pack",
            ));
        };
        let size = view
            .element_count()
            .saturating_mul(u64::from(view.dtype().bits() / 8));
        if addr.checked_add(size).is_none() {
            return Err(Error::invalid(
                "addr",
                addr,
                "packed copy wraps the address space",
            ));
        }
        let mut c = ChipTensor::geometry(view, space);
        c.addr = addr;
        c.size = size;
        c.strides = strides;
        let mut expect = 1u64;
        let mut row_major = true;
        for (&n, &t) in view.shape().iter().zip(&strides).rev() {
            if n != 1 && u64::from(t) != expect {
                row_major = false;
            }
            expect = expect.saturating_mul(u64::from(n));
        }
        c.contiguous = u8::from(row_major);
        Ok(c)
    }

    /// Start of the resolved backing.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Bytes of the resolved backing.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Index of element 0 from `addr`, in elements (nibbles for FP4).
    pub fn start_offset(&self) -> u64 {
        self.start_offset
    }
    /// Rank.
    pub fn ndims(&self) -> usize {
        // ndims is 1..=5 by construction.
        usize::try_from(self.ndims).unwrap_or(0)
    }
    /// Extent of each axis, outermost first.
    pub fn shape(&self) -> &[u32] {
        self.shapes.get(..self.ndims()).unwrap_or_default()
    }
    /// Element stride of each axis, outermost first.
    pub fn strides(&self) -> &[u32] {
        self.strides.get(..self.ndims()).unwrap_or_default()
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        // Only valid codes are ever stored.
        DType::from_code(self.dtype).unwrap_or(DType::U8)
    }
    /// Host or device.
    pub fn address_space(&self) -> AddressSpace {
        AddressSpace::from_code(self.address_space).unwrap_or(AddressSpace::Host)
    }
    /// Whether the view is row-major contiguous.
    pub fn is_contiguous(&self) -> bool {
        self.contiguous != 0
    }
}

#[cfg(test)]
mod tests {
    use super::ChipTensor;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn layout_is_pinned() {
        assert_eq!(size_of::<ChipTensor>(), 128);
        assert_eq!(align_of::<ChipTensor>(), 64);
        assert_eq!(offset_of!(ChipTensor, addr), 0);
        assert_eq!(offset_of!(ChipTensor, size), 8);
        assert_eq!(offset_of!(ChipTensor, start_offset), 16);
        assert_eq!(offset_of!(ChipTensor, shapes), 24);
        assert_eq!(offset_of!(ChipTensor, strides), 44);
        assert_eq!(offset_of!(ChipTensor, ndims), 64);
        assert_eq!(offset_of!(ChipTensor, dtype), 68);
        assert_eq!(offset_of!(ChipTensor, address_space), 69);
        assert_eq!(offset_of!(ChipTensor, contiguous), 70);
        assert_eq!(offset_of!(ChipTensor, _pad), 71);
    }
}
