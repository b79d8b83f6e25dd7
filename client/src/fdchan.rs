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
//! 4. an `FdImport` naming a shared device buffer to export instead is
//!    answered by an `FdAck` that carries the buffer's one fd (device
//!    memory leaves a worker only this way, [`FdChannel::export`]);
//! 5. closing the channel ends the session on the worker.
//!
//! Import acks are read with a plain `read`, which takes no fds in: any
//! the worker attached would be discarded by the kernel, never installed
//! in this process. An export's ack is read with `recvmsg`, its fd owned
//! at once ([`read_fd_frame`], which the worker's end uses too).

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use prost::Message;
use strata_boundary::SessionId;
use strata_proto::fdframe::{self, HEADER_BYTES};
use strata_proto::{MAX_FD_FRAME_BYTES, MAX_FDS_PER_MESSAGE, PROTOCOL_VERSION, pb};
use strata_wire::{BufferDescriptor, CanonicalIdentity};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tracing::debug;

/// A shared device buffer's fd as an export brought it
/// ([`FdChannel::export`]): unchecked, as any fd from another process.
#[derive(Debug)]
pub struct Exported {
    /// The fd, owned.
    pub fd: OwnedFd,
    /// Bytes of the allocation, as the worker says.
    pub len: u64,
    /// Where it lives, as the worker names it (`host`, `cuda:N`).
    pub place: String,
}

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
            export: Vec::new(),
            shared: None,
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
            export: Vec::new(),
            shared: None,
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
            export: Vec::new(),
            shared: None,
        };
        self.exchange(&msg, fds).await
    }

    /// Asks for a file descriptor of the session's shared device buffer
    /// `identity` (device memory of its own, region SHARED). `Ok(Ok(_))`:
    /// the fd, the allocation's length and its place as the worker names
    /// it (`host`, `cuda:N`); `Ok(Err(why))`: the worker refused (no such
    /// buffer, not a shared one, a chip that cannot share).
    ///
    /// # Errors
    /// As [`FdChannel::import`]; an ack that claims an export with other
    /// than one fd.
    ///
    /// # Cancel safety
    /// As [`FdChannel::import_as`]: a dropped export may leave its fd
    /// unread, and the channel is then broken.
    pub async fn export(
        &mut self,
        identity: &CanonicalIdentity,
    ) -> io::Result<Result<Exported, String>> {
        if self.broken {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "an earlier exchange on this fd channel failed or was cancelled",
            ));
        }
        let msg = pb::FdImport {
            identities: Vec::new(),
            descriptors: Vec::new(),
            ring: None,
            export: identity.encode().to_vec(),
            shared: None,
        };
        self.broken = true;
        write_frame(&mut self.stream, &msg.encode_to_vec(), &[]).await?;
        let frame = read_fd_frame(&self.stream).await?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "worker closed the fd channel")
        })?;
        self.broken = false;
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let ack =
            pb::FdAck::decode(frame.payload.as_slice()).map_err(|e| bad(format!("FdAck: {e}")))?;
        let mut fds = frame.fds;
        let [result] = ack.results.as_slice() else {
            return Err(bad(format!(
                "an export's ack has {} results, not one",
                ack.results.len()
            )));
        };
        if !result.ok {
            // Whatever fds came are closed here.
            return Ok(Err(result.error.clone()));
        }
        match (fds.pop(), fds.is_empty()) {
            (Some(fd), true) => Ok(Ok(Exported {
                fd,
                len: ack.export_len,
                place: ack.export_place,
            })),
            _ => Err(bad(format!(
                "an export's ack came with {} fds, not one",
                fds.len() + 1
            ))),
        }
    }

    /// Sends another worker's shared device buffer `identity` — its
    /// export's `fd`, `len` and `place` (`host`, `cuda:N`) — for this
    /// session's tasks to use in place, as a device buffer of this worker
    /// until freed. `Ok(Err(why))`: the worker refused (memory its chip
    /// cannot map, an identity it already holds).
    ///
    /// # Errors
    /// As [`FdChannel::import`]; an ack with other than one result.
    ///
    /// # Cancel safety
    /// As [`FdChannel::import_as`].
    pub async fn import_shared(
        &mut self,
        identity: &CanonicalIdentity,
        len: u64,
        place: &str,
        fd: BorrowedFd<'_>,
    ) -> io::Result<Result<(), String>> {
        let msg = pb::FdImport {
            shared: Some(pb::FdShared {
                identity: identity.encode().to_vec(),
                len,
                place: place.to_owned(),
            }),
            ..Default::default()
        };
        let mut results = self.exchange(&msg, &[fd]).await?;
        match (results.pop(), results.is_empty()) {
            (Some(r), true) => Ok(r),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a shared import's ack has other than one result",
            )),
        }
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

