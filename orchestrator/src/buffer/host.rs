//! A host buffer's memfd and mapping: created sealed at its size, read
//! and written by the driver through bounds-checked copies, packed and
//! unpacked for staged workers, and its quarantined ranges refused.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use bytes::Bytes;

use strata_chip_runtime::staging;
use strata_client::offload::off_runtime;
use strata_orchestrator_core::{Holders, WorkerId};
use strata_wire::{BufferDescriptor, CanonicalIdentity, Tensor};
use tokio::sync::mpsc;

use super::marks::{Loss, Marks};
use super::pool::{Pool, Returning};
use super::{Recycler, Released};
use crate::error::{BufferError, Error};
use crate::mapping::{self, SharedMapping};

/// A sealed memfd and the driver's mapping of it: the memory behind a
/// host buffer (a pooled one's outlives the buffer: see `pool`). Or, for
/// [`crate::Cluster::posix_buffer`], a POSIX shared-memory object opened
/// by name.
pub(crate) struct Memfd {
    file: File,
    pub(super) map: SharedMapping,
    pub(super) st_dev: u64,
    pub(super) st_ino: u64,
    /// A POSIX shared-memory object's name, and whether this driver
    /// created it (then it unlinks the name when the memory goes).
    posix: Option<(strata_wire::ShmName, bool)>,
}

impl Drop for Memfd {
    fn drop(&mut self) {
        if let Some((name, true)) = &self.posix {
            // Best effort: someone else may have unlinked it already.
            let _ = nix::sys::mman::shm_unlink(format!("/{}", name.as_str()).as_str());
        }
    }
}

impl Memfd {
    /// A zeroed memfd of `nbytes`, sealed against resizing, mapped here.
    pub(crate) fn create(nbytes: u64) -> Result<Self, BufferError> {
        if nbytes == 0 {
            return Err(BufferError::Empty);
        }
        let fail = |step: &'static str| {
            move |source: io::Error| BufferError::Memfd {
                step,
                nbytes,
                source,
            }
        };
        let mfd = memfd::MemfdOptions::default()
            .close_on_exec(true)
            .allow_sealing(true)
            .create("strata-buffer")
            .map_err(memfd_io)
            .map_err(fail("memfd_create"))?;
        mfd.as_file().set_len(nbytes).map_err(fail("ftruncate"))?;
        mfd.add_seals(&[
            memfd::FileSeal::SealShrink,
            memfd::FileSeal::SealGrow,
            memfd::FileSeal::SealSeal,
        ])
        .map_err(memfd_io)
        .map_err(fail("sealing the memfd"))?;
        let file = mfd.into_file();
        let meta = file.metadata().map_err(fail("fstat"))?;
        let map = SharedMapping::new(&file).map_err(fail("mmap"))?;
        Ok(Memfd {
            file,
            map,
            st_dev: meta.dev(),
            st_ino: meta.ino(),
            posix: None,
        })
    }

    /// The POSIX shared-memory object `name` (`shm_open("/name")`), mapped
    /// here for its first `nbytes`: opened when it exists (it must hold at
    /// least `nbytes`; a larger one is used for its first `nbytes`),
    /// created zeroed at `nbytes`, mode 0600, when it does not (and then
    /// unlinked when the memory goes).
    pub(crate) fn open_posix(name: &str, nbytes: u64) -> Result<Self, BufferError> {
        use nix::fcntl::OFlag;
        use nix::sys::stat::Mode;
        let shm = strata_wire::ShmName::new(name).map_err(BufferError::Descriptor)?;
        if nbytes == 0 {
            return Err(BufferError::Empty);
        }
        let fail = |why: String| BufferError::Posix {
            name: name.to_owned(),
            nbytes,
            why,
        };
        let path = format!("/{name}");
        let mode = Mode::S_IRUSR | Mode::S_IWUSR;
        let (fd, created) = match nix::sys::mman::shm_open(
            path.as_str(),
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
            mode,
        ) {
            Ok(fd) => (fd, true),
            Err(nix::errno::Errno::EEXIST) => {
                let fd = nix::sys::mman::shm_open(path.as_str(), OFlag::O_RDWR, mode)
                    .map_err(|e| fail(format!("shm_open: {e}")))?;
                (fd, false)
            }
            Err(e) => return Err(fail(format!("shm_open: {e}"))),
        };
        let file = File::from(fd);
        let unlink_if_created = |e: BufferError| {
            if created {
                let _ = nix::sys::mman::shm_unlink(path.as_str());
            }
            e
        };
        let len = usize::try_from(nbytes)
            .map_err(|_| BufferError::AddressSpace)
            .map_err(unlink_if_created)?;
        if created {
            file.set_len(nbytes)
                .map_err(|e| fail(format!("ftruncate: {e}")))
                .map_err(unlink_if_created)?;
        }
        let meta = file
            .metadata()
            .map_err(|e| fail(format!("fstat: {e}")))
            .map_err(unlink_if_created)?;
        if meta.len() < nbytes {
            return Err(fail(format!(
                "it holds {} bytes, fewer than the buffer's",
                meta.len()
            )));
        }
        let map = SharedMapping::with_len(&file, len)
            .map_err(|e| fail(format!("mmap: {e}")))
            .map_err(unlink_if_created)?;
        Ok(Memfd {
            file,
            map,
            st_dev: meta.dev(),
            st_ino: meta.ino(),
            posix: Some((shm, created)),
        })
    }

    /// What a descriptor of this memory says of it.
    fn backing(&self) -> strata_wire::Backing {
        match &self.posix {
            Some((name, _)) => strata_wire::Backing::PosixShm { name: *name },
            None => strata_wire::Backing::Memfd {
                st_dev: self.st_dev,
                st_ino: self.st_ino,
            },
        }
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Frees every page: reads through any mapping then give zeros. The
    /// seals allow it (they forbid resizing, not punching).
    ///
    /// # Errors
    /// The kernel refused (the memfd is then not reused).
    pub(super) fn punch(&self) -> nix::Result<()> {
        let len = i64::try_from(self.len()).map_err(|_| nix::errno::Errno::EFBIG)?;
        nix::fcntl::fallocate(
            &self.file,
            nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            0,
            len,
        )
    }
}

