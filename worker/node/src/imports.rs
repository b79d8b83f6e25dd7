//! Mapping imported fds: the checks a backing must pass, and the mapping
//! tasks read and write through.
//!
//! Why every imported fd must be sealed against shrinking: the worker maps
//! each import `MAP_SHARED` and kernels touch it with plain loads and
//! stores. If whoever else holds the file shrinks it, every access to a
//! page past the new end raises SIGBUS, and that kills the worker — every
//! session of every driver it serves, not just the one that shrank it. A
//! memfd carrying `F_SEAL_SHRINK` cannot be made smaller by anyone, and a
//! seal can never be removed, so one check when the fd arrives holds for
//! as long as the worker holds the fd; and the size check at first use
//! stays true after it.
//!
//! Objects that cannot carry the seal (POSIX shared memory from
//! `shm_open`, any other tmpfs file: Linux gives them `F_SEAL_SEAL` at
//! creation, so `F_ADD_SEALS` fails) are never mapped. The alternative,
//! failing only the task that touched a missing page, was rejected:
//! catching SIGBUS and unwinding out of a kernel running on a pool thread
//! of a multi-threaded process means `siglongjmp` across Rust frames
//! (undefined behaviour), and probing the size before each access races a
//! concurrent shrink. A file under `/dev/shm` is also subject to that
//! mount's size limit, where writing a sparse page can fail with SIGBUS on
//! its own; the kernel's internal memfd mount has no such limit.
//!
//! A buffer its descriptor names POSIX_SHM (simpler's own host
//! buffers) is imported **by copy** instead ([`Import::Copied`]): the
//! worker keeps the fd, reads the bytes a task's views span into private
//! memory with `pread` before the kernel runs, and writes the views the
//! task writes back with `pwrite` after it succeeds. A shrink can then
//! only make a read come up short or find the object too small to write
//! back, which fails that task with a cause that says so; no access of the
//! worker's ever touches a page of the object. Any other unsealed fd is
//! refused on arrival, as before.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::stat::fstat;
use nix::sys::statfs::{TMPFS_MAGIC, fstatfs};
use strata_chip_runtime::HostMemory;
use strata_wire::{Access, AddressSpace, BackendKind, Backing, BufferDescriptor};
use strata_worker_core::{ImportRegistry, Mapper};

/// The worker's import registry.
pub(crate) type Imports = ImportRegistry<FdMapper>;

/// The backend kinds the import registry maps (its mapper checks a
/// descriptor's kind against this list), and so the kinds a worker that
/// receives fds states in its handshake: MEMFD, mapped shared (it must be
/// sealed against shrinking), and POSIX_SHM, imported by copy (module
/// docs); every other kind is not host memory behind an fd at all.
pub const IMPORTED_KINDS: [BackendKind; 2] = [BackendKind::Memfd, BackendKind::PosixShm];

/// An imported buffer as tasks reach it.
#[derive(Debug)]
pub enum Import {
    /// A sealed memfd, mapped shared: tasks use its bytes in place.
    Mapped(Arc<HostMapping>),
    /// A POSIX shared-memory object, read and written by copy.
    Copied(CopiedImport),
}

/// Maps received fds after checking them against the buffer's descriptor.
#[derive(Debug, Default)]
pub(crate) struct FdMapper;

impl Mapper for FdMapper {
    type Source = OwnedFd;
    type Mapping = Import;