/// One received frame and the fds that came with it.
#[derive(Debug)]
pub struct Frame {
    /// The encoded message.
    pub payload: Vec<u8>,
    /// The fds that came with it, owned (close-on-exec).
    pub fds: Vec<OwnedFd>,
}

/// Reads one frame and the fds that came with it (close-on-exec, owned at
/// once); `Ok(None)` on a clean end of stream between frames.
///
/// # Errors
/// A truncated control message (more fds than one frame may carry), a
/// frame longer than the limit, a stream closed inside a frame.
pub async fn read_fd_frame(stream: &UnixStream) -> io::Result<Option<Frame>> {
    let mut buf: Vec<u8> = Vec::with_capacity(256);
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut want = HEADER_BYTES;
    while buf.len() < want {
        let mut chunk = vec![0u8; (want - buf.len()).min(MAX_FD_FRAME_BYTES)];
        let (n, received, truncated) = stream
            .async_io(Interest::READABLE, || {
                recv_with_fds(stream.as_raw_fd(), &mut chunk)
            })
            .await?;
        // Own every received fd before looking at anything else, so that
        // each one is closed on every path out of here.
        fds.extend(received);
        if truncated {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "control message truncated: too many fds in one frame",
            ));
        }
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a frame",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        if want == HEADER_BYTES && buf.len() >= HEADER_BYTES {
            want = HEADER_BYTES + fdframe::payload_len([buf[0], buf[1], buf[2], buf[3]])?;
        }
    }
    Ok(Some(Frame {
        payload: buf.split_off(HEADER_BYTES),
        fds,
    }))
}

/// One `recvmsg` with room for [`MAX_FDS_PER_MESSAGE`] fds, close-on-exec.
fn recv_with_fds(fd: RawFd, chunk: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>, bool)> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS_PER_MESSAGE]);
    let mut iov = [IoSliceMut::new(chunk)];
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut owned = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for r in raw {
                // SAFETY: the kernel just installed this fd in our table for
                // us; nothing else refers to it, so we take sole ownership.
                #[allow(unsafe_code)]
                owned.push(unsafe { OwnedFd::from_raw_fd(r) });
            }
        }
    }
    Ok((msg.bytes, owned, msg.flags.contains(MsgFlags::MSG_CTRUNC)))
}

/// Writes one frame, with `fds` attached to its first byte.
///
/// # Errors
/// A payload over the frame limit; the socket's errors.
pub async fn write_fd_frame(
    stream: &mut UnixStream,
    payload: &[u8],
    fds: &[RawFd],
) -> io::Result<()> {
    write_frame(stream, payload, fds).await
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
            ..Default::default()
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

    /// A stand-in worker end answering each export with `ack` and `fds`
    /// files attached.
    async fn exporting_worker(listener: UnixListener, answers: Vec<(pb::FdAck, usize)>) {
        let (mut s, _) = listener.accept().await.unwrap();
        read_frame(&mut s).await.unwrap();
        for (ack, fds) in answers {
            let import =
                pb::FdImport::decode(read_frame(&mut s).await.unwrap().as_slice()).unwrap();
            assert_eq!(import.export.len(), 32);
            let files: Vec<std::fs::File> =
                (0..fds).map(|_| tempfile::tempfile().unwrap()).collect();
            let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
            write_frame(&mut s, &ack.encode_to_vec(), &raw)
                .await
                .unwrap();
        }
    }

    fn export_ack(ok: bool) -> pb::FdAck {
        pb::FdAck {
            results: vec![pb::FdResult {
                identity: vec![],
                ok,
                error: if ok {
                    String::new()
                } else {
                    "not a shared buffer".into()
                },
            }],
            export_len: 4096,
            export_place: "host".into(),
        }
    }

    /// An export brings one fd, owned; a refusal brings its reason; an
    /// ack that claims an export with two fds is refused (both closed).
    #[tokio::test]
    async fn an_export_brings_one_fd_or_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.fd");
        let listener = UnixListener::bind(&path).unwrap();
        let worker = tokio::spawn(exporting_worker(
            listener,
            vec![
                (export_ack(true), 1),
                (export_ack(false), 0),
                (export_ack(true), 2),
            ],
        ));
        let mut ch = FdChannel::connect(&path, SessionId(3)).await.unwrap();
        let id = *test_buffer(64).identity();
        let got = ch.export(&id).await.unwrap().unwrap();
        assert_eq!((got.len, got.place.as_str()), (4096, "host"));
        assert!(nix::fcntl::fcntl(&got.fd, nix::fcntl::FcntlArg::F_GETFD).unwrap() & 1 == 1);
        assert_eq!(
            ch.export(&id).await.unwrap().unwrap_err(),
            "not a shared buffer"
        );
        let e = ch.export(&id).await.unwrap_err();
        assert!(e.to_string().contains("2 fds, not one"), "{e}");
        worker.await.unwrap();
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
