//! Source kernels on a GPU: compiled once per worker (NVRTC), loaded as a
//! module, launched with the task's arguments as parameters.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use rustc_hash::FxHashMap;
use strata_wire::{ChipTensor, DType};

use super::engine::{Gpu, Raw, lock};
use super::shape::dims;
use crate::Error;
use crate::error::CudaError;
use crate::kernel::Signature;
use crate::kernel::cuda::{
    CudaSource, DEFAULT_SHARED_BYTES, Entry, MAX_PARAM_BYTES, TENSOR_PARAM_BYTES,
};

/// A loaded function and the dynamic shared memory its launches may ask
/// so far (the driver's default, or what was asked for it).
type Loaded = (Raw<sys::CUfunction>, u32);

/// One kernel's loaded functions: (version, the dtype its symbol was
/// chosen by) → function.
type Versions = smallvec::SmallVec<[(u32, Option<DType>, Loaded); 2]>;

/// The functions of loaded modules, by kernel and symbol.
#[derive(Debug)]
pub(crate) struct Functions {
    gpu: Arc<Gpu>,
    /// Kernel (`name@version`) → its module, loaded once.
    modules: Mutex<HashMap<String, Raw<sys::CUmodule>>>,
    /// Kernel name → its loaded functions. A kernel's source, and so the
    /// symbol a dtype picks, is fixed by its name and version in a
    /// registry, so a launch finds its function by those and the dtype of
    /// its first tensor, with no string built or hashed but the name (a
    /// launch is a few microseconds on a GPU).
    functions: Mutex<FxHashMap<String, Versions>>,
}

impl Functions {
    pub(crate) fn new(gpu: Arc<Gpu>) -> Self {
        Functions {
            gpu,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(FxHashMap::default()),
        }
    }

    /// Unloads every module (the context is current).
    pub(crate) fn unload(&mut self) {
        lock(&self.functions).clear();
        for (_, m) in lock(&self.modules).drain() {
            // SAFETY: loaded by us, unloaded once, no launch pending.
            unsafe { sys::cuModuleUnload(m.0) };
        }
    }

