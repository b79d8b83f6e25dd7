//! The client end of a worker's fd side channel: buffer fds by SCM_RIGHTS
//! over a Unix socket.
//!
//! The protocol, whose server end is `strata-worker`'s `fdchan` module and
//! whose framing is [`strata_proto::fdframe`]:
//! 1. the client connects to the socket its handshake named and sends an
//!    `FdHello` frame naming its session;
//! 2. each `FdImport` frame carries, in the same `sendmsg`, exactly as many
//!    fds as it lists identities (and, optionally, one descriptor per
//!    identity: what the buffer is imported as, so that tasks may narrow
//!    that grant but never widen it, docs/wire-format.md §3);
//! 3. the worker answers each with an `FdAck`, one result per identity;
//! 4. closing the channel ends the session on the worker.
//!
//! The client only sends fds; it reads acks with a plain `read`, which
//! takes no fds in: any the worker attached would be discarded by the
//! kernel, never installed in this process. So this end needs no `unsafe`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use prost::Message;
use strata_boundary::SessionId;
use strata_proto::fdframe::{self, HEADER_BYTES};
use strata_proto::{MAX_FDS_PER_MESSAGE, PROTOCOL_VERSION, pb};
use strata_wire::{BufferDescriptor, CanonicalIdentity};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tracing::debug;

/// The client end of a worker's fd channel.
#[derive(Debug)]
pub struct FdChannel {
    stream: UnixStream,
    session: SessionId,
    /// An exchange began and has not finished: it failed or its future was
    /// dropped, and the stream may hold half a frame or an unread ack. A
    /// later exchange would read the wrong ack, so it is refused instead.
    broken: bool,
}

