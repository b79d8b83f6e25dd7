//! Device buffers: allocated on one worker (persistent, or for the current
//! run), written and read by control calls, checked alive before a task
//! or a call uses them.

use strata_chip_runtime::Region;
use strata_orchestrator_core::WorkerId;
use strata_wire::{Access, AddressSpace, Backing as WireBacking, BufferDescriptor};

use super::Cluster;
use crate::actors::EpCmd;
use crate::buffer::{Backing, Buffer, DeviceExport, DeviceShared};
use crate::error::{BufferError, Error, SubmitError};
use crate::link::LinkError;

impl Cluster {
    /// A device buffer of `nbytes` in `worker`'s device memory (persistent
    /// region), zeroed. Tasks that use it run on that worker.
    ///
    /// # Errors
    /// An unknown worker, or the worker's refusal (out of memory names the
    /// region).
    pub fn device_buffer(&self, worker: WorkerId, nbytes: u64) -> Result<Buffer, Error> {
        self.device_alloc(worker, nbytes, Region::Persistent, None)
    }

    /// A *shared* device buffer of `nbytes` on `worker`, zeroed: device
    /// memory of its own (not the worker's arena), which
    /// [`Cluster::export_device`] hands to this process as a file
    /// descriptor to map. Tasks use it as any device buffer.
    ///
    /// # Errors
    /// As [`Cluster::device_buffer`]; a chip that cannot share memory
    /// names itself.
    pub fn shared_buffer(&self, worker: WorkerId, nbytes: u64) -> Result<Buffer, Error> {
        self.device_alloc(worker, nbytes, Region::Shared, None)
    }

    /// A new file descriptor of the shared device buffer `buffer`
    /// ([`Cluster::shared_buffer`]), from its worker in this process or
    /// on this host's Unix socket: [`SharedMemory::map`] maps the same
    /// memory here (host memory for a simulated chip, device memory of
    /// the same GPU for a CUDA one), so that reads see the tasks' writes
    /// once they have ended and writes reach the tasks that come after.
    /// Each call gives a descriptor of its own; the memory stays while
    /// any mapping or descriptor holds it, even after the buffer is
    /// dropped.
    ///
    /// # Errors
    /// [`Error::Buffer`] for a host buffer; the worker's refusal for a
    /// buffer that is not a shared one; a worker over TCP (device memory
    /// leaves a worker only by fd); a lost worker.
    ///
    /// [`SharedMemory::map`]: strata_chip_runtime::shared::SharedMemory::map
    pub fn export_device(&self, buffer: &Buffer) -> Result<DeviceExport, Error> {
        let d = match buffer.backing()? {
            Backing::Device(d) => d,
            Backing::Host(_) => {
                return Err(BufferError::OnHost {
                    buffer: buffer.identity(),
                }
                .into());
            }
        };
        self.check_alive(&d)?;
        let identity = buffer.identity();
        let memory = self.ask_endpoint(d.worker, |reply| EpCmd::Export { identity, reply })?;
        Ok(DeviceExport::new(
            memory,
            identity,
            std::sync::Arc::clone(&d.marks),
        ))
    }

    /// A device buffer of `nbytes` in `worker`'s *run* region, which lives
    /// until the current run ends: the next [`Cluster::wait_all`] (or the
    /// cluster's shutdown). The worker then reclaims the whole run region
    /// at once — no per-buffer free, no fragmentation — and the buffer is
    /// refused from then on, by the driver at once ([`Error::Buffer`] or
    /// [`Error::Submit`] naming the run) and by the worker as a backstop.
    /// For intermediates of one job; keep data that outlives it in
    /// [`Cluster::device_buffer`].
    ///
    /// # Errors
    /// As [`Cluster::device_buffer`] (out of memory names the run region).
    pub fn run_buffer(&self, worker: WorkerId, nbytes: u64) -> Result<Buffer, Error> {
        let run = self.run.load(std::sync::atomic::Ordering::Acquire);
        if let Some(used) = self.run_used.get(worker.0 as usize) {
            used.store(true, std::sync::atomic::Ordering::Release);
        }
        self.device_alloc(worker, nbytes, Region::Run, Some(run))
    }

    /// The number of the current run: 0 at the start, one more after each
    /// [`Cluster::wait_all`].
    pub fn current_run(&self) -> u64 {
        self.run.load(std::sync::atomic::Ordering::Acquire)
    }