    /// Checks, in order: the backend kind (one of [`IMPORTED_KINDS`], host
    /// space), the filesystem (tmpfs/shmem, by `fstatfs`); for MEMFD the
    /// seal against shrinking (`F_GET_SEALS`), the size (at least
    /// `nbytes`) and the inode against the descriptor's body, then maps
    /// `nbytes` shared, read-only when the buffer grants READ only (the
    /// seal is checked before the size because only the seal keeps the
    /// size check true afterwards); for POSIX_SHM the size now, then keeps
    /// the fd to copy through.
    /// `d` is the import's descriptor, not a task's: tasks that narrow it
    /// get a read-only [`lease`].
    fn map(&self, fd: &OwnedFd, d: &BufferDescriptor) -> Result<Import, String> {
        if d.address_space() != AddressSpace::Host {
            return Err("a DEVICE buffer cannot be imported by fd".into());
        }
        let kind = d.backing().kind();
        if !IMPORTED_KINDS.contains(&kind) {
            return Err(format!("a {} buffer cannot be imported by fd", kind.name()));
        }
        if d.nbytes() == 0 {
            return Err("a buffer of 0 bytes cannot be imported".into());
        }
        if let Backing::PosixShm { name } = d.backing() {
            check_filesystem(fd)?;
            let file = File::from(fd.try_clone().map_err(|e| format!("dup failed: {e}"))?);
            let copied = CopiedImport {
                file,
                name: name.as_str().to_owned(),
                nbytes: d.nbytes(),
            };
            let size = copied.size()?;
            if size < d.nbytes() {
                return Err(format!(
                    "the POSIX shared-memory object '{}' holds {size} bytes but the buffer has nbytes {}",
                    copied.name,
                    d.nbytes()
                ));
            }
            return Ok(Import::Copied(copied));
        }
        // MEMFD is the one kind imported: its body names the inode.
        let Backing::Memfd { st_dev, st_ino } = *d.backing() else {
            return Err(format!("a {} buffer cannot be imported by fd", kind.name()));
        };
        let expect_inode = (st_dev, st_ino);
        check_filesystem(fd)?;
        check_sealed_against_shrinking(fd)?;
        let st = fstat(fd).map_err(|e| format!("fstat failed: {e}"))?;
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size < d.nbytes() {
            return Err(format!(
                "the fd holds {size} bytes but the buffer has nbytes {}",
                d.nbytes()
            ));
        }
        let (dev, ino) = expect_inode;
        let (got_dev, got_ino) = (st.st_dev, st.st_ino);
        if (got_dev, got_ino) != (dev, ino) {
            return Err(format!(
                "the fd is inode ({got_dev}, {got_ino}) but the MEMFD body names ({dev}, {ino})"
            ));
        }
        if d.nbytes() == 0 {
            return Err("a buffer of 0 bytes cannot be mapped".into());
        }
        let len = usize::try_from(d.nbytes())
            .map_err(|_| "nbytes exceeds the address space".to_owned())?;
        let writable = d.access().allows_write();
        let mut opts = MmapOptions::new();
        opts.len(len);
        let map = if writable {
            opts.map_raw(fd.as_raw_fd())
        } else {
            opts.map_raw_read_only(fd.as_raw_fd())
        }
        .map_err(|e| format!("mmap of {len} bytes failed: {e}"))?;
        Ok(Import::Mapped(Arc::new(HostMapping { map, writable })))
    }
}

/// A POSIX shared-memory object imported by copy: its fd (a duplicate the
/// import owns) and what its descriptor says of it.
#[derive(Debug)]
pub struct CopiedImport {
    file: File,
    name: String,
    nbytes: u64,
}

impl CopiedImport {
    /// The object's name, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its size now (its owner may have changed it since the import).
    ///
    /// # Errors
    /// `fstat` failed.
    pub fn size(&self) -> Result<u64, String> {
        let st = fstat(&self.file).map_err(|e| format!("fstat failed: {e}"))?;
        Ok(u64::try_from(st.st_size).unwrap_or(0))
    }