impl FdChannel {
    /// The process id of the worker at the other end, as the kernel reports
    /// it (`SO_PEERCRED`); `None` when it is not visible from here (another
    /// pid namespace).
    pub fn peer_pid(&self) -> Option<u32> {
        self.stream
            .peer_cred()
            .ok()
            .and_then(|c| c.pid())
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p != 0)
    }

    /// Connects to `path` and introduces `session`.
    ///
    /// # Errors
    /// When the socket cannot be reached.
    ///
    /// # Cancel safety
    /// Not cancel safe for the session: dropped after the hello reached the
    /// worker, the worker sees the channel close and ends `session`.
    pub async fn connect(path: &Path, session: SessionId) -> io::Result<Self> {
        let mut stream = UnixStream::connect(path).await?;
        let hello = pb::FdHello {
            protocol_version: PROTOCOL_VERSION,
            session_id: session.0,
        };
        write_frame(&mut stream, &hello.encode_to_vec(), &[]).await?;
        debug!(%session, path = %path.display(), "fd channel open");
        Ok(FdChannel {
            stream,
            session,
            broken: false,
        })
    }

    /// Sends `identities` with `fds` (normally one each, in order) and
    /// returns the worker's result for each identity: `Ok` or why it was
    /// refused. Says nothing of what each buffer grants: the first task
    /// that uses one sets its import descriptor. Prefer
    /// [`FdChannel::import_as`].
    ///
    /// # Errors
    /// When the channel fails or the worker closes it, when more than
    /// [`MAX_FDS_PER_MESSAGE`] fds are given, and after an earlier exchange
    /// failed or was cancelled.
    ///
    /// # Cancel safety
    /// As [`FdChannel::import_as`].
    pub async fn import(
        &mut self,
        identities: &[CanonicalIdentity],
        fds: &[BorrowedFd<'_>],
    ) -> io::Result<Vec<Result<(), String>>> {
        let msg = pb::FdImport {
            identities: identities.iter().map(|i| i.encode().to_vec()).collect(),
            descriptors: Vec::new(),
            ring: None,
        };
        self.exchange(&msg, fds).await
    }

    /// Hands the worker the session's ring memfd (`fd`, lanes of
    /// `submit` and `complete` bytes). `Ok(Ok(()))`: from now on the
    /// session's tasks and completions travel on the ring; `Ok(Err(why))`:
    /// the worker refused it (or does not know rings), and the task stream
    /// carries them as before.
    ///
    /// # Errors
    /// As [`FdChannel::import`].
    ///
    /// # Cancel safety
    /// As [`FdChannel::import_as`].
    pub async fn attach_ring(
        &mut self,
        fd: BorrowedFd<'_>,
        submit: u32,
        complete: u32,
    ) -> io::Result<Result<(), String>> {
        let msg = pb::FdImport {
            identities: Vec::new(),
            descriptors: Vec::new(),
            ring: Some(pb::FdRing {
                submit_capacity: submit,
                complete_capacity: complete,
            }),
        };
        let mut results = self.exchange(&msg, &[fd]).await?;
        Ok(match (results.pop(), results.is_empty()) {
            (Some(r), true) => r,
            _ => Err("the worker did not answer for the ring (it does not take rings)".into()),
        })
    }

    /// Sends the buffers `grants` describe with `fds` (one each, in order),
    /// each imported as its descriptor says: tasks may use it through that
    /// descriptor or a narrower one, never a wider one. Returns the
    /// worker's result for each buffer: `Ok` or why it was refused.
    ///
    /// # Errors
    /// As [`FdChannel::import`].
    ///
    /// # Cancel safety
    /// Not cancel safe. Dropped before it completes, the frame may be
    /// half-written, or written with its fds and imported by the worker
    /// with the ack unread: the results are lost, and the channel is
    /// broken (every later call fails rather than read another call's
    /// ack). Drop the channel, which ends the session, and reconnect.
    pub async fn import_as(
        &mut self,
        grants: &[BufferDescriptor],
        fds: &[BorrowedFd<'_>],
    ) -> io::Result<Vec<Result<(), String>>> {
        let msg = pb::FdImport {
            identities: grants
                .iter()
                .map(|d| d.identity().encode().to_vec())
                .collect(),
            descriptors: grants.iter().map(|d| d.encode().to_vec()).collect(),
            ring: None,
        };
        self.exchange(&msg, fds).await
    }

    async fn exchange(
        &mut self,
        msg: &pb::FdImport,
        fds: &[BorrowedFd<'_>],
    ) -> io::Result<Vec<Result<(), String>>> {
        if self.broken {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "an earlier exchange on this fd channel failed or was cancelled",
            ));
        }
        if fds.len() > MAX_FDS_PER_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} fds in one import; the most is {MAX_FDS_PER_MESSAGE}",
                    fds.len()
                ),
            ));
        }
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        // Set before the first await and cleared after the last: a dropped
        // future leaves it set.
        self.broken = true;
        write_frame(&mut self.stream, &msg.encode_to_vec(), &raw).await?;
        let payload = read_frame(&mut self.stream).await?;
        self.broken = false;
        let ack = pb::FdAck::decode(payload.as_slice())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("FdAck: {e}")))?;
        let results: Vec<Result<(), String>> = ack
            .results
            .into_iter()
            .map(|r| if r.ok { Ok(()) } else { Err(r.error) })
            .collect();
        debug!(
            session = %self.session,
            fds = fds.len(),
            results = results.len(),
            refused = results.iter().filter(|r| r.is_err()).count(),
            "fd import acknowledged"
        );
        Ok(results)
    }
}

/// Writes one frame, with `fds` attached to its first byte.
async fn write_frame(stream: &mut UnixStream, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let frame = fdframe::encode(payload)?;
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let cmsgs: Vec<ControlMessage<'_>> = if fds.is_empty() {
                Vec::new()
            } else {
                vec![ControlMessage::ScmRights(fds)]
            };
            Ok(sendmsg::<()>(
                stream.as_raw_fd(),
                &[io::IoSlice::new(&frame)],
                &cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )?)
        })
        .await?;
    // The fds went with the first byte; the rest is plain bytes.
    if let Some(rest) = frame.get(sent..) {
        stream.write_all(rest).await?;
    }
    Ok(())
}

