//! Buffer identities and buffer descriptors (DESIGN §3).
//!
//! Layout of a [`BufferDescriptor`] (88 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | `magic` = 0x5342 |
//! | 2 | 1 | `address_space` (HOST 0, DEVICE 1) |
//! | 3 | 1 | `access` (READ 0, WRITE 1, READWRITE 2) |
//! | 4 | 1 | `backend_kind` |
//! | 5 | 3 | pad, zero |
//! | 8 | 32 | `identity` ([`CanonicalIdentity`]) |
//! | 40 | 8 | `nbytes` |
//! | 48 | 4 | `owner_worker_path_id` (diagnostic) |
//! | 52 | 2 | `body_len` (≤ 32) |
//! | 54 | 2 | pad, zero |
//! | 56 | 32 | `body`, zero past `body_len` |
//!
//! The padding of a descriptor must be zero so that it can be given a meaning
//! later without ambiguity; the padding of an identity is ignored, as the brief
//! says, so identities minted by other systems compare by their real fields.

use std::num::NonZeroU32;
use std::num::NonZeroU64;

use crate::Error;
use crate::codec::{Reader, Writer};

/// Descriptor magic, "BS" little-endian.
pub const DESCRIPTOR_MAGIC: u16 = 0x5342;

/// Encoded size of a [`CanonicalIdentity`].
pub const IDENTITY_SIZE: usize = 32;

/// Encoded size of a [`BufferDescriptor`].
pub const DESCRIPTOR_SIZE: usize = 88;

/// Maximum length of a descriptor body.
pub const MAX_BODY_LEN: usize = 32;

/// The identity of one incarnation of one buffer: which orchestrator instance
/// created it, its id there, and its generation (bumped when the id's memory
/// is reused). Maps are keyed by the whole identity, never by a hash of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CanonicalIdentity {
    owner_instance_id: [u8; 8],
    buffer_id: u64,
    generation: NonZeroU32,
}

impl CanonicalIdentity {
    /// An identity.
    ///
    /// # Errors
    /// [`Error::InvalidField`] naming `generation` when it is 0.
    pub fn new(owner_instance_id: [u8; 8], buffer_id: u64, generation: u32) -> Result<Self, Error> {
        let generation = NonZeroU32::new(generation)
            .ok_or_else(|| Error::invalid("generation", generation, "generation 0 is invalid"))?;
        Ok(CanonicalIdentity {
            owner_instance_id,
            buffer_id,
            generation,
        })
    }

    /// The random id of the orchestrator incarnation that created the buffer.
    pub fn owner_instance_id(&self) -> [u8; 8] {
        self.owner_instance_id
    }

    /// The buffer's id within its owner instance.
    pub fn buffer_id(&self) -> u64 {
        self.buffer_id
    }

    /// The generation, never 0.
    pub fn generation(&self) -> u32 {
        self.generation.get()
    }

    /// The owner instance id as 16 lowercase hex digits.
    pub fn owner_hex(&self) -> String {
        hex(&self.owner_instance_id)
    }

    /// Encodes to the 32-byte wire form (padding zeroed).
    pub fn encode(&self) -> [u8; IDENTITY_SIZE] {
        let mut w = Writer::<IDENTITY_SIZE>::new();
        self.write(&mut w);
        w.finish()
    }

    /// Decodes the 32-byte wire form.
    ///
    /// # Errors
    /// [`Error::Truncated`] / [`Error::TrailingBytes`] when `bytes` is not
    /// 32 bytes long, [`Error::InvalidField`] when the generation is 0.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        exact_len("identity", bytes, IDENTITY_SIZE)?;
        Self::read(&mut Reader::new("identity", bytes))
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let owner = r.array::<8>()?;
        let buffer_id = r.u64()?;
        let generation = r.u32()?;
        let _pad = r.array::<12>()?;
        CanonicalIdentity::new(owner, buffer_id, generation)
    }

    pub(crate) fn write<const N: usize>(&self, w: &mut Writer<N>) {
        w.put(&self.owner_instance_id);
        w.put(&self.buffer_id.to_le_bytes());
        w.put(&self.generation.get().to_le_bytes());
        w.zeros(12);
    }
}

impl std::fmt::Display for CanonicalIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{:016x}:{}",
            self.owner_hex(),
            self.buffer_id,
            self.generation
        )
    }
}

