//! Is CUDA here? The driver, the devices, the libraries — each absence a
//! typed error, never the loader's panic.

use crate::error::CudaError;

/// A CUDA library the chip loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    /// The driver (`libcuda.so.1`).
    Driver,
    /// The runtime compiler (`libnvrtc.so.13`), for kernel sources.
    Nvrtc,
    /// cuBLAS (`libcublas.so.13`), for the matrix kernels.
    Cublas,
    /// cuSOLVER (`libcusolver.so.12`), for `potrf`.
    Cusolver,
}

impl Library {
    /// The file name looked for first.
    pub fn file(self) -> &'static str {
        match self {
            Library::Driver => "libcuda.so.1",
            Library::Nvrtc => "libnvrtc.so.13",
            Library::Cublas => "libcublas.so.13",
            Library::Cusolver => "libcusolver.so.12",
        }
    }

    /// What the chip needs it for.
    pub fn purpose(self) -> &'static str {
        match self {
            Library::Driver => "the CUDA driver",
            Library::Nvrtc => "NVRTC, to compile kernel sources",
            Library::Cublas => "cuBLAS, for matmul, gemm, trsm and syrk",
            Library::Cusolver => "cuSOLVER, for potrf",
        }
    }

    /// Whether it can be loaded.
    pub fn present(self) -> bool {
        // SAFETY: each only tries to dlopen the library by its candidate
        // names and drops what it opened; no symbol is called.
        unsafe {
            match self {
                Library::Driver => cudarc::driver::sys::is_culib_present(),
                Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Library::Cublas => cudarc::cublas::sys::is_culib_present(),
                Library::Cusolver => cudarc::cusolver::sys::is_culib_present(),
            }
        }
    }
}

/// Checks that `lib` can be loaded.
///
/// # Errors
/// [`CudaError::NoDriver`] for the driver, [`CudaError::LibraryMissing`]
/// for the others.
pub fn require_library(lib: Library) -> Result<(), CudaError> {
    if lib.present() {
        return Ok(());
    }
    Err(match lib {
        Library::Driver => CudaError::NoDriver {
            lib: lib.file().into(),
        },
        _ => CudaError::LibraryMissing {
            lib: lib.file().into(),
            purpose: lib.purpose(),
        },
    })
}

/// The CUDA devices the driver sees.
///
/// # Errors
/// [`CudaError::NoDriver`] without a driver; [`CudaError::Call`] when
/// the driver fails to initialize (ordinal 0 is named: no device is
/// addressed yet).
pub fn device_count() -> Result<u32, CudaError> {
    require_library(Library::Driver)?;
    let fail = |call: &'static str, e: cudarc::driver::DriverError| CudaError::Call {
        ordinal: 0,
        call,
        name: e.error_name().map_or_else(
            |_| format!("{:?}", e.0),
            |n| n.to_string_lossy().into_owned(),
        ),
        code: e.0 as u32,
    };
    cudarc::driver::result::init().map_err(|e| fail("cuInit", e))?;
    let n = cudarc::driver::result::device::get_count().map_err(|e| fail("cuDeviceGetCount", e))?;
    Ok(u32::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without the driver, absence is an error naming the
    /// library, not a panic; with one, a count.
    #[test]
    fn absence_is_a_typed_error() {
        match device_count() {
            Ok(n) => println!("CUDA driver present, {n} device(s)"),
            Err(e) => {
                assert!(matches!(e, CudaError::NoDriver { .. }), "{e}");
                assert!(e.to_string().contains("libcuda.so.1"), "{e}");
            }
        }
    }
}
