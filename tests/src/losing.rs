//! [`Losing`]: a chip that is lost the moment one kernel runs on it, for
//! the tests of what a worker does when its chip can run nothing more, on
//! machines without a GPU.
//!
//! It wraps a real chip. Launching the kernel it is told of fails that
//! launch with the error a GPU whose context a fault lost gives
//! ([`CudaError::ContextLost`]), and from then on every launch fails the
//! same way and [`Device::lost`] says why, as a CUDA chip does after an
//! illegal address. Everything else is the wrapped chip's.

use std::sync::{Arc, Mutex};

use strata_chip_runtime::device::{Completion, DeviceAddr};
use strata_chip_runtime::{
    CachedCopy, CudaError, Device, DeviceBlock, DeviceInfo, DeviceStats, Error, Kernel, Launch,
    Region,
};
use strata_wire::{CanonicalIdentity, Footprint};

/// `chip`, lost when `kernel` (a name) is launched on it.
#[derive(Debug)]
pub struct Losing {
    chip: Arc<dyn Device>,
    kernel: String,
    lost: Mutex<Option<CudaError>>,
}

impl Losing {
    /// `chip`, lost when `kernel` is launched.
    pub fn new(chip: Arc<dyn Device>, kernel: &str) -> Self {
        Losing {
            chip,
            kernel: kernel.to_owned(),
            lost: Mutex::new(None),
        }
    }

    fn cause(&self) -> Option<CudaError> {
        self.lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Device for Losing {
    fn info(&self) -> DeviceInfo {
        self.chip.info()
    }
    fn alloc(&self, region: Region, nbytes: u64) -> Result<DeviceBlock, Error> {
        self.chip.alloc(region, nbytes)
    }
    fn free(&self, addr: DeviceAddr) -> Result<(), Error> {
        self.chip.free(addr)
    }
    fn end_run(&self) -> Result<(), Error> {
        self.chip.end_run()
    }
    fn check_block(&self, block: &DeviceBlock) -> Result<(), Error> {
        self.chip.check_block(block)
    }
    fn copy_to_device(&self, block: &DeviceBlock, offset: u64, src: &[u8]) -> Result<(), Error> {
        self.chip.copy_to_device(block, offset, src)
    }
    fn copy_from_device(
        &self,
        block: &DeviceBlock,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Error> {
        self.chip.copy_from_device(block, offset, dst)
    }
    fn launch(&self, launch: Launch, done: Completion) -> Result<(), Error> {
        if launch.kernel.descriptor().name == self.kernel {
            let mut lost = self
                .lost
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            lost.get_or_insert(CudaError::ContextLost {
                ordinal: 0,
                call: "cuStreamSynchronize",
                name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                code: 700,
            });
        }
        match self.cause() {
            Some(e) => {
                done(Err(e.into()));
                Ok(())
            }
            None => self.chip.launch(launch, done),
        }
    }
    fn runs(&self, kernel: &dyn Kernel) -> bool {
        self.chip.runs(kernel)
    }
    fn lost(&self) -> Option<String> {
        self.cause().map(|e| e.to_string())
    }
    fn synchronize(&self) {
        self.chip.synchronize();
    }
    fn stats(&self) -> DeviceStats {
        self.chip.stats()
    }
    fn flush(&self, owner: u64, pick: &dyn Fn(&Footprint) -> bool) -> u64 {
        self.chip.flush(owner, pick)
    }
    fn drop_copies(&self, owner: u64, identity: Option<&CanonicalIdentity>) -> usize {
        self.chip.drop_copies(owner, identity)
    }
    fn cached(&self) -> Vec<CachedCopy> {
        self.chip.cached()
    }
}