/// Where a buffer's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AddressSpace {
    /// Host memory.
    Host = 0,
    /// A chip's device memory.
    Device = 1,
}

impl AddressSpace {
    /// The space with wire code `code`.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(AddressSpace::Host),
            1 => Some(AddressSpace::Device),
            _ => None,
        }
    }
    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }
    /// `HOST` or `DEVICE`.
    pub const fn name(self) -> &'static str {
        match self {
            AddressSpace::Host => "HOST",
            AddressSpace::Device => "DEVICE",
        }
    }
}

/// What a buffer's backing grants to the tasks that use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Access {
    /// Read only.
    Read = 0,
    /// Write only.
    Write = 1,
    /// Read and write.
    ReadWrite = 2,
}

impl Access {
    /// The access with wire code `code`.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Access::Read),
            1 => Some(Access::Write),
            2 => Some(Access::ReadWrite),
            _ => None,
        }
    }
    /// The wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }
    /// `READ`, `WRITE` or `READWRITE`.
    pub const fn name(self) -> &'static str {
        match self {
            Access::Read => "READ",
            Access::Write => "WRITE",
            Access::ReadWrite => "READWRITE",
        }
    }
    /// Whether tasks may read through this grant.
    pub const fn allows_read(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }
    /// Whether tasks may write through this grant.
    pub const fn allows_write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// The kind of memory object behind a buffer. The discriminant is the wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
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
    /// The upper-case name used by the brief.
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
    fn body(&self) -> ([u8; MAX_BODY_LEN], usize) {
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
    fn parse(kind: BackendKind, body: &[u8]) -> Result<Backing, Error> {
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

/// What a tensor argument points into: a buffer's identity, size, grant and
/// backing. Only valid descriptors can be built or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferDescriptor {
    address_space: AddressSpace,
    access: Access,
    backing: Backing,
    identity: CanonicalIdentity,
    nbytes: u64,
    owner_worker_path_id: u32,
}

impl BufferDescriptor {
    /// A descriptor.
    ///
    /// # Errors
    /// [`Error::InvalidField`] naming `address_space` when the backing cannot
    /// live in `address_space`, or `access` when a FORK_COW buffer is granted
    /// anything but READ.
    pub fn new(
        identity: CanonicalIdentity,
        nbytes: u64,
        address_space: AddressSpace,
        access: Access,
        backing: Backing,
    ) -> Result<Self, Error> {
        check_pairing(address_space, access, backing.kind())?;
        Ok(BufferDescriptor {
            address_space,
            access,
            backing,
            identity,
            nbytes,
            owner_worker_path_id: 0,
        })
    }

    /// Sets the diagnostic path id of the worker that owns the buffer.
    #[must_use]
    pub fn with_owner_worker_path_id(mut self, id: u32) -> Self {
        self.owner_worker_path_id = id;
        self
    }

    /// Returns the same descriptor with a narrower or wider grant.
    ///
    /// # Errors
    /// As [`BufferDescriptor::new`].
    pub fn with_access(self, access: Access) -> Result<Self, Error> {
        check_pairing(self.address_space, access, self.backing.kind())?;
        Ok(BufferDescriptor { access, ..self })
    }

    /// The buffer's identity.
    pub fn identity(&self) -> &CanonicalIdentity {
        &self.identity
    }
    /// The buffer's size in bytes.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
    /// Host or device.
    pub fn address_space(&self) -> AddressSpace {
        self.address_space
    }
    /// What the backing grants.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Backend kind and body.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }
    /// Diagnostic id of the worker path that owns the buffer.
    pub fn owner_worker_path_id(&self) -> u32 {
        self.owner_worker_path_id
    }

    /// Encodes to the 88-byte wire form.
    pub fn encode(&self) -> [u8; DESCRIPTOR_SIZE] {
        let mut w = Writer::<DESCRIPTOR_SIZE>::new();
        self.write(&mut w);
        w.finish()
    }

    /// Decodes and validates the 88-byte wire form.
    ///
    /// # Errors
    /// [`Error::Truncated`] / [`Error::TrailingBytes`] when `bytes` is not
    /// 88 bytes long; [`Error::InvalidField`] naming the first field that
    /// breaks a rule of DESIGN §3.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        exact_len("buffer descriptor", bytes, DESCRIPTOR_SIZE)?;
        Self::read(&mut Reader::new("buffer descriptor", bytes))
    }

    pub(crate) fn write<const N: usize>(&self, w: &mut Writer<N>) {
        let (body, body_len) = self.backing.body();
        w.put(&DESCRIPTOR_MAGIC.to_le_bytes());
        w.put(&[
            self.address_space.code(),
            self.access.code(),
            self.backing.kind().code(),
        ]);
        w.zeros(3);
        self.identity.write(w);
        w.put(&self.nbytes.to_le_bytes());
        w.put(&self.owner_worker_path_id.to_le_bytes());
        // body_len is at most 32.
        w.put(&u16::try_from(body_len).unwrap_or(0).to_le_bytes());
        w.zeros(2);
        w.put(&body);
    }

    /// The validator behind every decode: reads the fields in layout order and
    /// checks every rule before a descriptor exists.
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let magic = r.u16()?;
        if magic != DESCRIPTOR_MAGIC {
            return Err(Error::invalid("magic", magic, "must be 0x5342"));
        }
        let space_code = r.u8()?;
        let address_space = AddressSpace::from_code(space_code).ok_or_else(|| {
            Error::invalid(
                "address_space",
                space_code,
                "must be HOST (0) or DEVICE (1)",
            )
        })?;
        let access_code = r.u8()?;
        let access = Access::from_code(access_code).ok_or_else(|| {
            Error::invalid(
                "access",
                access_code,
                "must be READ (0), WRITE (1) or READWRITE (2)",
            )
        })?;
        let kind_code = r.u8()?;
        let kind = BackendKind::from_code(kind_code)
            .ok_or_else(|| Error::invalid("backend_kind", kind_code, "must be 0 to 6"))?;
        check_zero(r, "pad@5", 3)?;
        let identity =
            CanonicalIdentity::read(r).map_err(|e| e.within(format_args!("identity")))?;
        let nbytes = r.u64()?;
        let owner_worker_path_id = r.u32()?;
        let body_len = r.u16()?;
        check_zero(r, "pad@54", 2)?;
        let body = r.array::<MAX_BODY_LEN>()?;
        let body_len = usize::from(body_len);
        let Some((used, tail)) = body.split_at_checked(body_len) else {
            return Err(Error::invalid("body_len", body_len, "must be at most 32"));
        };
        if let Some(i) = tail.iter().position(|&b| b != 0) {
            let at = body_len + i;
            let byte = tail.get(i).copied().unwrap_or(0);
            return Err(Error::invalid(
                format!("body[{at}]"),
                byte,
                "body bytes past body_len must be zero",
            ));
        }
        let backing = Backing::parse(kind, used)?;
        check_pairing(address_space, access, kind)?;
        Ok(BufferDescriptor {
            address_space,
            access,
            backing,
            identity,
            nbytes,
            owner_worker_path_id,
        })
    }
}

