//! Mapping shared device memory in this process ([`SharedMemory::map`]):
//! apart from [`crate::shared`], which every chip kind uses, because a
//! GPU's memory needs its driver to map.

use crate::Error;
use crate::shared::{MappedMemory, Place, SharedMemory, map_host};

impl SharedMemory {
    /// Maps the memory in this process, read-write.
    ///
    /// # Errors
    /// [`Error::Shared`] for a descriptor that does not check out (see
    /// [`crate::shared`]) or a mapping that fails; a [`crate::CudaError`]
    /// where the GPU or its driver is missing or refuses the handle.
    pub fn map(&self) -> Result<MappedMemory, Error> {
        match self.place {
            Place::Host => map_host(&self.fd, self.len),
            Place::Cuda(ordinal) => {
                let (addr, imported) = crate::cuda::vmm::import(&self.fd, self.len, ordinal)?;
                Ok(MappedMemory {
                    addr,
                    len: self.len,
                    place: self.place,
                    mapping: Box::new(imported),
                })
            }
        }
    }
}
