//! [`RunsOnly`]: a chip that runs only some kernels, for the tests of what
//! a worker offers and what a driver says about a kernel a chip has no
//! body for, on machines without a GPU.
//!
//! It wraps a real chip and changes nothing but [`Device::runs`]: what
//! the wrapped chip does is what it does. It stands for any chip that runs
//! some kernels and not others (a CUDA chip runs those with a CUDA body).

use std::sync::Arc;

use strata_chip_runtime::device::{Completion, DeviceAddr};
use strata_chip_runtime::{
    CachedCopy, Device, DeviceBlock, DeviceInfo, DeviceStats, Error, Kernel, Launch, Region,
};
use strata_wire::{CanonicalIdentity, Footprint};

/// `chip`, running only the kernels named in `names` (by name, every
/// version).
#[derive(Debug)]
pub struct RunsOnly {
    chip: Arc<dyn Device>,
    names: Vec<String>,
}

impl RunsOnly {
    /// `chip`, running only the kernels `names` lists (comma-separated).
    pub fn new(chip: Arc<dyn Device>, names: &str) -> Self {
        RunsOnly {
            chip,
            names: names
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }
}

impl Device for RunsOnly {
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
        self.chip.launch(launch, done)
    }
    fn launch_here(&self, launch: Launch, done: Completion) -> Result<(), Error> {
        self.chip.launch_here(launch, done)
    }
    fn runs(&self, kernel: &dyn Kernel) -> bool {
        self.names.contains(&kernel.descriptor().name) && self.chip.runs(kernel)
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
