//! The fd side channel's server end: buffer fds by SCM_RIGHTS over a Unix
//! socket. The client end is [`strata_client::FdChannel`] (re-exported
//! here as [`FdChannel`]); the framing both share is
//! [`strata_proto::fdframe`].
//!
//! Framing: each frame is a little-endian u32 length (at most
//! [`MAX_FD_FRAME_BYTES`]) and that many bytes of an encoded message. The
//! client opens with an `FdHello` naming its session; then each `FdImport`
//! frame carries, in the same `sendmsg`, exactly as many fds as it lists
//! identities, and is answered by an `FdAck` with one result per identity.
//! An `FdImport` may also list one descriptor per identity: what the buffer
//! is imported as, so that tasks may narrow that grant but never widen it
//! (docs/wire-format.md §3), whichever task uses the buffer first.
//!
//! Received fds are close-on-exec from the moment they arrive
//! (`MSG_CMSG_CLOEXEC`) and owned (`OwnedFd`) at once; fds beyond what a
//! frame declares are closed; a truncated control message (`MSG_CTRUNC`)
//! fails the frame. Each fd must be on tmpfs/shmem and sealed against
//! shrinking (`F_SEAL_SHRINK`), or its identity's result is a refusal that
//! says why; the session remembers the reason, so a task that names the
//! identity later fails with it. Closing the channel ends the session.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use prost::Message;
use strata_proto::fdframe::{self, HEADER_BYTES};
use strata_proto::{MAX_FD_FRAME_BYTES, MAX_FDS_PER_MESSAGE, PROTOCOL_VERSION, pb};
use strata_wire::{BufferDescriptor, CanonicalIdentity};
use strata_worker_node::{Node, SessionId};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tracing::{debug, info, warn};

pub use strata_client::FdChannel;

use crate::listen::peer_is_us;

/// One received frame and the fds that came with it.
struct Frame {
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// Reads one frame; `Ok(None)` on a clean end of stream between frames.
async fn read_frame(stream: &UnixStream) -> io::Result<Option<Frame>> {
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

/// Writes one frame without fds (the acks: only the client sends fds).
async fn write_frame(stream: &mut UnixStream, payload: &[u8]) -> io::Result<()> {
    stream.write_all(&fdframe::encode(payload)?).await
}

/// Accepts fd-channel connections until shutdown. `ring`: whether a
/// session may move its tasks onto a shared-memory ring.
pub(crate) async fn serve(
    listener: UnixListener,
    node: Arc<Node>,
    ring: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                warn!(error = %e, "fd channel accept failed");
                continue;
            }
        };
        if !peer_is_us(&stream) {
            continue;
        }
        let node = Arc::clone(&node);
        tokio::spawn(async move {
            if let Err(e) = handle(stream, &node, ring).await {
                warn!(error = %e, "fd channel connection failed");
            }
        });
    }
}

async fn handle(mut stream: UnixStream, node: &Arc<Node>, ring: bool) -> io::Result<()> {
    let Some(first) = read_frame(&stream).await? else {
        return Ok(());
    };
    let hello = pb::FdHello::decode(first.payload.as_slice())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("FdHello: {e}")))?;
    drop(first.fds);
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "fd channel protocol {} refused; this worker speaks {PROTOCOL_VERSION}",
                hello.protocol_version
            ),
        ));
    }
    let session = SessionId(hello.session_id);
    if !node.has_session(session) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown session {session}"),
        ));
    }
    info!(%session, "fd channel open");
    let result = import_loop(&mut stream, node, ring, session).await;
    // The orchestrator's side channel is gone: so is its session.
    node.end_session(session, "fd channel closed");
    result
}

async fn import_loop(
    stream: &mut UnixStream,
    node: &Arc<Node>,
    ring_offered: bool,
    session: SessionId,
) -> io::Result<()> {
    while let Some(frame) = read_frame(stream).await? {
        let ack = match pb::FdImport::decode(frame.payload.as_slice()) {
            Ok(pb::FdImport {
                ring: Some(ring),
                identities,
                ..
            }) => {
                let outcome = if identities.is_empty() {
                    crate::ring::attach(node, ring_offered, session, &ring, frame.fds).await
                } else {
                    Err("a ring frame carries no buffer identities".into())
                };
                if let Err(why) = &outcome {
                    warn!(%session, %why, "ring refused");
                }
                pb::FdAck {
                    results: vec![pb::FdResult {
                        identity: vec![],
                        ok: outcome.is_ok(),
                        error: outcome.err().unwrap_or_default(),
                    }],
                }
            }
            Ok(import) => import_all(node, session, import, frame.fds),
            Err(e) => pb::FdAck {
                results: vec![pb::FdResult {
                    identity: vec![],
                    ok: false,
                    error: format!("FdImport: {e}"),
                }],
            },
        };
        write_frame(stream, &ack.encode_to_vec()).await?;
    }
    Ok(())
}

fn import_all(
    node: &Node,
    session: SessionId,
    import: pb::FdImport,
    fds: Vec<OwnedFd>,
) -> pb::FdAck {
    let declared = import.identities.len();
    if fds.len() > declared {
        debug!(
            extra = fds.len() - declared,
            "closing fds beyond those declared"
        );
    }
    let mut fds = fds.into_iter();
    let with_grants = !import.descriptors.is_empty();
    let mut grants = import.descriptors.into_iter();
    let results = import
        .identities
        .into_iter()
        .map(|raw| {
            let fd = fds.next();
            let grant = grants.next();
            let outcome = match (CanonicalIdentity::decode(&raw), fd) {
                (Err(e), _) => Err(format!("identity: {e}")),
                (Ok(_), None) => Err(format!(
                    "no fd arrived for this identity ({declared} declared)"
                )),
                (Ok(id), Some(fd)) => import_grant(id, with_grants, grant.as_deref())
                    .and_then(|grant| node.import_one(session, id, grant, fd)),
            };
            match outcome {
                Ok(()) => pb::FdResult {
                    identity: raw,
                    ok: true,
                    error: String::new(),
                },
                Err(error) => pb::FdResult {
                    identity: raw,
                    ok: false,
                    error,
                },
            }
        })
        .collect();
    // Any fds left over are dropped (closed) here.
    drop(fds);
    pb::FdAck { results }
}

/// The descriptor `id` is imported as: `None` when the frame lists no
/// descriptors at all; an error when it lists some but not a valid one for
/// this identity.
fn import_grant(
    id: CanonicalIdentity,
    with_grants: bool,
    raw: Option<&[u8]>,
) -> Result<Option<BufferDescriptor>, String> {
    if !with_grants {
        return Ok(None);
    }
    let raw =
        raw.ok_or_else(|| "the FdImport lists descriptors but none for this identity".to_owned())?;
    let grant = BufferDescriptor::decode(raw).map_err(|e| format!("descriptor: {e}"))?;
    if grant.identity() != &id {
        return Err(format!(
            "the descriptor is of buffer {}, not {id}",
            grant.identity()
        ));
    }
    Ok(Some(grant))
}
