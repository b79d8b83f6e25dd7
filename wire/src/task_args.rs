//! The TaskArgs blob: a task's tensor arguments and scalars (docs/wire-format.md §5).
//!
//! Layout, little-endian: `[i32 T][i32 S][Tensor × T][u64 × S]`, with
//! `0 ≤ T ≤ 256` and `0 ≤ S ≤ 128`, and nothing after the last scalar.
//!
//! Decoding steps, in order, so that no hostile count sizes an allocation:
//! 1. read the 8-byte header;
//! 2. check each count against 0 and its maximum;
//! 3. check that exactly `8 + 144·T + 8·S` bytes are present;
//! 4. validate each tensor record with the tensor validator;
//! 5. read the scalars.

use crate::codec::Reader;
use crate::tensor::TENSOR_SIZE;
use crate::{Error, Tensor};

/// Maximum number of tensor arguments of one task.
pub const MAX_TENSORS: usize = 256;

/// Maximum number of scalar arguments of one task.
pub const MAX_SCALARS: usize = 128;

/// Size of the blob header.
pub const HEADER_SIZE: usize = 8;

/// A task's arguments: validated tensors and raw 64-bit scalars.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TaskArgs {
    tensors: Vec<Tensor>,
    scalars: Vec<u64>,
}

impl TaskArgs {
    /// Arguments from tensors and scalars.
    ///
    /// # Errors
    /// [`Error::InvalidField`] naming `tensor_count` or `scalar_count` when
    /// there are more than 256 tensors or 128 scalars.
    pub fn new(tensors: Vec<Tensor>, scalars: Vec<u64>) -> Result<Self, Error> {
        if tensors.len() > MAX_TENSORS {
            return Err(Error::invalid(
                "tensor_count",
                tensors.len(),
                "at most 256 tensors",
            ));
        }
        if scalars.len() > MAX_SCALARS {
            return Err(Error::invalid(
                "scalar_count",
                scalars.len(),
                "at most 128 scalars",
            ));
        }
        Ok(TaskArgs { tensors, scalars })
    }

    /// The tensor arguments, in order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The scalar arguments, in order.
    pub fn scalars(&self) -> &[u64] {
        &self.scalars
    }

    /// Size of the encoded blob.
    pub fn encoded_len(&self) -> usize {
        HEADER_SIZE + TENSOR_SIZE * self.tensors.len() + 8 * self.scalars.len()
    }

    /// Encodes the blob.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        // Both counts are bounded by the constructor, far below i32::MAX.
        let t = i32::try_from(self.tensors.len()).unwrap_or(i32::MAX);
        let s = i32::try_from(self.scalars.len()).unwrap_or(i32::MAX);
        out.extend_from_slice(&t.to_le_bytes());
        out.extend_from_slice(&s.to_le_bytes());
        for t in &self.tensors {
            out.extend_from_slice(&t.encode());
        }
        for s in &self.scalars {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out
    }

    /// Decodes and validates a blob.
    ///
    /// # Errors
    /// [`Error::InvalidField`] naming `tensor_count` / `scalar_count` for a
    /// negative or excessive count, [`Error::Truncated`] /
    /// [`Error::TrailingBytes`] when the length does not match the counts, and
    /// any tensor error prefixed with `tensors[i]`.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let mut args = TaskArgs::default();
        walk(bytes, Some(&mut args))?;
        Ok(args)
    }

    /// Checks a blob exactly as [`TaskArgs::decode`] does, without building it
    /// (no allocation on success).
    ///
    /// # Errors
    /// The same error [`TaskArgs::decode`] would return.
    pub fn validate(bytes: &[u8]) -> Result<(), Error> {
        walk(bytes, None)
    }
}

/// Reads the header counts, bounded, from the first 8 bytes of a blob.
///
/// # Errors
/// As [`TaskArgs::decode`] for the header.
pub fn header_counts(bytes: &[u8]) -> Result<(usize, usize), Error> {
    let mut r = Reader::new("task args", bytes);
    let t = r.i32()?;
    let s = r.i32()?;
    let t = count("tensor_count", t, MAX_TENSORS, "at most 256 tensors")?;
    let s = count("scalar_count", s, MAX_SCALARS, "at most 128 scalars")?;
    Ok((t, s))
}

fn count(field: &'static str, raw: i32, max: usize, rule: &'static str) -> Result<usize, Error> {
    let n = usize::try_from(raw).map_err(|_| Error::invalid(field, raw, "must not be negative"))?;
    if n > max {
        return Err(Error::invalid(field, raw, rule));
    }
    Ok(n)
}

/// The one blob walker behind both decode (which passes `out`) and validate.
fn walk(bytes: &[u8], mut out: Option<&mut TaskArgs>) -> Result<(), Error> {
    let (t, s) = header_counts(bytes)?;
    // t ≤ 256 and s ≤ 128, so this cannot overflow.
    let needed = HEADER_SIZE + TENSOR_SIZE * t + 8 * s;
    if bytes.len() < needed {
        return Err(Error::Truncated {
            what: "task args",
            needed,
            available: bytes.len(),
        });
    }
    if bytes.len() > needed {
        return Err(Error::TrailingBytes {
            what: "task args",
            expected: needed,
            available: bytes.len(),
        });
    }
    if let Some(out) = out.as_deref_mut() {
        // Bounded by MAX_TENSORS and MAX_SCALARS, and backed by input bytes.
        out.tensors.reserve_exact(t);
        out.scalars.reserve_exact(s);
    }
    let mut r = Reader::new("task args", bytes);
    let _header = r.array::<HEADER_SIZE>()?;
    for i in 0..t {
        let record = r.bytes(TENSOR_SIZE)?;
        let tensor = Tensor::read(&mut Reader::new("tensor", record))
            .map_err(|e| e.within(format_args!("tensors[{i}]")))?;
        if let Some(out) = out.as_deref_mut() {
            out.tensors.push(tensor);
        }
    }
    for _ in 0..s {
        let scalar = r.u64()?;
        if let Some(out) = out.as_deref_mut() {
            out.scalars.push(scalar);
        }
    }
    Ok(())
}
