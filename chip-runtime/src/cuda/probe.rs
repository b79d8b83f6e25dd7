//! Is CUDA here? The driver, the devices, the libraries — each absence a
//! typed error, never the loader's panic.

use std::path::Path;

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

/// What this process finds of CUDA: the driver, its GPUs and each
/// library, with versions and the files loaded (`strata devices` prints
/// it). Every absence is in it, not an error.
#[derive(Debug, Clone)]
pub struct Inventory {
    /// The driver, and the CUDA version it supports.
    pub driver: Result<Found, CudaError>,
    /// The GPUs the driver sees (none without a driver).
    pub gpus: Vec<GpuFound>,
    /// NVRTC, cuBLAS and cuSOLVER, in that order.
    pub libraries: Vec<(Library, Result<Found, CudaError>)>,
}

/// A library that loads: its version and the file it was loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// `major.minor` (with the patch level where the library tells it).
    pub version: String,
    /// The file mapped into this process, where it can be told.
    pub path: Option<String>,
}

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFound {
    /// Its ordinal (`cuda:N`).
    pub ordinal: u32,
    /// The device's name.
    pub name: String,
    /// Its memory, bytes.
    pub memory: u64,
    /// Compute capability, major and minor.
    pub capability: (u32, u32),
    /// The compute mode: `default`, `prohibited` or `exclusive process`
    /// (where a second process, a second worker or the driver's mapping,
    /// cannot use the GPU).
    pub compute_mode: &'static str,
}

impl Inventory {
    /// Whether a `cuda:N` chip opens here: the driver, a GPU and every
    /// library.
    pub fn usable(&self) -> bool {
        self.driver.is_ok()
            && !self.gpus.is_empty()
            && self.libraries.iter().all(|(_, l)| l.is_ok())
    }

    /// Why kernels compiled here would not load, if they would not: an
    /// NVRTC of a newer major CUDA version than the driver's writes
    /// machine code the driver does not take (within one major version
    /// a chip's CUBINs load whichever is newer).
    pub fn mismatch(&self) -> Option<String> {
        let driver = self.driver.as_ref().ok()?;
        let nvrtc = self
            .libraries
            .iter()
            .find(|(l, _)| *l == Library::Nvrtc)?
            .1
            .as_ref()
            .ok()?;
        let parse = |v: &str| -> Option<(u32, u32)> {
            let mut it = v.split('.').map(str::parse::<u32>);
            Some((it.next()?.ok()?, it.next()?.ok()?))
        };
        let (d, n) = (parse(&driver.version)?, parse(&nvrtc.version)?);
        (n.0 > d.0).then(|| {
            format!(
                "NVRTC {} is of a newer CUDA than the driver's {}, which does not load its code: put an NVRTC of CUDA {}.x first on LD_LIBRARY_PATH",
                nvrtc.version, driver.version, d.0
            )
        })
    }
}

/// Takes the [`Inventory`] of this machine (loading the libraries it
/// finds; nothing is allocated on a GPU).
pub fn inventory() -> Inventory {
    let driver = driver_version();
    let gpus = if driver.is_ok() { gpus() } else { Vec::new() };
    let libraries = [Library::Nvrtc, Library::Cublas, Library::Cusolver]
        .into_iter()
        .map(|l| (l, library_version(l)))
        .collect();
    Inventory {
        driver,
        gpus,
        libraries,
    }
}

fn driver_version() -> Result<Found, CudaError> {
    device_count()?;
    let mut v = 0;
    // SAFETY: the driver loads (device_count); one int written.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    let version = if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        format!("{}.{}", v / 1000, v % 1000 / 10)
    } else {
        format!("unknown ({r:?})")
    };
    Ok(Found {
        version,
        path: loaded_from("libcuda.so"),
    })
}