    /// The function `kernel`'s source calls for a first tensor of `dtype`,
    /// compiling and loading the source the first time, allowed `shared`
    /// bytes of dynamic shared memory (beyond 48 KiB the driver must be
    /// asked first).
    fn function(
        &self,
        kernel: &Signature,
        src: &CudaSource,
        dtype: Option<DType>,
        shared: u32,
    ) -> Result<sys::CUfunction, Error> {
        let known = lock(&self.functions)
            .get(kernel.name.as_str())
            .and_then(|v| {
                v.iter()
                    .find(|(version, d, _)| *version == kernel.version && *d == dtype)
                    .map(|(_, _, loaded)| *loaded)
            });
        let f = match known {
            Some((f, allowed)) if shared <= allowed => return Ok(f.0),
            Some((f, _)) => f.0,
            None => self.load(&kernel.qualified_name(), src, &src.entry.symbol(dtype))?,
        };
        let allowed = if shared > DEFAULT_SHARED_BYTES {
            let value = i32::try_from(shared).unwrap_or(i32::MAX);
            // SAFETY: a function of a loaded module; the context is
            // current (the engine bound it).
            let r = unsafe {
                sys::cuFuncSetAttribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    value,
                )
            };
            if r == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
                return Err(Error::KernelFailed {
                    kernel: kernel.qualified_name(),
                    reason: format!(
                        "its grid asks {shared} bytes of dynamic shared memory, more than this GPU gives a block"
                    ),
                });
            }
            self.gpu.check("cuFuncSetAttribute", r)?;
            shared
        } else {
            DEFAULT_SHARED_BYTES
        };
        let mut functions = lock(&self.functions);
        let versions = functions.entry(kernel.name.clone()).or_default();
        match (versions.iter_mut())
            .find(|(version, d, _)| *version == kernel.version && *d == dtype)
        {
            Some((_, _, loaded)) => loaded.1 = loaded.1.max(allowed),
            None => versions.push((kernel.version, dtype, (Raw(f), allowed))),
        }
        Ok(f)
    }

    /// Loads `symbol` of `kernel`'s source, compiling and loading the
    /// module the first time.
    fn load(&self, kernel: &str, src: &CudaSource, symbol: &str) -> Result<sys::CUfunction, Error> {
        let module = {
            let mut modules = lock(&self.modules);
            match modules.get(kernel) {
                Some(m) => m.0,
                None => {
                    // Machine code for this GPU: it loads whatever NVRTC of
                    // the driver's major version wrote, with nothing for
                    // the driver to compile.
                    let (major, minor) = self.gpu.capability()?;
                    let arch = format!("sm_{major}{minor}");
                    let cubin = super::nvrtc::compile_cubin(kernel, &src.code, &arch)?;
                    let mut m: sys::CUmodule = std::ptr::null_mut();
                    // SAFETY: a whole CUBIN image, alive across the call
                    // (the driver copies it); the context is current (the
                    // engine bound it).
                    let r = unsafe { sys::cuModuleLoadData(&mut m, cubin.bytes().as_ptr().cast()) };
                    // Code the driver does not take: NVRTC of a newer CUDA
                    // than the driver's, said with both versions.
                    if r != sys::CUresult::CUDA_SUCCESS
                        && let Some(why) = super::probe::inventory().mismatch()
                    {
                        return Err(CudaError::Compile {
                            kernel: kernel.into(),
                            log: format!("the driver refused the module ({r:?}): {why}"),
                        }
                        .into());
                    }
                    self.gpu.check("cuModuleLoadData", r)?;
                    modules.insert(kernel.to_owned(), Raw(m));
                    m
                }
            }
        };
        let name = CString::new(symbol).map_err(|_| CudaError::Compile {
            kernel: kernel.into(),
            log: format!("entry {symbol:?} has a NUL byte"),
        })?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
        if r == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(CudaError::Compile {
                kernel: kernel.into(),
                log: format!("its source has no function {symbol:?} (an extern \"C\" __global__ function of that name)"),
            }
            .into());
        }
        self.gpu.check("cuModuleGetFunction", r)?;
        Ok(f)
    }

    /// Queues `src`, the source of `kernel`, on `stream` with `args` and
    /// `scalars` as parameters.
    pub(crate) fn launch(
        &self,
        kernel: &Signature,
        src: &CudaSource,
        args: &[ChipTensor],
        scalars: &[u64],
        stream: Raw<sys::CUstream>,
    ) -> Result<(), Error> {
        let bytes = args.len() * TENSOR_PARAM_BYTES + scalars.len() * 8;
        if bytes > MAX_PARAM_BYTES {
            return Err(Error::KernelFailed {
                kernel: kernel.qualified_name(),
                reason: format!(
                    "{} tensors and {} scalars take {bytes} bytes of parameters; a CUDA kernel takes at most {MAX_PARAM_BYTES}",
                    args.len(),
                    scalars.len()
                ),
            });
        }
        let Some(d) = dims(src.grid, args).map_err(|reason| Error::KernelFailed {
            kernel: kernel.qualified_name(),
            reason,
        })?
        else {
            return Ok(());
        };
        // The symbol depends on the dtype only for a per-dtype entry.
        let dtype = match src.entry {
            Entry::One(_) => None,
            Entry::PerDType(_) => args.first().map(ChipTensor::dtype),
        };
        let f = self.function(kernel, src, dtype, d.shared)?;
        // Each parameter is a pointer to its value: the tensors (128-byte
        // ChipTensors, the prelude's strata_tensor) then the scalars.
        let mut params: smallvec::SmallVec<[*mut c_void; 16]> =
            smallvec::SmallVec::with_capacity(args.len() + scalars.len());
        for a in args {
            params.push(std::ptr::from_ref(a).cast_mut().cast());
        }
        for s in scalars {
            params.push(std::ptr::from_ref(s).cast_mut().cast());
        }
        // SAFETY: `f` takes these parameters in this order (the calling
        // convention every source follows); each pointer is valid until
        // the call returns, when the driver has copied the values.
        let r = unsafe {
            sys::cuLaunchKernel(
                f,
                d.blocks[0],
                d.blocks[1],
                d.blocks[2],
                d.threads[0],
                d.threads[1],
                d.threads[2],
                d.shared,
                stream.0,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.gpu.check("cuLaunchKernel", r)
    }
}
