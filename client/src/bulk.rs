//! The client end of a worker's data connection ([`strata_proto::bulk`]):
//! `Stage` and `Fetch` bodies in plain frames on a TCP connection of their
//! own, so that view bytes go from the caller's buffer to the socket and
//! back without a protobuf or HTTP/2 layer copying them.
//!
//! A refusal comes back as the [`tonic::Status`] the same refusal of a
//! `Stage` or `Fetch` call would have (`INVALID_ARGUMENT`, `NOT_FOUND`,
//! `RESOURCE_EXHAUSTED`, `UNAUTHENTICATED`), so callers map both the same
//! way; a broken or out-of-step connection is [`ClientError::Data`] or
//! [`ClientError::Protocol`].

use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags};

use strata_boundary::SessionId;
use strata_proto::bulk::{HEADER_BYTES, Hello, RefusalCode, Reply, Request};
use strata_proto::convert::DataOffer;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tonic::{Code, Status};

use crate::ClientError;

/// What a stage sends: bytes in memory, or a run of a file (a host
/// buffer's memfd) that goes to the socket by `sendfile(2)`, never through
/// this process's memory.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    /// Packed bytes.
    Bytes(&'a [u8]),
    /// `len` bytes of `fd` from `offset`.
    File {
        /// The file.
        fd: BorrowedFd<'a>,
        /// Where the bytes start.
        offset: u64,
        /// How many.
        len: u64,
    },
}

impl Body<'_> {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::File { len, .. } => *len,
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One authenticated data connection of a session.
#[derive(Debug)]
pub struct DataConnection {
    stream: TcpStream,
    /// The pipe fetched bytes pass through on their way from the socket
    /// to a file (`splice(2)` needs a pipe on one side); made on first use.
    pipe: Option<(OwnedFd, OwnedFd)>,
}

/// Bytes a pipe between the socket and a file holds (what one pair of
/// `splice` calls moves).
const PIPE_BYTES: usize = 1 << 20;

fn io(e: std::io::Error) -> ClientError {
    ClientError::Data(e)
}