/// A host buffer's memfd, mapping and bookkeeping.
pub(crate) struct HostShared {
    pub(super) desc: BufferDescriptor,
    pub(super) mem: Arc<Memfd>,
    /// The pool its memfd goes back to, for a pooled buffer.
    pool: Option<Arc<Pool>>,
    imported_on: Holders,
    notify: mpsc::UnboundedSender<Released>,
    /// Views written by tasks lost without a fence, until their quarantine
    /// lifts: the driver's own reads and writes of those bytes are refused.
    marks: Marks,
    /// Whether the driver has written the bytes or been handed their
    /// memory since the buffer was made: the DAG actor then cannot see
    /// every write, and trusts a chip's copy of its bytes only while
    /// tasks use them without a gap (`DagActor::live_exposed`).
    exposed: std::sync::atomic::AtomicBool,
    /// Whether a task has named the buffer: until then no chip holds a
    /// copy of it and no version of its bytes was handed out, so a write
    /// through [`crate::Buffer::write_bytes`] (the usual way to fill an
    /// input) hides nothing from the device cache and does not expose it.
    used: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for HostShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostBuffer({}, {} B)",
            self.desc.identity(),
            self.desc.nbytes()
        )
    }
}

impl HostShared {
    /// A zeroed host buffer of its own memfd of `nbytes`.
    pub(crate) fn create(
        identity: CanonicalIdentity,
        nbytes: u64,
        access: strata_wire::Access,
        notify: mpsc::UnboundedSender<Released>,
    ) -> Result<Self, BufferError> {
        HostShared::over(
            identity,
            Arc::new(Memfd::create(nbytes)?),
            access,
            None,
            notify,
        )
    }

