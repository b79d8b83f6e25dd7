//! The framing of a worker's **data connection**, shared by its two ends
//! (the client in `strata-client`, the server in `strata-worker`): a plain
//! TCP connection beside the gRPC one that carries the bodies of `Stage`
//! and `Fetch` — view bytes too large for a message — without HTTP/2 and
//! protobuf in between, so that each end can move them from and into its
//! own buffers (`sendfile(2)` from a memfd, a read straight into the
//! staged bytes). No IO here: the ends read and write, this module encodes
//! and checks.
//!
//! Protocol (every integer little-endian):
//! 1. The client opens the connection and sends a [`Hello`]
//!    ([`HELLO_BYTES`]): magic `STRB`, [`VERSION`], the session id and
//!    secret its gRPC handshake returned (`HandshakeReply.data_port` and
//!    `data_secret`; the handshake is the authenticated step), and the
//!    size from which the worker should hold written views for it to
//!    fetch here rather than send them in completions.
//! 2. The worker answers [`Reply::Ok`], or [`Reply::Refused`] with
//!    a reason and closes the connection.
//! 3. Then any number of requests, one at a time, each a [`Request`]
//!    header ([`HEADER_BYTES`]):
//!    - `Stage { id, len }` followed by exactly `len` body bytes. The worker
//!      answers `Ok` once it holds them under `id` (as a `Stage` call
//!      does), or `Refused` (a full table, an id in use) after reading and
//!      dropping the body, so the connection stays in step.
//!    - `Fetch { id, max }`: the worker answers `Data { id, len }` followed
//!      by the `len ≤ max` bytes it held under `id`, given out once, or
//!      `Refused`.
//! 4. A header that fails [`Request::decode`] ends the connection (never
//!    the worker, never the session): nothing after a malformed header can
//!    be trusted to be in step.
//!
//! ```
//! use strata_proto::bulk::{Request, HEADER_BYTES};
//!
//! let header = Request::Stage { id: 3, len: 1 << 20 }.encode();
//! assert_eq!(header.len(), HEADER_BYTES);
//! assert_eq!(Request::decode(&header).unwrap(), Request::Stage { id: 3, len: 1 << 20 });
//! let mut bad = header;
//! bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
//! assert!(Request::decode(&bad).is_err(), "longer than any staged view");
//! ```

use crate::MAX_INLINE_EXTENT;

/// The first four bytes of a hello: `STRB`.
pub const MAGIC: [u8; 4] = *b"STRB";

/// The data connection's protocol version.
pub const VERSION: u32 = 1;

/// Bytes of the per-session secret.
pub const SECRET_BYTES: usize = 32;

/// Bytes of a hello: magic, version, session, hold-from, reserved, secret.
pub const HELLO_BYTES: usize = 4 + 4 + 8 + 8 + 8 + SECRET_BYTES;

/// Bytes of a request or reply header: kind, code, id, length.
pub const HEADER_BYTES: usize = 24;

/// Longest refusal reason a reply may carry.
pub const MAX_REASON_BYTES: usize = 4096;

/// Why bytes are not a valid frame. The messages name the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BulkError {
    /// The hello does not start with [`MAGIC`].
    #[error("hello.magic: {got:02x?} is not a strata data connection (expected \"STRB\")")]
    Magic {
        /// What came instead.
        got: [u8; 4],
    },
    /// A version this build does not speak.
    #[error("hello.version: {got} (this build speaks {VERSION})")]
    Version {
        /// The version sent.
        got: u32,
    },
    /// A kind code that names no request or reply.
    #[error("{frame}.kind: unknown code {got}")]
    Kind {
        /// `request` or `reply`.
        frame: &'static str,
        /// The code.
        got: u32,
    },
    /// A field that must be zero is not.
    #[error("{field}: {got} (must be 0)")]
    NotZero {
        /// The field's path.
        field: &'static str,
        /// Its value.
        got: u64,
    },
    /// An id of 0 (ids are nonzero).
    #[error("{field}: 0 (ids are nonzero)")]
    ZeroId {
        /// The field's path.
        field: &'static str,
    },
    /// A length outside what the field allows.
    #[error("{field}: {len} bytes (allowed: {min} to {max})")]
    Length {
        /// The field's path.
        field: &'static str,
        /// The length sent.
        len: u64,
        /// The least allowed.
        min: u64,
        /// The most allowed.
        max: u64,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_le_bytes(w)
}