impl DataConnection {
    /// Connects to the data port the handshake offered, on the worker's
    /// address `addr`, and proves the session with its secret. Written
    /// views of at least `hold_from` bytes are then held by the worker for
    /// [`DataConnection::fetch`] rather than sent in their completions
    /// (0 leaves that as it was).
    ///
    /// # Errors
    /// [`ClientError::Data`] when the connection fails; the worker's
    /// refusal (`UNAUTHENTICATED` for an unknown session or a wrong
    /// secret, `RESOURCE_EXHAUSTED` past its connections per session) as a
    /// [`ClientError::Status`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it closes the half-open connection, which the
    /// worker forgets.
    pub async fn connect(
        addr: SocketAddr,
        session: SessionId,
        offer: &DataOffer,
        hold_from: u64,
    ) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(addr).await.map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let mut c = DataConnection { stream, pipe: None };
        let hello = Hello {
            session: session.0,
            hold_from,
            secret: offer.secret.0,
        };
        c.stream.write_all(&hello.encode()).await.map_err(io)?;
        match c.reply().await? {
            Reply::Ok { .. } => Ok(c),
            other => Err(c.unexpected("hello", other).await),
        }
    }

    async fn reply(&mut self) -> Result<Reply, ClientError> {
        let mut h = [0u8; HEADER_BYTES];
        self.stream.read_exact(&mut h).await.map_err(io)?;
        Reply::decode(&h).map_err(|e| ClientError::Protocol(format!("data connection: {e}")))
    }

    /// The error for a reply that is not the one `what` expects: the
    /// worker's refusal with its reason, or a protocol error.
    async fn unexpected(&mut self, what: &str, reply: Reply) -> ClientError {
        let Reply::Refused { code, len, .. } = reply else {
            return ClientError::Protocol(format!(
                "data connection: {reply:?} in answer to {what}"
            ));
        };
        // `len` ≤ MAX_REASON_BYTES: the header was checked.
        let mut reason = vec![0u8; usize::try_from(len).unwrap_or(0)];
        if let Err(e) = self.stream.read_exact(&mut reason).await {
            return io(e);
        }
        let reason = String::from_utf8_lossy(&reason).into_owned();
        let code = match code {
            RefusalCode::Invalid => Code::InvalidArgument,
            RefusalCode::NotFound => Code::NotFound,
            RefusalCode::Exhausted => Code::ResourceExhausted,
            RefusalCode::Unauthenticated => Code::Unauthenticated,
            RefusalCode::Unavailable => Code::Unavailable,
        };
        ClientError::Status(Status::new(code, reason))
    }

    /// Stages `body` as `id` (what a `Stage` call does); returns once the
    /// worker holds all of it.
    ///
    /// # Errors
    /// The worker's refusal (an id in use, its table full) as a
    /// [`ClientError::Status`]; the connection is still usable after one.
    /// [`ClientError::Data`] when the connection or the file fails.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped midway, the connection is out of step and
    /// must be dropped (the worker then gives back what arrived).
    pub async fn stage(&mut self, id: u64, body: Body<'_>) -> Result<(), ClientError> {
        if body.is_empty() || body.len() > strata_proto::MAX_INLINE_EXTENT {
            // The worker would take the header as malformed and close.
            return Err(ClientError::Status(Status::invalid_argument(format!(
                "stage {id}: {} bytes: staged bytes are 1 to {} bytes (the largest inline view)",
                body.len(),
                strata_proto::MAX_INLINE_EXTENT
            ))));
        }
        let header = Request::Stage {
            id,
            len: body.len(),
        }
        .encode();
        self.stream.write_all(&header).await.map_err(io)?;
        match body {
            Body::Bytes(b) => self.stream.write_all(b).await.map_err(io)?,
            Body::File { fd, offset, len } => self.send_file(fd, offset, len).await?,
        }
        match self.reply().await? {
            Reply::Ok { id: got } if got == id => Ok(()),
            other => Err(self.unexpected("a stage", other).await),
        }
    }

    /// `len` bytes of `fd` from `offset` to the socket, by `sendfile(2)`:
    /// the kernel copies from the file's pages into the socket's buffers.
    async fn send_file(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
    ) -> Result<(), ClientError> {
        let mut off = i64::try_from(offset)
            .map_err(|_| ClientError::Protocol(format!("offset {offset} past a file's range")))?;
        let end = offset
            .checked_add(len)
            .and_then(|e| i64::try_from(e).ok())
            .ok_or_else(|| ClientError::Protocol(format!("{len} bytes from {offset}")))?;
        while off < end {
            let want = usize::try_from(end - off).unwrap_or(usize::MAX);
            let n = self
                .stream
                .async_io(Interest::WRITABLE, || {
                    nix::sys::sendfile::sendfile64(&self.stream, fd, Some(&mut off), want)
                        .map_err(std::io::Error::from)
                })
                .await
                .map_err(io)?;
            if n == 0 {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the file ended at {off}, before the {len} bytes from {offset}"),
                )));
            }
        }
        Ok(())
    }

    /// Fetches the bytes the worker holds as `id` (at most `max`) into
    /// `into`, replacing its contents; the worker gives them out once.
    ///
    /// # Errors
    /// The worker's refusal (no such bytes) as a [`ClientError::Status`];
    /// more than `max` bytes, or a broken connection.
    ///
    /// # Cancel safety
    /// Not cancel safe: the bytes are given out once, and a dropped call
    /// loses them and leaves the connection out of step.
    pub async fn fetch(
        &mut self,
        id: u64,
        max: u64,
        into: &mut Vec<u8>,
    ) -> Result<(), ClientError> {
        // No worker holds more than that; a larger `max` would be a
        // malformed header to it.
        let max = max.clamp(1, strata_proto::MAX_INLINE_EXTENT);
        self.stream
            .write_all(&Request::Fetch { id, max }.encode())
            .await
            .map_err(io)?;
        let len = match self.reply().await? {
            Reply::Data { id: got, len } if got == id && len <= max => len,
            Reply::Data { id: got, len } if got == id => {
                return Err(ClientError::Protocol(format!(
                    "fetch {id}: the worker sends {len} bytes, more than the {max} expected"
                )));
            }
            other => return Err(self.unexpected("a fetch", other).await),
        };
        let len = usize::try_from(len)
            .map_err(|_| ClientError::Protocol(format!("fetch {id}: {len} bytes")))?;
        into.clear();
        into.reserve(len);
        // Straight into the caller's string: no zeroing, no second copy.
        let mut body = (&mut self.stream).take(len as u64);
        while into.len() < len {
            if body.read_buf(into).await.map_err(io)? == 0 {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("fetch {id}: {} of {len} bytes arrived", into.len()),
                )));
            }
        }
        Ok(())
    }

    /// Fetches the bytes the worker holds as `id`, exactly `len` of them,
    /// into `fd` at `offset`: `splice(2)` moves them from the socket into
    /// a pipe without a copy and from the pipe into the file's pages with
    /// one, never through this process's memory. They land as they
    /// arrive: a fetch that fails midway leaves the range partly written.
    ///
    /// # Errors
    /// The worker's refusal (no such bytes) as a [`ClientError::Status`]
    /// (the file untouched); a length other than `len`, a broken
    /// connection, or a file that refuses the bytes.
    ///
    /// # Cancel safety
    /// Not cancel safe, as [`DataConnection::fetch`].
    pub async fn fetch_to_file(
        &mut self,
        id: u64,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
    ) -> Result<(), ClientError> {
        let max = len.clamp(1, strata_proto::MAX_INLINE_EXTENT);
        self.stream
            .write_all(&Request::Fetch { id, max }.encode())
            .await
            .map_err(io)?;
        match self.reply().await? {
            Reply::Data { id: got, len: sent } if got == id && sent == len => {}
            Reply::Data { id: got, len: sent } if got == id => {
                return Err(ClientError::Protocol(format!(
                    "fetch {id}: the worker sends {sent} bytes for a view of {len}"
                )));
            }
            other => return Err(self.unexpected("a fetch", other).await),
        }
        if self.pipe.is_none() {
            let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
                .map_err(|e| io(e.into()))?;
            // Larger than the default 64 KiB: fewer calls per view. A
            // system that refuses keeps the default, which only costs calls.
            let _ = nix::fcntl::fcntl(&w, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as i32));
            self.pipe = Some((r, w));
        }
        let Some((pipe_r, pipe_w)) = &self.pipe else {
            return Err(ClientError::Protocol("no pipe".into()));
        };
        let mut at = i64::try_from(offset)
            .map_err(|_| ClientError::Protocol(format!("offset {offset} past a file's range")))?;
        let mut left = len;
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(PIPE_BYTES);
            // Socket to pipe: page references move, no bytes are copied.
            let moved = self
                .stream
                .async_io(tokio::io::Interest::READABLE, || {
                    nix::fcntl::splice(
                        &self.stream,
                        None,
                        pipe_w,
                        None,
                        want,
                        SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK,
                    )
                    .map_err(std::io::Error::from)
                })
                .await
                .map_err(io)?;
            if moved == 0 {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("fetch {id}: {} of {len} bytes arrived", len - left),
                )));
            }
            // Pipe to file: all of it, now (the pipe holds it; the file
            // never blocks).
            let mut in_pipe = moved;
            while in_pipe > 0 {
                let n = nix::fcntl::splice(
                    pipe_r,
                    None,
                    fd,
                    Some(&mut at),
                    in_pipe,
                    SpliceFFlags::SPLICE_F_MOVE,
                )
                .map_err(|e| io(e.into()))?;
                if n == 0 {
                    return Err(io(std::io::Error::new(
                        std::io::ErrorKind::WriteZero,
                        format!("fetch {id}: the file took no more bytes at {at}"),
                    )));
                }
                in_pipe -= n;
            }
            left -= moved as u64;
        }
        Ok(())
    }
}