    fn device_alloc(
        &self,
        worker: WorkerId,
        nbytes: u64,
        region: Region,
        run: Option<u64>,
    ) -> Result<Buffer, Error> {
        let incarnation = self
            .lives
            .get(worker.0 as usize)
            .ok_or(SubmitError::NoWorker { worker })?
            .incarnation();
        let identity = self.mint.mint().map_err(BufferError::Identity)?;
        let addr = self.ask_endpoint(worker, |reply| EpCmd::DeviceAlloc {
            identity,
            nbytes,
            region,
            reply,
        })?;
        let addr = std::num::NonZeroU64::new(addr).ok_or_else(|| Error::Worker {
            worker,
            error: LinkError::Internal("device address 0".into()),
        })?;
        let path = self
            .owners
            .get(worker.0 as usize)
            .ok_or(SubmitError::NoWorker { worker })?
            .clone();
        // The worker owns it: its descriptor names the worker's path id
        // (a diagnostic; the worker finds the buffer by its identity).
        let desc = BufferDescriptor::new(
            identity,
            nbytes,
            AddressSpace::Device,
            Access::ReadWrite,
            WireBacking::DeviceMalloc { addr },
        )
        .map_err(BufferError::Descriptor)?
        .with_owner_worker_path_id(path.id);
        Ok(Buffer::device(DeviceShared {
            desc,
            worker,
            path,
            incarnation,
            run,
            marks: std::sync::Arc::default(),
            shared: region == Region::Shared,
            importers: std::sync::Mutex::default(),
            notify: self.released.clone(),
        }))
    }

    /// Maps the shared buffer `d` on `worker` (its owner exports it, the
    /// worker imports the descriptor), unless the worker mapped it in its
    /// present incarnation already.
    pub(super) fn import_on(&self, d: &DeviceShared, worker: WorkerId) -> Result<(), Error> {
        let incarnation = self
            .lives
            .get(worker.0 as usize)
            .ok_or(SubmitError::NoWorker { worker })?
            .incarnation();
        let mut importers = d
            .importers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if importers.contains(&(worker, incarnation)) {
            return Ok(());
        }
        let identity = *d.desc.identity();
        let memory = self.ask_endpoint(d.worker, |reply| EpCmd::Export { identity, reply })?;
        // A worker lost and back holds nothing of its old session: its
        // entry goes; its old mapping went with that session.
        importers.retain(|(w, _)| *w != worker);
        self.ask_endpoint(worker, |reply| EpCmd::ImportShared {
            identity,
            memory,
            reply,
        })?;
        importers.push((worker, incarnation));
        Ok(())
    }

    fn device_of(&self, buffer: &Buffer) -> Result<WorkerId, Error> {
        match buffer.backing()? {
            Backing::Device(d) => {
                self.check_alive(&d)?;
                Ok(d.worker)
            }
            Backing::Host(_) => Err(BufferError::OnHost {
                buffer: buffer.identity(),
            }
            .into()),
        }
    }

    /// Refuses a device buffer whose worker was lost since it was
    /// allocated (its contents went with the worker), and a run buffer
    /// whose run has ended (its memory went with the run).
    pub(super) fn check_alive(&self, d: &DeviceShared) -> Result<(), BufferError> {
        let current = self.current_run();
        if let Some(run) = d.run.filter(|r| *r != current) {
            return Err(BufferError::RunEnded {
                buffer: *d.desc.identity(),
                worker: d.worker,
                path: d.path.clone(),
                run,
                current,
            });
        }
        let now = self
            .lives
            .get(d.worker.0 as usize)
            .map_or(u64::MAX, |l| l.incarnation());
        if now == d.incarnation {
            Ok(())
        } else {
            Err(BufferError::WorkerLost {
                buffer: *d.desc.identity(),
                worker: d.worker,
                path: d.path.clone(),
            })
        }
    }

    /// Writes `data` at `offset` of a device buffer. Order it against
    /// tasks yourself (write before submitting readers; wait for writers).
    ///
    /// # Errors
    /// A handle taken from a view that does not grant WRITE
    /// ([`crate::error::ViewError::ReadOnly`]), a host buffer, or the
    /// worker's refusal.
    pub fn write_device(&self, buffer: &Buffer, offset: u64, data: &[u8]) -> Result<(), Error> {
        buffer.check_write()?;
        let worker = self.device_of(buffer)?;
        let identity = buffer.identity();
        let data = data.to_vec();
        self.ask_endpoint(worker, |reply| EpCmd::CopyToDevice {
            identity,
            offset,
            data,
            reply,
        })
    }

    /// Reads `len` bytes at `offset` of a device buffer.
    ///
    /// # Errors
    /// A host buffer, or the worker's refusal.
    pub fn read_device(&self, buffer: &Buffer, offset: u64, len: u64) -> Result<Vec<u8>, Error> {
        let worker = self.device_of(buffer)?;
        let identity = buffer.identity();
        self.ask_endpoint(worker, |reply| EpCmd::CopyFromDevice {
            identity,
            offset,
            len,
            reply,
        })
    }
}