    /// `len` bytes from byte `offset`, read into private memory.
    ///
    /// # Errors
    /// The object ends before `offset + len` (its owner shrank it since the
    /// import), or the read failed.
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len];
        self.file.read_exact_at(&mut out, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.shrunk(offset.saturating_add(len as u64))
            } else {
                format!(
                    "reading the POSIX shared-memory object '{}' failed: {e}",
                    self.name
                )
            }
        })?;
        Ok(out)
    }

    /// Writes `bytes` at byte `offset`, after checking that the object
    /// still reaches `end` (the end of what the task writes), so that a
    /// shrunk object is not grown back by a write-back.
    ///
    /// # Errors
    /// The object now ends before `end`, or the write failed.
    pub fn write(&self, offset: u64, bytes: &[u8], end: u64) -> Result<(), String> {
        if self.size()? < end {
            return Err(self.shrunk(end));
        }
        self.file.write_all_at(bytes, offset).map_err(|e| {
            format!(
                "writing the POSIX shared-memory object '{}' back failed: {e}",
                self.name
            )
        })
    }

    /// Why a read or write-back up to byte `end` cannot be done.
    fn shrunk(&self, end: u64) -> String {
        let size = self.size().map_or_else(|e| e, |s| format!("{s} bytes"));
        format!(
            "the POSIX shared-memory object '{}' (nbytes {}) now holds {size}, short of byte {end}: its owner shrank it after the import",
            self.name, self.nbytes
        )
    }
}

/// The checks an fd from another process must pass when it arrives (a
/// buffer's, or a ring's): what it is (tmpfs/shmem), and that it can never
/// shrink under a mapping (see the module docs), unless `grant` names it a
/// POSIX_SHM buffer, which is never mapped. Refusing on arrival, rather
/// than at first use, puts the reason in the import's own answer and means
/// the worker never holds an fd that could be pulled out from under a
/// mapping.
///
/// # Errors
/// What is wrong with the fd and what the sender must do instead.
pub fn check_arrival(fd: &OwnedFd, grant: Option<&BufferDescriptor>) -> Result<(), String> {
    check_filesystem(fd)?;
    if grant.is_some_and(|g| g.backing().kind() == BackendKind::PosixShm) {
        return Ok(());
    }
    check_sealed_against_shrinking(fd)
}

/// Refuses an fd that is not on tmpfs/shmem (memfds and POSIX shared
/// memory are); run when the fd arrives, and again before mapping.
pub(crate) fn check_filesystem(fd: &OwnedFd) -> Result<(), String> {
    let fs = fstatfs(fd).map_err(|e| format!("fstatfs failed: {e}"))?;
    let magic = fs.filesystem_type();
    if magic != TMPFS_MAGIC {
        return Err(format!(
            "the fd is on a filesystem with magic {:#x}, not tmpfs/shmem ({:#x}): only memfds and shared-memory objects can back a buffer",
            magic.0, TMPFS_MAGIC.0
        ));
    }
    Ok(())
}

/// Refuses an fd that does not carry `F_SEAL_SHRINK` (see the module
/// docs for why); run when the fd arrives, and again before mapping.
///
/// The message names what the fd is (a memfd, or another shared-memory
/// file and its path), the seals it has, and what the client must do.
pub(crate) fn check_sealed_against_shrinking(fd: &OwnedFd) -> Result<(), String> {
    let raw = fcntl(fd, FcntlArg::F_GET_SEALS).map_err(|e| {
        format!(
            "F_GET_SEALS failed ({e}): {} cannot be sealed against shrinking; {REMEDY}",
            describe(fd)
        )
    })?;
    let seals = SealFlag::from_bits_retain(raw);
    if seals.contains(SealFlag::F_SEAL_SHRINK) {
        return Ok(());
    }
    Err(format!(
        "{} is not sealed against shrinking (its seals: {}; F_SEAL_SHRINK is required): a worker maps every import shared, and a backing shrunk under the mapping would crash it with SIGBUS; {REMEDY}",
        describe(fd),
        seal_names(seals)
    ))
}

/// What a client must do to pass the seal check.
const REMEDY: &str = "create the buffer with memfd_create(MFD_ALLOW_SEALING) and add F_SEAL_SHRINK with fcntl(F_ADD_SEALS) before passing it (a POSIX shm object, which cannot be sealed, must come with a POSIX_SHM descriptor: it is then copied, never mapped)";

