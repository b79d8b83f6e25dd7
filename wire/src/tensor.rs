//! The wire tensor: a typed, strided view over a buffer (docs/wire-format.md §4).
//!
//! Layout (144 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 88 | `buffer` ([`BufferDescriptor`]) |
//! | 88 | 8 | `byte_offset`, a multiple of the element size |
//! | 96 | 4 | `ndims`, 1..=5 |
//! | 100 | 20 | `shapes[5]`, > 0 below `ndims`, 0 past it |
//! | 120 | 20 | `strides[5]` in elements, > 0 below `ndims`, 0 past it |
//! | 140 | 1 | `dtype` |
//! | 141 | 3 | pad (written zero, not checked) |
//!
//! Axis 0 is the outermost; the last axis is the innermost. A view's extent is
//! `(Σ (shape_i − 1)·stride_i + 1)` elements, in bytes rounded up for FP4, and
//! `byte_offset + extent ≤ nbytes`. Shapes must be nonzero: an empty view
//! touches no byte and has no use as a task argument, and refusing it keeps the
//! extent formula total.
//!
//! The padding @141 is alignment slack, as in simpler: not checked on decode,
//! not kept in the value (so equality and hashing ignore it), written as zero.
//! The shape and stride slots past `ndims` are different: they are data a
//! producer chose not to fill, and must be zero.

use crate::codec::{Reader, Writer, exact_len};
use crate::{BufferDescriptor, CanonicalIdentity, DESCRIPTOR_SIZE, DType, Error};

/// Maximum rank of a view.
pub const MAX_DIMS: usize = 5;

/// Encoded size of a [`Tensor`].
pub const TENSOR_SIZE: usize = 144;

/// A validated view: dtype, shape and element strides over a byte offset of a
/// described buffer. It carries no address; workers resolve one when they
/// materialize it into a [`crate::ChipTensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tensor {
    buffer: BufferDescriptor,
    byte_offset: u64,
    ndims: u8,
    shapes: [u32; MAX_DIMS],
    strides: [u32; MAX_DIMS],
    dtype: DType,
    extent: u64,
}

impl Tensor {
    /// A view with explicit element strides.
    ///
    /// # Errors
    /// [`Error::InvalidField`] naming `ndims`, `shapes[i]`, `strides[i]`,
    /// `byte_offset` or `extent`, and [`Error::ViewOutOfBounds`] when the
    /// view ends past the buffer.
    pub fn new(
        buffer: BufferDescriptor,
        byte_offset: u64,
        shape: &[u32],
        strides: &[u32],
        dtype: DType,
    ) -> Result<Self, Error> {
        if shape.len() != strides.len() {
            return Err(Error::invalid(
                "strides",
                strides.len(),
                "one stride per axis of the shape",
            ));
        }
        let ndims = rank(shape.len())?;
        let mut raw = RawGeometry {
            ndims: u32::from(ndims),
            shapes: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        for ((dst_shape, dst_stride), (&s, &t)) in raw
            .shapes
            .iter_mut()
            .zip(raw.strides.iter_mut())
            .zip(shape.iter().zip(strides))
        {
            *dst_shape = s;
            *dst_stride = t;
        }
        validate(buffer, byte_offset, raw, dtype)
    }

    /// A row-major (C-contiguous) view of `shape` starting at `byte_offset`.
    ///
    /// # Errors
    /// As [`Tensor::new`], and [`Error::InvalidField`] naming `strides` when
    /// a row-major stride does not fit in 32 bits.
    pub fn row_major(
        buffer: BufferDescriptor,
        byte_offset: u64,
        shape: &[u32],
        dtype: DType,
    ) -> Result<Self, Error> {
        let ndims = rank(shape.len())?;
        let mut strides = [0u32; MAX_DIMS];
        let mut acc: u32 = 1;
        for (i, &s) in shape.iter().enumerate().rev() {
            if let Some(slot) = strides.get_mut(i) {
                *slot = acc;
            }
            acc = acc.checked_mul(s).ok_or_else(|| {
                Error::invalid(
                    format!("strides[{}]", i.saturating_sub(1)),
                    u64::from(acc) * u64::from(s),
                    "row-major stride exceeds u32",
                )
            })?;
        }
        let strides = strides.get(..usize::from(ndims)).unwrap_or_default();
        Tensor::new(buffer, byte_offset, shape, strides, dtype)
    }

    /// The buffer this view is over.
    pub fn buffer(&self) -> &BufferDescriptor {
        &self.buffer
    }
    /// The buffer's identity.
    pub fn identity(&self) -> &CanonicalIdentity {
        self.buffer.identity()
    }
    /// Offset of element 0 from the buffer start, in bytes.
    pub fn byte_offset(&self) -> u64 {
        self.byte_offset
    }
    /// Rank, 1..=5.
    pub fn ndims(&self) -> usize {
        usize::from(self.ndims)
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
        self.dtype
    }
    /// Bytes from the first to one past the last byte the view touches.
    pub fn extent_bytes(&self) -> u64 {
        self.extent
    }
    /// One past the last byte the view touches, from the buffer start.
    pub fn end_byte(&self) -> u64 {
        // Validation proved byte_offset + extent ≤ nbytes.
        self.byte_offset + self.extent
    }
    /// Number of elements in the view.
    pub fn element_count(&self) -> u64 {
        // Five 32-bit extents can exceed 64 bits (views with overlapping
        // strides): saturate rather than wrap or panic.
        self.shape()
            .iter()
            .fold(1u64, |n, &s| n.saturating_mul(u64::from(s)))
    }
    /// Whether the view is row-major contiguous: it touches every element
    /// between its first and last one, in order.
    pub fn is_contiguous(&self) -> bool {
        let mut expect: u64 = 1;
        for (&s, &t) in self.shape().iter().zip(self.strides()).rev() {
            if s != 1 && u64::from(t) != expect {
                return false;
            }
            expect = expect.saturating_mul(u64::from(s));
        }
        true
    }

    /// Encodes to the 144-byte wire form.
    pub fn encode(&self) -> [u8; TENSOR_SIZE] {
        let mut w = Writer::<TENSOR_SIZE>::new();
        self.buffer.write(&mut w);
        w.put(&self.byte_offset.to_le_bytes());
        w.put(&u32::from(self.ndims).to_le_bytes());
        for s in self.shapes {
            w.put(&s.to_le_bytes());
        }
        for s in self.strides {
            w.put(&s.to_le_bytes());
        }
        w.put(&[self.dtype.code()]);
        w.zeros(3);
        w.finish()
    }

    /// Decodes and validates the 144-byte wire form.
    ///
    /// # Errors
    /// [`Error::Truncated`] / [`Error::TrailingBytes`] when `bytes` is not
    /// 144 bytes long; otherwise the first rule broken, naming its field.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        exact_len("tensor", bytes, TENSOR_SIZE)?;
        Self::read(&mut Reader::new("tensor", bytes))
    }