    /// A host buffer over `mem` (zeroed), granting `access`; `pool` is
    /// where the memfd goes back once the buffer is released.
    pub(crate) fn over(
        identity: CanonicalIdentity,
        mem: Arc<Memfd>,
        access: strata_wire::Access,
        pool: Option<Arc<Pool>>,
        notify: mpsc::UnboundedSender<Released>,
    ) -> Result<Self, BufferError> {
        let desc = BufferDescriptor::new(
            identity,
            mem.len(),
            strata_wire::AddressSpace::Host,
            access,
            mem.backing(),
        )
        .map_err(BufferError::Descriptor)?;
        Ok(HostShared {
            desc,
            mem,
            pool,
            imported_on: Holders::new(),
            notify,
            marks: Marks::default(),
            exposed: std::sync::atomic::AtomicBool::new(false),
            used: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub(crate) fn descriptor(&self) -> &BufferDescriptor {
        &self.desc
    }

    /// The memfd, to pass to a local worker.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.mem.file.as_fd()
    }

    /// Records that `worker` imported the buffer (so it is told to release
    /// it later).
    pub(crate) fn imported_by(&self, worker: WorkerId) {
        self.imported_on.mark(worker);
    }

    /// The view's bytes, packed run after run (what travels to a remote
    /// worker), into a string from `into` (one kept from an earlier task
    /// when it is large enough, whose pages are already resident), never
    /// zeroed first.
    /// Long runs are read from the memfd with pread (no faults on the
    /// mapping, no pages allocated for bytes never written), short ones
    /// copied from the mapping (one call each would cost more than it
    /// saves).
    /// A view of a megabyte or more is packed without holding up the
    /// async runtime's other tasks (see `strata_proto::offload`).
    pub(crate) fn pack(&self, view: &Tensor, into: &Recycler) -> Result<Bytes, BufferError> {
        off_runtime(staging::packed_len(view), || self.pack_here(view, into))
    }

    fn pack_here(&self, view: &Tensor, into: &Recycler) -> Result<Bytes, BufferError> {
        const PREAD_RUN: usize = 64 << 10;
        let first = usize::try_from(view.byte_offset()).map_err(|_| too_big())?;
        let mut out = into.take(usize::try_from(staging::packed_len(view)).map_err(|_| too_big())?);
        let mut result = Ok(());
        staging::for_each_run(view, |off, len| {
            if result.is_err() {
                return;
            }
            let at = first.saturating_add(off);
            result = if len >= PREAD_RUN && at.saturating_add(len) <= self.mem.map.len() {
                mapping::pread_append(&self.mem.file, at, len, &mut out).map_err(|source| {
                    BufferError::Memfd {
                        step: "pread",
                        nbytes: self.desc.nbytes(),
                        source,
                    }
                })
            } else {
                self.mem
                    .map
                    .read_append(at, len, &mut out)
                    .map_err(|e| self.mapping(e))
            };
        });
        result?;
        Ok(into.wrap(out))
    }

    /// Writes a view's packed bytes back, run after run.
    /// Large ones off the runtime, as [`HostShared::pack`].
    pub(crate) fn unpack(&self, view: &Tensor, packed: &[u8]) -> Result<(), BufferError> {
        off_runtime(packed.len() as u64, || self.unpack_here(view, packed))
    }

    fn unpack_here(&self, view: &Tensor, packed: &[u8]) -> Result<(), BufferError> {
        let want = staging::packed_len(view);
        if packed.len() as u64 != want {
            return Err(BufferError::PackedLength {
                got: packed.len(),
                want,
            });
        }
        // Long runs go in by `pwrite`, as `pack` reads them by `pread`:
        // the kernel fills fresh shmem pages directly instead of faulting
        // each one in (zeroed) through the mapping and copying over it.
        const PWRITE_RUN: usize = 64 << 10;
        let first = usize::try_from(view.byte_offset()).map_err(|_| too_big())?;
        let mut at = 0usize;
        let mut result = Ok(());
        staging::for_each_run(view, |off, len| {
            if result.is_ok() {
                let to = first + off;
                let bytes = &packed[at..at + len];
                result = if len >= PWRITE_RUN && to.saturating_add(len) <= self.mem.map.len() {
                    std::os::unix::fs::FileExt::write_all_at(&self.mem.file, bytes, to as u64)
                        .map_err(|source| BufferError::Memfd {
                            step: "pwrite",
                            nbytes: self.desc.nbytes(),
                            source,
                        })
                } else {
                    self.mem.map.write(to, bytes).map_err(|e| self.mapping(e))
                };
                at += len;
            }
        });
        result
    }

    /// The mapping refused bytes past its end (its only failure).
    pub(super) fn mapping(&self, e: mapping::OutOfRange) -> BufferError {
        BufferError::OutOfRange {
            bytes: e.offset as u64..e.end as u64,
            nbytes: self.desc.nbytes(),
        }
    }

    /// Quarantines `view`: the lost task writes it.
    pub(crate) fn quarantine(&self, view: Tensor, loss: Loss) {
        self.marks.mark(view, loss);
    }

    /// Lifts what `task` quarantined: it can no longer write.
    pub(crate) fn lift(&self, task: strata_orchestrator_core::TaskId) {
        self.marks.lift(task);
    }

    /// Refuses a driver access to `view`'s bytes while any of them is
    /// quarantined.
    pub(super) fn check_view(&self, view: &Tensor) -> Result<(), Error> {
        Ok(self.marks.check_view(self.desc.identity(), view)?)
    }

    /// As [`HostShared::check_view`], for `len` bytes at `offset`.
    fn check_range(&self, offset: u64, len: usize) -> Result<(), Error> {
        Ok(self
            .marks
            .check_range(self.desc.identity(), offset, len as u64)?)
    }

    pub(crate) fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        self.check_range(offset, len)?;
        let offset = usize::try_from(offset).map_err(|_| too_big())?;
        let mut out = vec![0u8; len];
        self.mem
            .map
            .read(offset, &mut out)
            .map_err(|e| self.mapping(e))?;
        Ok(out)
    }

    pub(crate) fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        self.check_range(offset, bytes.len())?;
        let offset = usize::try_from(offset).map_err(|_| too_big())?;
        self.mem
            .map
            .write(offset, bytes)
            .map_err(|e| self.mapping(e).into())
    }

