//! Why a `.npy` file or a trace could not be read or written.

use std::io;
use std::path::PathBuf;

use strata_wire::DType;

/// Why a `.npy` file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NpyError {
    /// Opening, creating or writing the file.
    #[error("{0}")]
    Io(#[source] io::Error),
    /// Its header is not a `.npy` header.
    #[error("not a .npy file: {0}")]
    NotNpy(#[source] io::Error),
    /// A structured (record) dtype.
    #[error("structured dtype {0} is not supported")]
    Structured(String),
    /// A dtype strata does not share with NumPy.
    #[error("dtype {0:?} is not supported (little-endian f4, f2, i1-i8, u1-u8, b1)")]
    UnsupportedDType(String),
    /// Fortran order.
    #[error("Fortran-order arrays are not supported; save with C order")]
    FortranOrder,
    /// More dimensions than a view may have.
    #[error("{dims} dimensions; at most {max}")]
    TooManyDims {
        /// Its dimensions.
        dims: usize,
        /// The most a view has.
        max: usize,
    },
    /// A dimension of 0 or of 2^32 and more.
    #[error("shape {0:?}: every dimension must be 1 to 2^32-1")]
    BadDimension(Vec<u64>),
    /// A shape whose byte size overflows.
    #[error("shape {0:?} overflows")]
    Overflow(Vec<u64>),
    /// More bytes than this machine can hold.
    #[error("{0} bytes")]
    TooLarge(u64),
    /// The data ends early.
    #[error("data: expected {nbytes} bytes: {source}")]
    ShortData {
        /// Bytes the header promises.
        nbytes: u64,
        /// Why the read stopped.
        source: io::Error,
    },
    /// A view whose dtype NumPy does not have.
    #[error("{} has no NumPy dtype", .0.name())]
    NoNumpyDType(DType),
    /// NumPy's type string for the dtype did not parse (a bug here).
    #[error("{0}")]
    TypeStr(String),
}

/// Why a trace could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Serializing the trace.
    #[error("{}: {source}", .path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// Writing the file.
    #[error("{}: {source}", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}