    /// Reads one tensor record; the caller has checked that 144 bytes remain.
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let start = r.offset();
        let buffer = BufferDescriptor::read(r).map_err(|e| e.within(format_args!("buffer")))?;
        debug_assert_eq!(r.offset() - start, DESCRIPTOR_SIZE);
        let byte_offset = r.u64()?;
        let ndims = r.u32()?;
        let mut raw = RawGeometry {
            ndims,
            shapes: [0; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        for s in &mut raw.shapes {
            *s = r.u32()?;
        }
        for s in &mut raw.strides {
            *s = r.u32()?;
        }
        let dtype_code = r.u8()?;
        // Alignment slack: not checked, not kept (see the module docs).
        let _pad = r.array::<3>()?;
        let dtype = DType::from_code(dtype_code)
            .ok_or_else(|| Error::invalid("dtype", dtype_code, "must be a dtype code 0 to 14"))?;
        validate(buffer, byte_offset, raw, dtype)
    }
}

/// The geometry fields as they were on the wire, before validation.
#[derive(Clone, Copy)]
struct RawGeometry {
    ndims: u32,
    shapes: [u32; MAX_DIMS],
    strides: [u32; MAX_DIMS],
}

fn rank(len: usize) -> Result<u8, Error> {
    match u8::try_from(len) {
        Ok(n @ 1..=5) => Ok(n),
        _ => Err(Error::invalid("ndims", len, "must be 1 to 5")),
    }
}

/// The one tensor validator: every constructor and every decode ends here.
fn validate(
    buffer: BufferDescriptor,
    byte_offset: u64,
    raw: RawGeometry,
    dtype: DType,
) -> Result<Tensor, Error> {
    let ndims = match u8::try_from(raw.ndims) {
        Ok(n @ 1..=5) => n,
        _ => return Err(Error::invalid("ndims", raw.ndims, "must be 1 to 5")),
    };
    let live = usize::from(ndims);
    // Σ (shape_i − 1)·stride_i + 1 fits easily in u128: 5 terms below 2^64.
    let mut span: u128 = 1;
    for (i, (&shape, &stride)) in raw.shapes.iter().zip(&raw.strides).enumerate() {
        if i < live {
            if shape == 0 {
                return Err(Error::invalid(
                    format!("shapes[{i}]"),
                    shape,
                    "must be > 0 below ndims",
                ));
            }
            if stride == 0 {
                return Err(Error::invalid(
                    format!("strides[{i}]"),
                    stride,
                    "must be > 0 below ndims",
                ));
            }
            span += u128::from(shape - 1) * u128::from(stride);
        } else {
            if shape != 0 {
                return Err(Error::invalid(
                    format!("shapes[{i}]"),
                    shape,
                    "slots past ndims must be zero",
                ));
            }
            if stride != 0 {
                return Err(Error::invalid(
                    format!("strides[{i}]"),
                    stride,
                    "slots past ndims must be zero",
                ));
            }
        }
    }
    let align = dtype.align_bytes();
    if byte_offset % align != 0 {
        return Err(Error::invalid(
            "byte_offset",
            byte_offset,
            "must be a multiple of the element size",
        ));
    }
    let extent = u64::try_from(span)
        .ok()
        .and_then(|span| dtype.bytes_for(span))
        .ok_or_else(|| Error::invalid("extent", u64::MAX, "view extent overflows u64"))?;
    let nbytes = buffer.nbytes();
    if byte_offset
        .checked_add(extent)
        .is_none_or(|end| end > nbytes)
    {
        return Err(Error::ViewOutOfBounds {
            field: "view".into(),
            byte_offset,
            extent,
            nbytes,
        });
    }
    Ok(Tensor {
        buffer,
        byte_offset,
        ndims,
        shapes: raw.shapes,
        strides: raw.strides,
        dtype,
        extent,
    })
}