fn gpus() -> Vec<GpuFound> {
    use cudarc::driver::result::device;
    use cudarc::driver::sys::CUdevice_attribute as A;
    let n = device_count().unwrap_or(0);
    (0..n)
        .filter_map(|ordinal| {
            let dev = device::get(ordinal as i32).ok()?;
            // SAFETY: a device the driver returned.
            let attr = |a| unsafe { device::get_attribute(dev, a) }.unwrap_or(-1);
            Some(GpuFound {
                ordinal,
                name: device::get_name(dev).unwrap_or_else(|e| format!("unnamed ({e:?})")),
                // SAFETY: as above.
                memory: unsafe { device::total_mem(dev) }.map_or(0, |b| b as u64),
                capability: (
                    attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) as u32,
                    attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) as u32,
                ),
                compute_mode: match attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE) {
                    0 => "default",
                    2 => "prohibited",
                    3 => "exclusive process",
                    _ => "unknown",
                },
            })
        })
        .collect()
}

fn library_version(lib: Library) -> Result<Found, CudaError> {
    require_library(lib)?;
    let (mut major, mut minor, mut patch) = (0, 0, -1);
    // SAFETY: the library loads (just checked); each call writes one or
    // two ints through pointers to live locals.
    let ok = unsafe {
        match lib {
            Library::Nvrtc => {
                cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor)
                    == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS
            }
            Library::Cublas => {
                use cudarc::cublas::sys::{cublasGetProperty as get, libraryPropertyType as P};
                let ok = cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
                get(P::MAJOR_VERSION, &mut major) == ok
                    && get(P::MINOR_VERSION, &mut minor) == ok
                    && get(P::PATCH_LEVEL, &mut patch) == ok
            }
            Library::Cusolver => {
                use cudarc::cusolver::sys::{cusolverGetProperty as get, libraryPropertyType as P};
                let ok = cudarc::cusolver::sys::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS;
                get(P::MAJOR_VERSION, &mut major) == ok
                    && get(P::MINOR_VERSION, &mut minor) == ok
                    && get(P::PATCH_LEVEL, &mut patch) == ok
            }
            Library::Driver => false,
        }
    };
    let version = match (ok, patch) {
        (false, _) => "unknown".to_owned(),
        (true, p) if p >= 0 => format!("{major}.{minor}.{p}"),
        (true, _) => format!("{major}.{minor}"),
    };
    let stem = match lib {
        Library::Nvrtc => "libnvrtc.so",
        Library::Cublas => "libcublas.so",
        Library::Cusolver => "libcusolver.so",
        Library::Driver => "libcuda.so",
    };
    Ok(Found {
        version,
        path: loaded_from(stem),
    })
}

/// The file mapped into this process whose name starts with `stem`
/// (such as `libcublas.so`: not `libcublasLt.so`), from /proc/self/maps.
fn loaded_from(stem: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(stem))
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inventory says what is here: on a machine without a driver,
    /// the driver's absence and no GPU; the version check compares
    /// `major.minor` only.
    #[test]
    fn the_inventory_names_what_is_missing() {
        let inv = inventory();
        match &inv.driver {
            Ok(d) => println!(
                "CUDA driver {} ({:?}), GPUs {:?}",
                d.version, d.path, inv.gpus
            ),
            Err(e) => {
                assert!(matches!(e, CudaError::NoDriver { .. }), "{e}");
                assert!(inv.gpus.is_empty());
                assert!(!inv.usable());
            }
        }
        assert_eq!(inv.libraries.len(), 3);
        let found = |v: &str| Found {
            version: v.into(),
            path: None,
        };
        let with = |driver: &str, nvrtc: &str| Inventory {
            driver: Ok(found(driver)),
            gpus: Vec::new(),
            libraries: vec![(Library::Nvrtc, Ok(found(nvrtc)))],
        };
        assert_eq!(with("13.0", "13.0").mismatch(), None);
        assert_eq!(with("13.1", "13.0.2").mismatch(), None);
        assert_eq!(with("13.0", "13.2").mismatch(), None, "a newer minor loads");
        let m = with("13.0", "14.1").mismatch().unwrap();
        assert!(
            m.contains("NVRTC 14.1") && m.contains("driver's 13.0"),
            "{m}"
        );
        assert_eq!(loaded_from("no-such-library.so"), None);
    }

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