fn check_pairing(space: AddressSpace, access: Access, kind: BackendKind) -> Result<(), Error> {
    if !kind.allows_space(space) {
        let rule = match kind {
            BackendKind::DeviceMalloc | BackendKind::VmmWindow => {
                "DEVICE_MALLOC and VMM_WINDOW buffers live in DEVICE space"
            }
            _ => "FORK_SHM, POSIX_SHM, FORK_COW and MEMFD buffers live in HOST space",
        };
        return Err(Error::invalid("address_space", space.code(), rule));
    }
    if kind == BackendKind::ForkCow && access != Access::Read {
        return Err(Error::invalid(
            "access",
            access.code(),
            "a FORK_COW buffer grants READ only",
        ));
    }
    Ok(())
}

pub(crate) fn check_zero(r: &mut Reader<'_>, field: &'static str, n: usize) -> Result<(), Error> {
    let bytes = r.bytes(n)?;
    match bytes.iter().find(|&&b| b != 0) {
        Some(&b) => Err(Error::invalid(field, b, "padding must be zero")),
        None => Ok(()),
    }
}

pub(crate) fn exact_len(what: &'static str, bytes: &[u8], size: usize) -> Result<(), Error> {
    match bytes.len().cmp(&size) {
        std::cmp::Ordering::Less => Err(Error::Truncated {
            what,
            needed: size,
            available: bytes.len(),
        }),
        std::cmp::Ordering::Greater => Err(Error::TrailingBytes {
            what,
            expected: size,
            available: bytes.len(),
        }),
        std::cmp::Ordering::Equal => Ok(()),
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

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
