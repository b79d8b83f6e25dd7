//! `.npy` files (NumPy's array format) in and out of host buffers, via the
//! `npyz` crate for the header; the data is copied as raw little-endian
//! bytes, C order.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use npyz::WriterBuilder;
use strata_wire::DType;

use crate::buffer::View;
use crate::cluster::Cluster;
use crate::error::{Error, NpyError};

/// NumPy's type string for a dtype strata shares with it.
pub fn type_str(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I32 => "<i4",
        DType::I16 => "<i2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I64 => "<i8",
        DType::U64 => "<u8",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::Bool => "|b1",
        DType::C64 => "<c8",
        DType::C128 => "<c16",
        _ => return None,
    })
}

/// The dtype of a NumPy type string (`<f4`, `|u1`, `=i8`...), if strata has it.
pub fn dtype_of(type_str: &str) -> Option<DType> {
    let t = type_str.replacen('=', "<", 1);
    let t = match t.as_bytes() {
        [b'<', rest @ ..] if rest.ends_with(b"1") => format!("|{}", &t[1..]),
        _ => t,
    };
    [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::I64,
        DType::U64,
        DType::U16,
        DType::U32,
        DType::Bool,
        DType::C64,
        DType::C128,
    ]
    .into_iter()
    .find(|&d| self::type_str(d) == Some(t.as_str()))
}

impl Cluster {
    /// A host buffer holding the array of a `.npy` file, and the row-major
    /// view of its shape and dtype (C order, little-endian; dtypes f8, f4, f2,
    /// i1–i8, u1–u8, b1, c8, c16; 1 to 5 dimensions).
    ///
    /// # Errors
    /// [`Error::Npy`] naming the file and what is wrong with it.
    pub fn buffer_from_npy(&self, path: impl AsRef<Path>) -> Result<View, Error> {
        let path = path.as_ref();
        let bad = |reason: NpyError| Error::Npy {
            path: path.display().to_string(),
            reason,
        };
        let file = File::open(path).map_err(|e| bad(NpyError::Io(e)))?;
        let npy = npyz::NpyFile::new(BufReader::new(file)).map_err(|e| bad(NpyError::NotNpy(e)))?;
        let ts = match npy.dtype() {
            npyz::DType::Plain(ts) => ts.to_string(),
            other => return Err(bad(NpyError::Structured(format!("{other:?}")))),
        };
        let dtype = dtype_of(&ts).ok_or_else(|| bad(NpyError::UnsupportedDType(ts.clone())))?;
        if npy.order() != npyz::Order::C {
            return Err(bad(NpyError::FortranOrder));
        }
        let shape: Vec<u64> = match npy.shape() {
            [] => vec![1],
            s => s.to_vec(),
        };
        if shape.len() > strata_wire::MAX_DIMS {
            return Err(bad(NpyError::TooManyDims {
                dims: shape.len(),
                max: strata_wire::MAX_DIMS,
            }));
        }
        let dims = shape
            .iter()
            .map(|&d| match u32::try_from(d) {
                Ok(d) if d > 0 => Ok(d),
                _ => Err(bad(NpyError::BadDimension(shape.clone()))),
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let elem = u64::from(dtype.bits() / 8);
        let nbytes = shape
            .iter()
            .try_fold(elem, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(NpyError::Overflow(shape.clone())))?;
        let len = usize::try_from(nbytes).map_err(|_| bad(NpyError::TooLarge(nbytes)))?;
        let mut data = vec![0u8; len];
        npy.into_inner()
            .read_exact(&mut data)
            .map_err(|source| bad(NpyError::ShortData { nbytes, source }))?;
        let buffer = self.buffer(nbytes)?;
        buffer.write_bytes(0, &data)?;
        buffer.tensor(&dims, dtype)
    }
}

impl View {
    /// Writes the view's elements (row-major) to a `.npy` file of its shape
    /// and dtype. Host buffers; read after the tasks that write the view
    /// are done.
    ///
    /// # Errors
    /// A dtype NumPy does not share, a device buffer, or the file.
    pub fn save_npy(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        let bad = |reason: NpyError| Error::Npy {
            path: path.display().to_string(),
            reason,
        };
        let ts = type_str(self.dtype()).ok_or_else(|| bad(NpyError::NoNumpyDType(self.dtype())))?;
        let bytes = self.read_elements()?;
        let file = File::create(path).map_err(|e| bad(NpyError::Io(e)))?;
        let mut out = BufWriter::new(file);
        let shape: Vec<u64> = self.shape().iter().map(|&d| u64::from(d)).collect();
        let dtype = npyz::DType::Plain(
            ts.parse()
                .map_err(|e| bad(NpyError::TypeStr(format!("{e}"))))?,
        );
        npyz::WriteOptions::new_header_only()
            .dtype(dtype)
            .shape(&shape)
            .writer(&mut out)
            .write_header_only()
            .map_err(|e| bad(NpyError::Io(e)))?;
        out.write_all(&bytes)
            .and_then(|()| out.flush())
            .map_err(|e| bad(NpyError::Io(e)))
    }
}
