//! `CudaDevice`: a GPU as a chip.

use std::sync::Arc;

use crate::cuda::probe::{Library, device_count, require_library};
use crate::error::CudaError;
use crate::spec::{CudaOrdinal, CudaSpec};
use crate::{Device, Error};

/// Opens device `spec.ordinal` as a chip.
///
/// # Errors
/// [`Error::Spec`] for `cuda:all` (one chip is one GPU); the
/// [`CudaError`] naming what is missing or failed.
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
    Err(Error::Spec {
        spec: spec.to_string(),
        reason: "the CUDA chip's device half is not built yet".into(),
    })
}