/// What kind of object `fd` is, for an error message: a memfd (its link in
/// `/proc/self/fd` reads `/memfd:NAME (deleted)`), or the shared-memory
/// file it links to. Diagnostic only; nothing is decided by it.
fn describe(fd: &OwnedFd) -> String {
    match std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) {
        Ok(path) if path.as_os_str().as_encoded_bytes().starts_with(b"/memfd:") => {
            "the fd (a memfd)".to_owned()
        }
        Ok(path) => format!(
            "the fd (a POSIX shared-memory object or tmpfs file, {})",
            path.display()
        ),
        Err(_) => "the fd".to_owned(),
    }
}

/// `F_SEAL_SEAL | F_SEAL_GROW` and so on; `none` for no seals.
fn seal_names(seals: SealFlag) -> String {
    const NAMES: [(SealFlag, &str); 5] = [
        (SealFlag::F_SEAL_SEAL, "F_SEAL_SEAL"),
        (SealFlag::F_SEAL_SHRINK, "F_SEAL_SHRINK"),
        (SealFlag::F_SEAL_GROW, "F_SEAL_GROW"),
        (SealFlag::F_SEAL_WRITE, "F_SEAL_WRITE"),
        (SealFlag::F_SEAL_FUTURE_WRITE, "F_SEAL_FUTURE_WRITE"),
    ];
    let mut names: Vec<String> = NAMES
        .iter()
        .filter(|(flag, _)| seals.contains(*flag))
        .map(|(_, name)| (*name).to_owned())
        .collect();
    let known = NAMES
        .iter()
        .fold(SealFlag::empty(), |all, (flag, _)| all | *flag);
    let unknown = seals.difference(known);
    if !unknown.is_empty() {
        names.push(format!("{:#x}", unknown.bits()));
    }
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(" | ")
    }
}

/// A task's lease on an imported mapping, as the task's own descriptor
/// grants it: the mapping itself when that grant allows writing (or the
/// mapping is read-only anyway), a read-only face of it otherwise. A task
/// may name a buffer through a READ descriptor narrowed from a READWRITE
/// import; the mapping is writable for the import's sake, and this keeps
/// that task from writing through it.
pub(crate) fn lease(mapping: Arc<HostMapping>, access: Access) -> Arc<dyn HostMemory> {
    let writable = mapping.writable;
    read_only_unless(mapping, access.allows_write() || !writable)
}

/// `memory` itself when `writable`, a read-only face of it otherwise.
pub(crate) fn read_only_unless(memory: Arc<dyn HostMemory>, writable: bool) -> Arc<dyn HostMemory> {
    if writable {
        memory
    } else {
        Arc::new(ReadOnly(memory))
    }
}

/// A read-only face of writable memory.
#[derive(Debug)]
struct ReadOnly(Arc<dyn HostMemory>);

// SAFETY: delegates the range to the memory, which upholds the contract
// for it, and reports it read-only, which only narrows what callers may
// do.
#[allow(unsafe_code)]
unsafe impl HostMemory for ReadOnly {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn writable(&self) -> bool {
        false
    }
    fn underlying(&self) -> Option<Arc<dyn HostMemory>> {
        Some(Arc::clone(&self.0))
    }
}

/// An imported buffer, mapped shared into the worker.
#[derive(Debug)]
pub struct HostMapping {
    map: MmapRaw,
    writable: bool,
}

