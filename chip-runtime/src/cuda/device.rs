//! Opening a GPU as a chip.

use std::sync::Arc;

use strata_boundary::DTypeSet;

use super::engine::{CudaEngine, Gpu, mem_info};
use crate::chip::{Chip, ChipConfig};
use crate::cuda::probe::{Library, device_count, require_library};
use crate::error::CudaError;
use crate::spec::{CudaOrdinal, CudaSpec, DeviceSpec, Mode};
use crate::{Device, Error};

/// Opens device `spec.ordinal` as a chip: the driver, NVRTC, cuBLAS and
/// cuSOLVER must load, the device exist, and the memory asked for (by
/// default 90 % of what is free) be allocated.
///
/// # Errors
/// [`Error::Spec`] for `cuda:all` (one chip is one GPU) or regions that do
/// not fit; the [`CudaError`] naming what is missing or failed.
pub fn open(spec: &CudaSpec) -> Result<Arc<dyn Device>, Error> {
    let CudaOrdinal::Index(ordinal) = spec.ordinal else {
        return Err(Error::Spec {
            spec: spec.to_string(),
            reason: "cuda:all names every GPU and one chip is one GPU: start one worker per GPU (strata run, strata demo and Python's Cluster do this for the workers they start)".into(),
        });
    };
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoDevice { ordinal, count }.into());
    }
    for lib in [Library::Nvrtc, Library::Cublas, Library::Cusolver] {
        require_library(lib)?;
    }
    let gpu = Arc::new(Gpu::open(ordinal)?);
    gpu.bind()?;
    let mem = match spec.mem {
        Some(m) => m,
        None => {
            let (free, _) = mem_info().map_err(|code| gpu.fail("cuMemGetInfo", code))?;
            free / 10 * 9
        }
    };
    let (mem, run, scratch) = spec.regions(mem)?;
    // The spec as given, not the sizes it resolved to: what a run found
    // free varies, and the spec is what the performance models key a
    // kind of chip by (the sizes are in `DeviceInfo::memory` and the
    // arena's statistics).
    let label = spec.to_string();
    let core = DeviceSpec {
        mem,
        mode: Mode::Staged,
        lanes: spec.streams,
        run,
        scratch,
        prefetch: spec.prefetch,
        timing: false,
        gflops: 50,
        link: None,
        latency_us: 0,
        dtypes: DTypeSet::ALL,
    };
    let engine = CudaEngine::new(gpu, mem, spec.streams)?;
    Ok(Arc::new(Chip::build(
        ChipConfig { spec: core, label },
        Box::new(engine),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver, opening names it; `cuda:all` is refused as one
    /// chip whatever the machine.
    #[test]
    fn opening_says_what_is_missing() {
        let all: CudaSpec = "cuda:all".parse().unwrap();
        let e = open(&all).err().unwrap();
        assert!(e.to_string().contains("one chip is one GPU"), "{e}");
        match crate::open("cuda:0,mem=64MiB") {
            Ok(d) => {
                let info = d.info();
                assert_eq!(info.kind, "cuda");
                assert!(info.spec.starts_with("cuda:0,mem=64MiB"), "{}", info.spec);
            }
            Err(Error::Cuda(e @ (CudaError::NoDriver { .. } | CudaError::NoDevice { .. }))) => {
                println!("cuda:0 not opened here: {e}");
            }
            Err(e) => panic!("unexpected: {e}"),
        }
    }
}