fn check_len(field: &'static str, len: u64, min: u64, max: u64) -> Result<u64, BulkError> {
    if len < min || len > max {
        return Err(BulkError::Length {
            field,
            len,
            min,
            max,
        });
    }
    Ok(len)
}

/// The first frame of a data connection.
#[derive(Clone, PartialEq, Eq)]
pub struct Hello {
    /// The session, as its handshake returned it.
    pub session: u64,
    /// Written views of at least this many bytes are held for a fetch on
    /// this connection instead of travelling in their completion; 0 keeps
    /// the session's setting.
    pub hold_from: u64,
    /// The session's secret, as its handshake returned it.
    pub secret: [u8; SECRET_BYTES],
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("Hello")
            .field("session", &self.session)
            .field("hold_from", &self.hold_from)
            .finish_non_exhaustive()
    }
}

impl Hello {
    /// The hello's bytes.
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.session.to_le_bytes());
        b[16..24].copy_from_slice(&self.hold_from.to_le_bytes());
        b[32..].copy_from_slice(&self.secret);
        b
    }

    /// Checks and decodes a hello.
    ///
    /// # Errors
    /// A wrong magic or version, a nonzero reserved field, a session of 0.
    pub fn decode(b: &[u8; HELLO_BYTES]) -> Result<Self, BulkError> {
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&b[0..4]);
        if magic != MAGIC {
            return Err(BulkError::Magic { got: magic });
        }
        let version = u32_at(b, 4);
        if version != VERSION {
            return Err(BulkError::Version { got: version });
        }
        let session = u64_at(b, 8);
        if session == 0 {
            return Err(BulkError::ZeroId {
                field: "hello.session",
            });
        }
        let reserved = u64_at(b, 24);
        if reserved != 0 {
            return Err(BulkError::NotZero {
                field: "hello.reserved",
                got: reserved,
            });
        }
        let mut secret = [0u8; SECRET_BYTES];
        secret.copy_from_slice(&b[32..]);
        Ok(Hello {
            session,
            hold_from: u64_at(b, 16),
            secret,
        })
    }
}

/// A request after the hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `len` bytes follow, to be staged as `id`.
    Stage {
        /// The stage id a task will name.
        id: u64,
        /// How many bytes follow.
        len: u64,
    },
    /// The bytes held as `id`, at most `max` of them.
    Fetch {
        /// The id a completion named.
        id: u64,
        /// The most bytes the client takes.
        max: u64,
    },
}

const STAGE: u32 = 1;
const FETCH: u32 = 2;

fn header(kind: u32, code: u32, id: u64, len: u64) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    b[0..4].copy_from_slice(&kind.to_le_bytes());
    b[4..8].copy_from_slice(&code.to_le_bytes());
    b[8..16].copy_from_slice(&id.to_le_bytes());
    b[16..24].copy_from_slice(&len.to_le_bytes());
    b
}

impl Request {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        match *self {
            Request::Stage { id, len } => header(STAGE, 0, id, len),
            Request::Fetch { id, max } => header(FETCH, 0, id, max),
        }
    }

    /// Checks and decodes a request header: a known kind, a zero code, a
    /// nonzero id, a length of 1 to [`MAX_INLINE_EXTENT`] bytes (what a
    /// `Stage` call accepts). Nothing is allocated before this passes.
    ///
    /// # Errors
    /// The first field that is wrong, by name.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Self, BulkError> {
        let kind = u32_at(b, 0);
        let code = u32_at(b, 4);
        if code != 0 {
            return Err(BulkError::NotZero {
                field: "request.code",
                got: u64::from(code),
            });
        }
        let (id, len) = (u64_at(b, 8), u64_at(b, 16));
        match kind {
            STAGE => {
                if id == 0 {
                    return Err(BulkError::ZeroId { field: "stage.id" });
                }
                let len = check_len("stage.len", len, 1, MAX_INLINE_EXTENT)?;
                Ok(Request::Stage { id, len })
            }
            FETCH => {
                if id == 0 {
                    return Err(BulkError::ZeroId { field: "fetch.id" });
                }
                let max = check_len("fetch.max", len, 1, MAX_INLINE_EXTENT)?;
                Ok(Request::Fetch { id, max })
            }
            got => Err(BulkError::Kind {
                frame: "request",
                got,
            }),
        }
    }
}