// SAFETY: the mapping lives as long as this value (tasks hold it by Arc
// while they run), is readable, and writable only when mapped so; strata
// never creates references into it (MmapRaw hands out raw pointers only).
#[allow(unsafe_code)]
unsafe impl HostMemory for HostMapping {
    fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn writable(&self) -> bool {
        self.writable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memfd::{FileSeal, MemfdOptions};
    use nix::sys::mman::{shm_open, shm_unlink};
    use nix::sys::stat::Mode;
    use strata_wire::{Access, Backing, CanonicalIdentity};

    /// A memfd of `len` bytes carrying `seals` (none: created without
    /// MFD_ALLOW_SEALING, which the kernel marks F_SEAL_SEAL).
    fn memfd_with(len: u64, seals: &[FileSeal]) -> OwnedFd {
        let mfd = MemfdOptions::default()
            .close_on_exec(true)
            .allow_sealing(!seals.is_empty())
            .create("seal-test")
            .unwrap();
        mfd.as_file().set_len(len).unwrap();
        if !seals.is_empty() {
            mfd.add_seals(seals).unwrap();
        }
        OwnedFd::from(mfd.into_file())
    }

    fn memfd_descriptor(fd: &OwnedFd, nbytes: u64) -> BufferDescriptor {
        let st = fstat(fd).unwrap();
        BufferDescriptor::new(
            CanonicalIdentity::new([7; 8], 1, 1).unwrap(),
            nbytes,
            AddressSpace::Host,
            Access::ReadWrite,
            Backing::Memfd {
                st_dev: st.st_dev,
                st_ino: st.st_ino,
            },
        )
        .unwrap()
    }

    /// The kinds a worker states are the kinds it maps: a sealed memfd of
    /// the right size, described as each kind that can be host memory,
    /// maps exactly when the kind is in [`IMPORTED_KINDS`] (every other
    /// check passes), and each refusal names the kind.
    #[test]
    fn the_mapper_maps_exactly_the_stated_kinds() {
        use std::num::NonZeroU64;
        use strata_wire::ShmName;
        let fd = memfd_with(4096, &[FileSeal::SealShrink]);
        let memfd = memfd_descriptor(&fd, 4096);
        let addr = NonZeroU64::new(0x1000).unwrap();
        for kind in BackendKind::ALL {
            let backing = match kind {
                BackendKind::Memfd => *memfd.backing(),
                BackendKind::PosixShm => Backing::PosixShm {
                    name: ShmName::new("strata-test").unwrap(),
                },
                BackendKind::ForkShm => Backing::ForkShm { addr },
                BackendKind::ForkCow => Backing::ForkCow { addr },
                BackendKind::RemoteSidecar => Backing::RemoteSidecar,
                BackendKind::DeviceMalloc => Backing::DeviceMalloc { addr },
                BackendKind::VmmWindow => Backing::VmmWindow { addr },
                other => panic!("a kind this test does not build: {other:?}"),
            };
            let access = if kind == BackendKind::ForkCow {
                Access::Read
            } else {
                Access::ReadWrite
            };
            let space = if matches!(kind, BackendKind::DeviceMalloc | BackendKind::VmmWindow) {
                AddressSpace::Device
            } else {
                AddressSpace::Host
            };
            let d = BufferDescriptor::new(*memfd.identity(), 4096, space, access, backing).unwrap();
            match FdMapper.map(&fd, &d) {
                Ok(_) => assert!(IMPORTED_KINDS.contains(&kind), "{kind:?} mapped"),
                Err(e) => {
                    assert!(!IMPORTED_KINDS.contains(&kind), "{kind:?}: {e}");
                    assert!(
                        e.contains(kind.name()) || space == AddressSpace::Device,
                        "{kind:?}: {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_memfd_sealed_against_shrinking_passes() {
        let fd = memfd_with(4096, &[FileSeal::SealShrink]);
        assert_eq!(check_sealed_against_shrinking(&fd), Ok(()));
        let all = memfd_with(
            4096,
            &[FileSeal::SealShrink, FileSeal::SealGrow, FileSeal::SealSeal],
        );
        assert_eq!(check_sealed_against_shrinking(&all), Ok(()));
        // And the mapper maps it.
        let Import::Mapped(m) = FdMapper.map(&all, &memfd_descriptor(&all, 4096)).unwrap() else {
            panic!("a memfd is mapped");
        };
        assert_eq!((m.len(), m.writable()), (4096, true));
    }

    #[test]
    fn an_unsealable_memfd_is_refused_naming_its_seals_and_the_remedy() {
        let fd = memfd_with(4096, &[]);
        let e = check_sealed_against_shrinking(&fd).unwrap_err();
        assert!(e.starts_with("the fd (a memfd) is not sealed"), "{e}");
        assert!(e.contains("its seals: F_SEAL_SEAL;"), "{e}");
        assert!(e.contains("F_SEAL_SHRINK is required"), "{e}");
        assert!(e.contains("MFD_ALLOW_SEALING"), "{e}");
    }

    #[test]
    fn seals_other_than_shrink_do_not_pass() {
        let grow = memfd_with(4096, &[FileSeal::SealGrow, FileSeal::SealWrite]);
        let e = check_sealed_against_shrinking(&grow).unwrap_err();
        assert!(e.contains("its seals: F_SEAL_GROW | F_SEAL_WRITE;"), "{e}");
        // Sealable but not yet sealed: no seals at all.
        let open = MemfdOptions::default()
            .allow_sealing(true)
            .create("seal-test")
            .unwrap();
        let open = OwnedFd::from(open.into_file());
        let e = check_sealed_against_shrinking(&open).unwrap_err();
        assert!(e.contains("its seals: none;"), "{e}");
    }

    #[test]
    fn the_mapper_refuses_an_unsealed_memfd_before_mapping() {
        let fd = memfd_with(4096, &[]);
        let e = FdMapper.map(&fd, &memfd_descriptor(&fd, 4096)).unwrap_err();
        assert!(e.contains("F_SEAL_SHRINK is required"), "{e}");
    }

    /// A POSIX shared-memory object cannot be sealed: without a descriptor
    /// naming it POSIX_SHM its fd is refused on arrival, with one it is
    /// imported by copy: reads and write-backs go through the fd, and once
    /// its owner shrinks it they fail with a cause that says so, and a
    /// write-back does not grow it again.
    #[test]
    fn a_posix_shm_object_is_copied_never_mapped() {
        let name = format!("strata-seal-unit-{}", std::process::id());
        let path = format!("/{name}");
        let fd = shm_open(
            path.as_str(),
            nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_EXCL | nix::fcntl::OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .unwrap();
        shm_unlink(path.as_str()).unwrap();
        nix::unistd::ftruncate(&fd, 4096).unwrap();
        // It passes the filesystem check (tmpfs) and fails the seal check.
        assert_eq!(check_filesystem(&fd), Ok(()));
        let e = check_arrival(&fd, None).unwrap_err();
        assert!(
            e.starts_with(
                "the fd (a POSIX shared-memory object or tmpfs file, /dev/shm/strata-seal-unit-"
            ),
            "{e}"
        );
        assert!(e.contains("F_SEAL_SHRINK is required"), "{e}");
        assert!(e.contains("must come with a POSIX_SHM descriptor"), "{e}");
        // The kernel agrees that it cannot be sealed.
        assert!(fcntl(&fd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).is_err());

        let desc = BufferDescriptor::new(
            CanonicalIdentity::new([7; 8], 2, 1).unwrap(),
            4096,
            AddressSpace::Host,
            Access::ReadWrite,
            Backing::PosixShm {
                name: strata_wire::ShmName::new(&name).unwrap(),
            },
        )
        .unwrap();
        assert_eq!(check_arrival(&fd, Some(&desc)), Ok(()));
        let Import::Copied(object) = FdMapper.map(&fd, &desc).unwrap() else {
            panic!("a POSIX_SHM buffer is copied");
        };
        object.write(100, b"strata", 106).unwrap();
        assert_eq!(object.read(98, 10).unwrap(), b"\0\0strata\0\0");
        // Larger than the object: refused at import.
        let big = BufferDescriptor::new(
            *desc.identity(),
            8192,
            AddressSpace::Host,
            Access::ReadWrite,
            *desc.backing(),
        )
        .unwrap();
        let e = FdMapper.map(&fd, &big).unwrap_err();
        assert!(
            e.contains("holds 4096 bytes but the buffer has nbytes 8192"),
            "{e}"
        );

        nix::unistd::ftruncate(&fd, 64).unwrap();
        let e = object.read(0, 128).unwrap_err();
        assert!(e.contains("now holds 64 bytes, short of byte 128"), "{e}");
        assert!(e.contains("shrank it after the import"), "{e}");
        let e = object.write(100, b"late", 104).unwrap_err();
        assert!(e.contains("short of byte 104"), "{e}");
        assert_eq!(
            object.size().unwrap(),
            64,
            "a refused write-back grows nothing"
        );
    }

    #[test]
    fn seal_names_lists_every_flag_and_unknown_bits() {
        assert_eq!(seal_names(SealFlag::empty()), "none");
        assert_eq!(
            seal_names(SealFlag::F_SEAL_SEAL | SealFlag::F_SEAL_FUTURE_WRITE),
            "F_SEAL_SEAL | F_SEAL_FUTURE_WRITE"
        );
        assert_eq!(
            seal_names(SealFlag::F_SEAL_SHRINK | SealFlag::from_bits_retain(0x100)),
            "F_SEAL_SHRINK | 0x100"
        );
    }

    mod narrowing {
        use std::os::fd::OwnedFd;
        use std::os::unix::fs::MetadataExt;

        use strata_wire::{Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity};
        use strata_worker_core::Mapper;

        use super::super::{FdMapper, Import, lease};

        /// A sealed-against-shrinking memfd of `nbytes` and its descriptor.
        fn memfd(nbytes: u64, access: Access) -> (OwnedFd, BufferDescriptor) {
            let mfd = memfd::MemfdOptions::default()
                .close_on_exec(true)
                .allow_sealing(true)
                .create("strata-lease-test")
                .unwrap();
            mfd.as_file().set_len(nbytes).unwrap();
            mfd.add_seal(memfd::FileSeal::SealShrink).unwrap();
            let meta = mfd.as_file().metadata().unwrap();
            let d = BufferDescriptor::new(
                CanonicalIdentity::new([7; 8], 1, 1).unwrap(),
                nbytes,
                AddressSpace::Host,
                access,
                Backing::Memfd {
                    st_dev: meta.dev(),
                    st_ino: meta.ino(),
                },
            )
            .unwrap();
            (OwnedFd::from(mfd.into_file()), d)
        }

        /// A task that narrows a READWRITE import to READ gets a read-only face
        /// of the same bytes; tasks granted WRITE get the mapping itself; a
        /// mapping made read-only stays read-only whatever the task asks.
        #[test]
        fn a_read_lease_of_a_writable_mapping_is_read_only() {
            let mapped = |fd, d| match FdMapper.map(fd, d).unwrap() {
                Import::Mapped(m) => m,
                Import::Copied(_) => panic!("a memfd is mapped"),
            };
            let (fd, rw) = memfd(4096, Access::ReadWrite);
            let m = mapped(&fd, &rw);
            assert!(m.writable);
            let ro = lease(std::sync::Arc::clone(&m), Access::Read);
            assert!(!ro.writable());
            assert_eq!((ro.as_ptr(), ro.len()), (m.map.as_mut_ptr(), 4096));
            for access in [Access::Write, Access::ReadWrite] {
                assert!(lease(std::sync::Arc::clone(&m), access).writable());
            }

            let (fd, read_only) = memfd(4096, Access::Read);
            let m = mapped(&fd, &read_only);
            assert!(!lease(m, Access::ReadWrite).writable());
        }
    }
}
