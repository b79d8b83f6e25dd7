//! Backend kinds and the bodies that locate a buffer's memory (docs/wire-format.md §3, §3.1).
//!
//! Body rules: address kinds (FORK_SHM, FORK_COW, DEVICE_MALLOC, VMM_WINDOW)
//! carry exactly 8 bytes, a nonzero address; POSIX_SHM a name of 1–32
//! printable ASCII bytes without `/`; REMOTE_SIDECAR nothing; MEMFD exactly
//! 16 bytes, the owner's `(st_dev, st_ino)` of the memfd.

use std::num::NonZeroU64;

use crate::{AddressSpace, Error};

/// Maximum length of a descriptor body.
pub const MAX_BODY_LEN: usize = 32;

/// The kind of memory object behind a buffer. The discriminant is the wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum BackendKind {
    /// Shared anonymous memory inherited across fork; body is its address.
    ForkShm = 0,
    /// Named POSIX shared memory; body is its name.
    PosixShm = 1,
    /// A window of a device's virtual memory; body is its address.
    VmmWindow = 2,
    /// Bytes held by a remote sidecar; no body.
    RemoteSidecar = 3,
    /// A device allocation; body is its device address.
    DeviceMalloc = 4,
    /// Copy-on-write memory inherited across fork, read-only; body is its address.
    ForkCow = 5,
    /// strata's anonymous memfd, passed by SCM_RIGHTS; body is `(st_dev, st_ino)`.
    Memfd = 6,
}

impl BackendKind {
    /// Every kind, in code order.
    pub const ALL: [BackendKind; 7] = [
        BackendKind::ForkShm,
        BackendKind::PosixShm,
        BackendKind::VmmWindow,
        BackendKind::RemoteSidecar,
        BackendKind::DeviceMalloc,
        BackendKind::ForkCow,
        BackendKind::Memfd,
    ];

    /// The kind with wire code `code`.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => BackendKind::ForkShm,
            1 => BackendKind::PosixShm,
            2 => BackendKind::VmmWindow,
            3 => BackendKind::RemoteSidecar,
            4 => BackendKind::DeviceMalloc,
            5 => BackendKind::ForkCow,
            6 => BackendKind::Memfd,
            _ => return None,
        })
    }
    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }
    /// The upper-case name docs/wire-format.md uses.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::ForkShm => "FORK_SHM",
            BackendKind::PosixShm => "POSIX_SHM",
            BackendKind::VmmWindow => "VMM_WINDOW",
            BackendKind::RemoteSidecar => "REMOTE_SIDECAR",
            BackendKind::DeviceMalloc => "DEVICE_MALLOC",
            BackendKind::ForkCow => "FORK_COW",
            BackendKind::Memfd => "MEMFD",
        }
    }
    /// Whether buffers of this kind may live in `space`.
    pub const fn allows_space(self, space: AddressSpace) -> bool {
        match self {
            BackendKind::DeviceMalloc | BackendKind::VmmWindow => {
                matches!(space, AddressSpace::Device)
            }
            BackendKind::RemoteSidecar => true,
            BackendKind::ForkShm
            | BackendKind::PosixShm
            | BackendKind::ForkCow
            | BackendKind::Memfd => {
                matches!(space, AddressSpace::Host)
            }
        }
    }
}

/// A POSIX shared-memory object name: 1–32 printable ASCII bytes
/// (`0x21..=0x7e`), without `/`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShmName {
    bytes: [u8; MAX_BODY_LEN],
    len: u8,
}

impl ShmName {
    /// Checks and wraps a name.
    ///
    /// # Errors
    /// [`Error::InvalidField`] naming `body_len` or `body.name[i]`.
    pub fn new(name: &str) -> Result<Self, Error> {
        Self::from_bytes(name.as_bytes())
    }

    fn from_bytes(name: &[u8]) -> Result<Self, Error> {
        if name.is_empty() || name.len() > MAX_BODY_LEN {
            return Err(Error::invalid(
                "body_len",
                name.len(),
                "a POSIX_SHM name has 1 to 32 bytes",
            ));
        }
        let mut bytes = [0u8; MAX_BODY_LEN];
        for (i, (&b, slot)) in name.iter().zip(bytes.iter_mut()).enumerate() {
            if b == b'/' {
                return Err(Error::invalid(
                    format!("body.name[{i}]"),
                    b,
                    "a POSIX_SHM name may not contain '/'",
                ));
            }
            if !b.is_ascii_graphic() {
                return Err(Error::invalid(
                    format!("body.name[{i}]"),
                    b,
                    "a POSIX_SHM name is printable ASCII",
                ));
            }
            *slot = b;
        }
        // The length was checked against MAX_BODY_LEN (32) above.
        let len = u8::try_from(name.len()).unwrap_or(u8::MAX);
        Ok(ShmName { bytes, len })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        let bytes = self.bytes.get(..usize::from(self.len)).unwrap_or_default();
        // Only ASCII graphic bytes are ever stored.
        std::str::from_utf8(bytes).unwrap_or_default()
    }
}

