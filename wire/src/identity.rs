//! Canonical buffer identities (docs/wire-format.md §2).
//!
//! Layout (32 bytes, little-endian): `owner_instance_id[8]` @0, `buffer_id`
//! u64 @8, `generation` u32 @16 (0 is invalid), padding @20..32. The padding
//! is ignored on decode, by equality and by hashing, as docs/wire-format.md §2 says, so
//! identities minted by other systems compare by their real fields.

use std::num::NonZeroU32;

use crate::Error;
use crate::codec::{Reader, Writer, exact_len};

/// Encoded size of a [`CanonicalIdentity`].
pub const IDENTITY_SIZE: usize = 32;

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

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