/// Why the worker refused a hello or a request; the client turns it into
/// the matching gRPC status, so that a refusal here means what the same
/// refusal of a `Stage` or `Fetch` call means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    /// Malformed or out of range (`INVALID_ARGUMENT`).
    Invalid = 1,
    /// No such held bytes, or the session ended (`NOT_FOUND`).
    NotFound = 2,
    /// The session's table is full, or it has too many data connections
    /// (`RESOURCE_EXHAUSTED`).
    Exhausted = 3,
    /// An unknown session or a wrong secret (`UNAUTHENTICATED`).
    Unauthenticated = 4,
    /// The worker is shutting down (`UNAVAILABLE`).
    Unavailable = 5,
}

impl RefusalCode {
    fn from_u32(c: u32) -> Option<Self> {
        Some(match c {
            1 => RefusalCode::Invalid,
            2 => RefusalCode::NotFound,
            3 => RefusalCode::Exhausted,
            4 => RefusalCode::Unauthenticated,
            5 => RefusalCode::Unavailable,
            _ => return None,
        })
    }
}

/// A reply header from the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The hello or the stage `id` was taken.
    Ok {
        /// The stage id (the session id for a hello).
        id: u64,
    },
    /// `len` held bytes of `id` follow.
    Data {
        /// The fetched id.
        id: u64,
        /// How many bytes follow.
        len: u64,
    },
    /// Refused: a reason of `len` bytes (UTF-8) follows.
    Refused {
        /// Why, as a status would say.
        code: RefusalCode,
        /// The request's id (the session id for a hello).
        id: u64,
        /// Bytes of the reason that follows.
        len: u64,
    },
}

const OK: u32 = 0x10;
const DATA: u32 = 0x11;
const REFUSED: u32 = 0x12;

impl Reply {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        match *self {
            Reply::Ok { id } => header(OK, 0, id, 0),
            Reply::Data { id, len } => header(DATA, 0, id, len),
            Reply::Refused { code, id, len } => header(REFUSED, code as u32, id, len),
        }
    }

    /// Checks and decodes a reply header (the client's side of the same
    /// rules: nothing the worker sends is trusted either).
    ///
    /// # Errors
    /// The first field that is wrong, by name.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Self, BulkError> {
        let kind = u32_at(b, 0);
        let code = u32_at(b, 4);
        let (id, len) = (u64_at(b, 8), u64_at(b, 16));
        let zero_code = || {
            if code == 0 {
                Ok(())
            } else {
                Err(BulkError::NotZero {
                    field: "reply.code",
                    got: u64::from(code),
                })
            }
        };
        match kind {
            OK => {
                zero_code()?;
                if len != 0 {
                    return Err(BulkError::NotZero {
                        field: "ok.len",
                        got: len,
                    });
                }
                Ok(Reply::Ok { id })
            }
            DATA => {
                zero_code()?;
                let len = check_len("data.len", len, 0, MAX_INLINE_EXTENT)?;
                Ok(Reply::Data { id, len })
            }
            REFUSED => {
                let code = RefusalCode::from_u32(code).ok_or(BulkError::Kind {
                    frame: "refusal code",
                    got: code,
                })?;
                let len = check_len("refused.len", len, 0, MAX_REASON_BYTES as u64)?;
                Ok(Reply::Refused { code, id, len })
            }
            got => Err(BulkError::Kind {
                frame: "reply",
                got,
            }),
        }
    }
}

/// A refusal's header and reason, ready to write (the reason cut to
/// [`MAX_REASON_BYTES`] on a character boundary).
pub fn refusal(code: RefusalCode, id: u64, reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(MAX_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = &reason.as_bytes()[..end];
    let mut out = Reply::Refused {
        code,
        id,
        len: reason.len() as u64,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(reason);
    out
}

#[cfg(test)]
mod tests;
