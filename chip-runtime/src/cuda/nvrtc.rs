//! Compiling kernel sources with NVRTC.

use super::probe::{Library, require_library};
use crate::error::CudaError;
use crate::kernel::cuda::CUDA_PRELUDE;

/// Compiles `code` (the prelude in front) to PTX for `arch`
/// (`compute_90`), or NVRTC's default.
///
/// # Errors
/// [`CudaError::LibraryMissing`] without NVRTC; [`CudaError::Compile`]
/// with NVRTC's log.
pub fn compile(kernel: &str, code: &str, arch: Option<&str>) -> Result<String, CudaError> {
    require_library(Library::Nvrtc)?;
    let fail = |log: String| CudaError::Compile {
        kernel: kernel.into(),
        log,
    };
    if code.contains('\0') {
        return Err(fail("the source has a NUL byte".into()));
    }
    let mut options = vec!["--std=c++17".to_owned()];
    if let Some(a) = arch {
        options.push(format!("--gpu-architecture={a}"));
    }
    let source = format!("{CUDA_PRELUDE}\n{code}");
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
            Err(fail(log.to_string_lossy().into_owned()))
        }
        Err(e) => Err(fail(format!("{e:?}"))),
    }
}
