//! Mapping imported fds: the checks a backing must pass, and the mapping
//! tasks read and write through.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use nix::sys::stat::fstat;
use nix::sys::statfs::{TMPFS_MAGIC, fstatfs};
use strata_chip::HostMemory;
use strata_wire::{Access, AddressSpace, Backing, BufferDescriptor};
use strata_worker_core::{ImportRegistry, Mapper};

/// The worker's import registry.
pub(crate) type Imports = ImportRegistry<FdMapper>;

/// Maps received fds after checking them against the buffer's descriptor.
#[derive(Debug, Default)]
pub(crate) struct FdMapper;

impl Mapper for FdMapper {
    type Source = OwnedFd;
    type Mapping = HostMapping;

    /// Checks, in order: the backend kind (MEMFD or POSIX_SHM, host space),
    /// the filesystem (tmpfs/shmem, by `fstatfs`), the size (at least
    /// `nbytes`), and for MEMFD the inode against the descriptor's body; then
    /// maps `nbytes` shared, read-only when the buffer grants READ only.
    /// `d` is the import's descriptor, not a task's: tasks that narrow it
    /// get a read-only [`lease`].
    fn map(&self, fd: &OwnedFd, d: &BufferDescriptor) -> Result<HostMapping, String> {
        if d.address_space() != AddressSpace::Host {
            return Err("a DEVICE buffer cannot be imported by fd".into());
        }
        let expect_inode = match *d.backing() {
            Backing::Memfd { st_dev, st_ino } => Some((st_dev, st_ino)),
            Backing::PosixShm { .. } => None,
            other => {
                return Err(format!(
                    "a {} buffer cannot be imported by fd",
                    other.kind().name()
                ));
            }
        };
        check_filesystem(fd)?;
        let st = fstat(fd).map_err(|e| format!("fstat failed: {e}"))?;
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size < d.nbytes() {
            return Err(format!(
                "the fd holds {size} bytes but the buffer has nbytes {}",
                d.nbytes()
            ));
        }
        if let Some((dev, ino)) = expect_inode {
            let (got_dev, got_ino) = (st.st_dev, st.st_ino);
            if (got_dev, got_ino) != (dev, ino) {
                return Err(format!(
                    "the fd is inode ({got_dev}, {got_ino}) but the MEMFD body names ({dev}, {ino})"
                ));
            }
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
        Ok(HostMapping { map, writable })
    }
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

/// A task's lease on an imported mapping, as the task's own descriptor
/// grants it: the mapping itself when that grant allows writing (or the
/// mapping is read-only anyway), a read-only face of it otherwise. A task
/// may name a buffer through a READ descriptor narrowed from a READWRITE
/// import; the mapping is writable for the import's sake, and this keeps
/// that task from writing through it.
pub(crate) fn lease(mapping: Arc<HostMapping>, access: Access) -> Arc<dyn HostMemory> {
    if access.allows_write() || !mapping.writable {
        mapping
    } else {
        Arc::new(ReadOnly(mapping))
    }
}

/// A read-only face of a writable mapping.
#[derive(Debug)]
struct ReadOnly(Arc<HostMapping>);

// SAFETY: delegates the range to the mapping, which upholds the contract
// for it (see `HostMapping`), and reports it read-only, which only narrows
// what callers may do.
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
    use std::os::fd::OwnedFd;
    use std::os::unix::fs::MetadataExt;

    use strata_wire::{Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity};
    use strata_worker_core::Mapper;

    use super::{FdMapper, lease};

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
        let (fd, rw) = memfd(4096, Access::ReadWrite);
        let m = std::sync::Arc::new(FdMapper.map(&fd, &rw).unwrap());
        assert!(m.writable);
        let ro = lease(std::sync::Arc::clone(&m), Access::Read);
        assert!(!ro.writable());
        assert_eq!((ro.as_ptr(), ro.len()), (m.map.as_mut_ptr(), 4096));
        for access in [Access::Write, Access::ReadWrite] {
            assert!(lease(std::sync::Arc::clone(&m), access).writable());
        }

        let (fd, read_only) = memfd(4096, Access::Read);
        let m = std::sync::Arc::new(FdMapper.map(&fd, &read_only).unwrap());
        assert!(!lease(m, Access::ReadWrite).writable());
    }
}
