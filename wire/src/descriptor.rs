//! Buffer descriptors (docs/wire-format.md §3): what a tensor argument points into.
//!
//! Layout of a [`BufferDescriptor`] (88 bytes, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | `magic` = 0x5342 |
//! | 2 | 1 | `address_space` (HOST 0, DEVICE 1) |
//! | 3 | 1 | `access` (READ 0, WRITE 1, READWRITE 2) |
//! | 4 | 1 | `backend_kind` |
//! | 5 | 3 | pad (written zero, not checked) |
//! | 8 | 32 | `identity` ([`CanonicalIdentity`]) |
//! | 40 | 8 | `nbytes` |
//! | 48 | 4 | `owner_worker_path_id` (diagnostic) |
//! | 52 | 2 | `body_len` (≤ 32) |
//! | 54 | 2 | pad (written zero, not checked) |
//! | 56 | 32 | `body`, zero past `body_len` |
//!
//! Padding is alignment slack, as in simpler (whose `buffer.h` strata is
//! layout-compatible with): simpler never checks its `_pad` fields, so a
//! record it wrote may carry anything there. Decoding skips the padding of the
//! descriptor and of its identity, and the decoded value has no field to keep
//! it in, so equality, hashing and every key ignore it and re-encoding writes
//! zeros. What must be zero is data a producer chose not to fill: the body
//! bytes past `body_len`.

use crate::backing::{BackendKind, Backing, MAX_BODY_LEN};
use crate::codec::{Reader, Writer, exact_len};
use crate::{CanonicalIdentity, Error};

/// Descriptor magic, "BS" little-endian.
pub const DESCRIPTOR_MAGIC: u16 = 0x5342;

/// Encoded size of a [`BufferDescriptor`].
pub const DESCRIPTOR_SIZE: usize = 88;

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
    /// Whether this grant is `grant` or narrower: everything it allows,
    /// `grant` allows too. READ and WRITE are each within READWRITE and
    /// within themselves; neither is within the other.
    pub const fn is_within(self, grant: Access) -> bool {
        (!self.allows_read() || grant.allows_read())
            && (!self.allows_write() || grant.allows_write())
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An `owner_worker_path_id` as strata shows it: `<path#N>`. Only the
/// driver that set it knows which path `N` is; it names the path beside
/// the label where it can (`unix:/run/w0.sock <path#1>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerPath(pub u32);

impl std::fmt::Display for OwnerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<path#{}>", self.0)
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

    /// The same descriptor granting `access`, which must be the buffer's
    /// grant or narrower ([`Access::is_within`]): a derived descriptor, like
    /// a derived view, may grant less than its buffer, never more (docs/wire-format.md §3).
    /// There is deliberately no way to widen a grant: a widened alias would
    /// let a task write through a buffer its owner shared read-only.
    ///
    /// # Errors
    /// [`Error::AccessWidened`] naming both accesses when `access` is not
    /// within the current grant.
    pub fn narrowed(self, access: Access) -> Result<Self, Error> {
        if !access.is_within(self.access) {
            return Err(Error::AccessWidened {
                granted: self.access,
                requested: access,
            });
        }
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
    /// Diagnostic id of the worker path that owns the buffer (0: none
    /// said). A driver gives each worker path it knows an id from 1 and
    /// sets it on the buffers a worker owns; nothing routes, gates or keys
    /// on it (a worker finds a buffer by its identity, and compares a
    /// task's descriptor with its import's without it).
    pub fn owner_worker_path_id(&self) -> u32 {
        self.owner_worker_path_id
    }

    /// The owner's path id as strata shows it (`<path#3>`), or `None` when
    /// it is 0.
    pub fn owner_path(&self) -> Option<OwnerPath> {
        (self.owner_worker_path_id != 0).then_some(OwnerPath(self.owner_worker_path_id))
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
    /// breaks a rule of docs/wire-format.md §3.
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
        // Alignment slack: not checked, not kept (see the module docs).
        let _pad = r.array::<3>()?;
        let identity =
            CanonicalIdentity::read(r).map_err(|e| e.within(format_args!("identity")))?;
        let nbytes = r.u64()?;
        let owner_worker_path_id = r.u32()?;
        let body_len = r.u16()?;
        let _pad = r.array::<2>()?;
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
        Ok(
            BufferDescriptor::new(identity, nbytes, address_space, access, backing)?
                .with_owner_worker_path_id(owner_worker_path_id),
        )
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