/// Reads one frame's payload (the worker's acks carry no fds).
async fn read_frame(stream: &mut UnixStream) -> io::Result<Vec<u8>> {
    let mut header = [0u8; HEADER_BYTES];
    stream.read_exact(&mut header).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(io::ErrorKind::UnexpectedEof, "worker closed the fd channel")
        } else {
            e
        }
    })?;
    let mut payload = vec![0u8; fdframe::payload_len(header)?];
    stream.read_exact(&mut payload).await?;
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use strata_wire::check::test_buffer;
    use tokio::net::UnixListener;

    use super::*;

    /// A stand-in worker end: reads frames as plain bytes (the fds are
    /// dropped by the kernel) and answers each import with `ack`.
    async fn fake_worker(listener: UnixListener, ack: pb::FdAck) -> (pb::FdHello, pb::FdImport) {
        let (mut s, _) = listener.accept().await.unwrap();
        let hello = pb::FdHello::decode(read_frame(&mut s).await.unwrap().as_slice()).unwrap();
        let import = pb::FdImport::decode(read_frame(&mut s).await.unwrap().as_slice()).unwrap();
        write_frame(&mut s, &ack.encode_to_vec(), &[])
            .await
            .unwrap();
        (hello, import)
    }

    #[tokio::test]
    async fn an_import_sends_its_grants_and_reads_one_result_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.fd");
        let listener = UnixListener::bind(&path).unwrap();
        let grant = test_buffer(64);
        let ack = pb::FdAck {
            results: vec![pb::FdResult {
                identity: grant.identity().encode().to_vec(),
                ok: false,
                error: "not sealed".into(),
            }],
        };
        let worker = tokio::spawn(fake_worker(listener, ack));

        let mut ch = FdChannel::connect(&path, SessionId(7)).await.unwrap();
        assert_eq!(ch.peer_pid(), Some(std::process::id()));
        let file = tempfile::tempfile().unwrap();
        let results = ch.import_as(&[grant], &[file.as_fd()]).await.unwrap();
        assert_eq!(results, vec![Err("not sealed".to_owned())]);

        let (hello, import) = worker.await.unwrap();
        assert_eq!(
            (hello.protocol_version, hello.session_id),
            (PROTOCOL_VERSION, 7)
        );
        assert_eq!(import.identities, vec![grant.identity().encode().to_vec()]);
        assert_eq!(import.descriptors, vec![grant.encode().to_vec()]);
    }

    #[tokio::test]
    async fn a_cancelled_import_breaks_the_channel() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.fd");
        let listener = UnixListener::bind(&path).unwrap();
        // A worker that takes the frames in and never answers.
        let worker = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            drop(s);
        });
        let mut ch = FdChannel::connect(&path, SessionId(1)).await.unwrap();
        let id = *test_buffer(64).identity();
        let file = tempfile::tempfile().unwrap();
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            ch.import(&[id], &[file.as_fd()]),
        )
        .await;
        assert!(waited.is_err(), "no ack came, so the import cannot finish");
        let again = ch.import(&[id], &[file.as_fd()]).await.unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::BrokenPipe);
        worker.abort();
    }

    #[tokio::test]
    async fn too_many_fds_are_refused_before_anything_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.fd");
        let listener = UnixListener::bind(&path).unwrap();
        let _accept = tokio::spawn(async move { listener.accept().await.map(drop) });
        let mut ch = FdChannel::connect(&path, SessionId(1)).await.unwrap();
        let file = tempfile::tempfile().unwrap();
        let fds = vec![file.as_fd(); MAX_FDS_PER_MESSAGE + 1];
        let e = ch.import(&[], &fds).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(!ch.broken, "nothing was sent: the channel is still good");
    }
}