impl std::fmt::Debug for ShmName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// The backend kind together with its body: what locates the memory on the
/// process that owns it. Invalid kind/body combinations cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backing {
    /// [`BackendKind::ForkShm`] at a nonzero address.
    ForkShm {
        /// Address in the owner's address space.
        addr: NonZeroU64,
    },
    /// [`BackendKind::PosixShm`] by name.
    PosixShm {
        /// Object name.
        name: ShmName,
    },
    /// [`BackendKind::VmmWindow`] at a nonzero device address.
    VmmWindow {
        /// Device virtual address.
        addr: NonZeroU64,
    },
    /// [`BackendKind::RemoteSidecar`].
    RemoteSidecar,
    /// [`BackendKind::DeviceMalloc`] at a nonzero device address.
    DeviceMalloc {
        /// Device address.
        addr: NonZeroU64,
    },
    /// [`BackendKind::ForkCow`] at a nonzero address.
    ForkCow {
        /// Address in the owner's address space.
        addr: NonZeroU64,
    },
    /// [`BackendKind::Memfd`]: the owner's `fstat` of the memfd, which the
    /// receiver checks against the fd it was passed.
    Memfd {
        /// `st_dev` of the memfd.
        st_dev: u64,
        /// `st_ino` of the memfd.
        st_ino: u64,
    },
}

impl Backing {
    /// The backend kind.
    pub const fn kind(&self) -> BackendKind {
        match self {
            Backing::ForkShm { .. } => BackendKind::ForkShm,
            Backing::PosixShm { .. } => BackendKind::PosixShm,
            Backing::VmmWindow { .. } => BackendKind::VmmWindow,
            Backing::RemoteSidecar => BackendKind::RemoteSidecar,
            Backing::DeviceMalloc { .. } => BackendKind::DeviceMalloc,
            Backing::ForkCow { .. } => BackendKind::ForkCow,
            Backing::Memfd { .. } => BackendKind::Memfd,
        }
    }

    /// The body bytes (`body_len` of them).
    pub(crate) fn body(&self) -> ([u8; MAX_BODY_LEN], usize) {
        let mut body = [0u8; MAX_BODY_LEN];
        let len = match *self {
            Backing::ForkShm { addr }
            | Backing::VmmWindow { addr }
            | Backing::DeviceMalloc { addr }
            | Backing::ForkCow { addr } => {
                put(&mut body, 0, &addr.get().to_le_bytes());
                8
            }
            Backing::PosixShm { name } => {
                body = name.bytes;
                usize::from(name.len)
            }
            Backing::RemoteSidecar => 0,
            Backing::Memfd { st_dev, st_ino } => {
                put(&mut body, 0, &st_dev.to_le_bytes());
                put(&mut body, 8, &st_ino.to_le_bytes());
                16
            }
        };
        (body, len)
    }

    /// Parses a body of `kind`; `body` holds exactly `body_len` bytes.
    pub(crate) fn parse(kind: BackendKind, body: &[u8]) -> Result<Backing, Error> {
        let addr = || -> Result<NonZeroU64, Error> {
            let bytes: [u8; 8] = body.try_into().map_err(|_| {
                Error::invalid(
                    "body_len",
                    body.len(),
                    "an address body has exactly 8 bytes",
                )
            })?;
            NonZeroU64::new(u64::from_le_bytes(bytes))
                .ok_or_else(|| Error::invalid("body.address", 0u64, "an address body is nonzero"))
        };
        Ok(match kind {
            BackendKind::ForkShm => Backing::ForkShm { addr: addr()? },
            BackendKind::VmmWindow => Backing::VmmWindow { addr: addr()? },
            BackendKind::DeviceMalloc => Backing::DeviceMalloc { addr: addr()? },
            BackendKind::ForkCow => Backing::ForkCow { addr: addr()? },
            BackendKind::PosixShm => Backing::PosixShm {
                name: ShmName::from_bytes(body)?,
            },
            BackendKind::RemoteSidecar => {
                if !body.is_empty() {
                    return Err(Error::invalid(
                        "body_len",
                        body.len(),
                        "a REMOTE_SIDECAR body is empty",
                    ));
                }
                Backing::RemoteSidecar
            }
            BackendKind::Memfd => {
                let bytes: [u8; 16] = body.try_into().map_err(|_| {
                    Error::invalid("body_len", body.len(), "a MEMFD body has exactly 16 bytes")
                })?;
                let (dev, ino) = bytes.split_at(8);
                Backing::Memfd {
                    st_dev: le_u64(dev),
                    st_ino: le_u64(ino),
                }
            }
        })
    }
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    for (dst, src) in a.iter_mut().zip(bytes) {
        *dst = *src;
    }
    u64::from_le_bytes(a)
}

fn put(dst: &mut [u8], at: usize, src: &[u8]) {
    for (d, s) in dst.iter_mut().skip(at).zip(src) {
        *d = *s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_code_once_in_order() {
        let known: Vec<BackendKind> = (0..=u8::MAX).filter_map(BackendKind::from_code).collect();
        assert_eq!(known, BackendKind::ALL);
        for k in BackendKind::ALL {
            assert_eq!(BackendKind::from_code(k.code()), Some(k));
        }
    }
}