    pub(crate) fn len(&self) -> usize {
        self.mem.map.len()
    }

    /// Marks the bytes as touched by the driver directly (see `exposed`).
    pub(crate) fn expose(&self) {
        self.exposed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the driver has touched the bytes directly.
    pub(crate) fn exposed(&self) -> bool {
        self.exposed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Marks the buffer as named by a task (the DAG actor, at submit; the
    /// driver sees it through whatever ordered its next write after that
    /// task, as the driver's contract requires).
    pub(crate) fn mark_used(&self) {
        if !self.used.load(std::sync::atomic::Ordering::Relaxed) {
            self.used.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A driver's write through `write_bytes`: it exposes the buffer only
    /// once a task has named it.
    pub(crate) fn expose_if_used(&self) {
        if self.used.load(std::sync::atomic::Ordering::Relaxed) {
            self.expose();
        }
    }

    pub(crate) fn address(&self) -> *mut u8 {
        self.mem.map.address()
    }
}

pub(super) fn too_big() -> BufferError {
    BufferError::AddressSpace
}

/// The io error inside a memfd error (every variant holds one).
fn memfd_io(e: memfd::Error) -> io::Error {
    match e {
        memfd::Error::Create(e) | memfd::Error::AddSeals(e) | memfd::Error::GetSeals(e) => e,
    }
}

impl Drop for HostShared {
    fn drop(&mut self) {
        let workers = self.imported_on.take();
        let identity = *self.desc.identity();
        // Bytes still quarantined may yet be written by a lost task: such
        // a memfd is never handed to anyone else.
        let returning = self.pool.take().map(|pool| {
            let clean = self.marks.none();
            Returning::new(pool, Arc::clone(&self.mem), &identity, clean)
        });
        // After the cluster is gone nobody listens; the workers are gone too
        // (and a returning memfd is discarded with the message).
        let _ = self.notify.send(Released::Host {
            identity,
            workers,
            returning,
        });
    }
}

impl crate::link::HostFile for HostShared {
    fn fd(&self) -> BorrowedFd<'_> {
        HostShared::fd(self)
    }

    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, String> {
        HostShared::read(self, offset, len).map_err(|e| e.to_string())
    }
}
