//! The fd side channel's server end: buffer fds by SCM_RIGHTS over a Unix
//! socket. The client end is [`strata_client::FdChannel`] (re-exported
//! here as [`FdChannel`]); the framing both share is
//! [`strata_proto::fdframe`].
//!
//! Framing: each frame is a little-endian u32 length (at most
//! [`MAX_FD_FRAME_BYTES`](strata_proto::MAX_FD_FRAME_BYTES)) and that many bytes of an encoded message. The
//! client opens with an `FdHello` naming its session; then each `FdImport`
//! frame carries, in the same `sendmsg`, exactly as many fds as it lists
//! identities, and is answered by an `FdAck` with one result per identity.
//! An `FdImport` may also list one descriptor per identity: what the buffer
//! is imported as, so that tasks may narrow that grant but never widen it
//! (docs/wire-format.md §3), whichever task uses the buffer first.
//!
//! An `FdImport` that names a shared device buffer to export instead is
//! answered by an `FdAck` carrying that buffer's one fd (`export_one`):
//! device memory leaves the worker only this way.
//!
//! Received fds are close-on-exec from the moment they arrive
//! (`MSG_CMSG_CLOEXEC`) and owned (`OwnedFd`) at once; fds beyond what a
//! frame declares are closed; a truncated control message (`MSG_CTRUNC`)
//! fails the frame. Each fd must be on tmpfs/shmem and sealed against
//! shrinking (`F_SEAL_SHRINK`), or its identity's result is a refusal that
//! says why; the session remembers the reason, so a task that names the
//! identity later fails with it. Closing the channel ends the session.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use prost::Message;
use strata_proto::fdframe;
use strata_proto::{PROTOCOL_VERSION, pb};
use strata_wire::{BufferDescriptor, CanonicalIdentity};
use strata_worker_node::{Node, SessionId};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use strata_chip_runtime::shared::{Place, SharedMemory};
pub use strata_client::FdChannel;
use strata_client::{read_fd_frame, write_fd_frame};

use crate::listen::peer_is_us;

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
    let Some(first) = read_fd_frame(&stream).await? else {
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
    while let Some(frame) = read_fd_frame(stream).await? {
        if let Ok(pb::FdImport { export, .. }) = pb::FdImport::decode(frame.payload.as_slice())
            && !export.is_empty()
        {
            drop(frame.fds);
            export_one(stream, node, session, &export).await?;
            continue;
        }
        let ack = match pb::FdImport::decode(frame.payload.as_slice()) {
            Ok(pb::FdImport {
                shared: Some(shared),
                identities,
                ring: None,
                ..
            }) if identities.is_empty() => import_shared(node, session, shared, frame.fds),
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
                    ..Default::default()
                }
            }
            Ok(import) => import_all(node, session, import, frame.fds),
            Err(e) => pb::FdAck {
                results: vec![pb::FdResult {
                    identity: vec![],
                    ok: false,
                    error: format!("FdImport: {e}"),
                }],
                ..Default::default()
            },
        };
        write_frame(stream, &ack.encode_to_vec()).await?;
    }
    Ok(())
}

/// Answers an export: the shared device buffer's fd on the ack frame, or
/// why not (and no fd).
async fn export_one(
    stream: &mut UnixStream,
    node: &Node,
    session: SessionId,
    raw: &[u8],
) -> io::Result<()> {
    let outcome = CanonicalIdentity::decode(raw)
        .map_err(|e| format!("export: identity: {e}"))
        .and_then(|id| node.export_one(session, &id));
    let (ack, fd) = match outcome {
        Ok(shared) => (
            pb::FdAck {
                results: vec![pb::FdResult {
                    identity: raw.to_vec(),
                    ok: true,
                    error: String::new(),
                }],
                export_len: shared.len,
                export_place: shared.place.tag(),
            },
            Some(shared.fd),
        ),
        Err(error) => (
            pb::FdAck {
                results: vec![pb::FdResult {
                    identity: raw.to_vec(),
                    ok: false,
                    error,
                }],
                ..Default::default()
            },
            None,
        ),
    };
    let raw_fds: Vec<RawFd> = fd.iter().map(AsRawFd::as_raw_fd).collect();
    // Our copy of the fd is closed once it is sent (the client has its own).
    write_fd_frame(stream, &ack.encode_to_vec(), &raw_fds).await
}

/// Maps another worker's shared device buffer, the frame's one fd, for
/// the session's tasks: one result, saying whether it was.
fn import_shared(
    node: &Node,
    session: SessionId,
    shared: pb::FdShared,
    fds: Vec<OwnedFd>,
) -> pb::FdAck {
    let mut fds = fds.into_iter();
    let outcome = match (fds.next(), fds.next()) {
        (Some(fd), None) => CanonicalIdentity::decode(&shared.identity)
            .map_err(|e| format!("shared import: identity: {e}"))
            .and_then(|id| {
                let place = Place::from_tag(&shared.place).ok_or_else(|| {
                    format!(
                        "shared import: place {:?} is neither \"host\" nor \"cuda:N\"",
                        shared.place
                    )
                })?;
                node.import_shared_one(
                    session,
                    id,
                    SharedMemory {
                        fd,
                        len: shared.len,
                        place,
                    },
                )
            }),
        (None, _) => Err("shared import: no fd arrived".to_owned()),
        (Some(_), Some(_)) => Err("shared import: more than one fd arrived".to_owned()),
    };
    pb::FdAck {
        results: vec![pb::FdResult {
            identity: shared.identity,
            ok: outcome.is_ok(),
            error: outcome.err().unwrap_or_default(),
        }],
        ..Default::default()
    }
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
    pb::FdAck {
        results,
        ..Default::default()
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use strata_chip_runtime::{Device, Region, Registry, SimDevice};
    use strata_worker_node::{Limits, Node};

    use super::*;

    fn new_node() -> (Arc<Node>, SessionId, Arc<SimDevice>) {
        let device = Arc::new(SimDevice::from_spec("sim:mem=1MiB").unwrap());
        let node = Arc::new(Node::new(
            0,
            Arc::clone(&device) as Arc<dyn strata_chip_runtime::Device>,
            Registry::with_builtins(),
            Limits::default(),
        ));
        let id = node.open_session(node.capabilities);
        (node, id, device)
    }

    fn frame(identity: &CanonicalIdentity, len: u64, place: &str) -> pb::FdShared {
        pb::FdShared {
            identity: identity.encode().to_vec(),
            len,
            place: place.into(),
        }
    }

    fn refusal(ack: &pb::FdAck) -> &str {
        let [r] = ack.results.as_slice() else {
            panic!("{} results", ack.results.len())
        };
        assert!(!r.ok);
        &r.error
    }

    /// A shared import is hostile until checked: no fd, two fds, a place
    /// that names nothing, memory the chip cannot map and an identity the
    /// session holds are each refused, naming why; a good one is mapped
    /// and is the exporter's memory.
    #[test]
    fn a_shared_import_is_checked_before_it_is_mapped() {
        let (node, session, _) = new_node();
        let (owner, _, exporter) = new_node();
        let id = CanonicalIdentity::new(*b"fdchtest", 1, 1).unwrap();
        let block = exporter.alloc(Region::Shared, 4096).unwrap();
        exporter.copy_to_device(&block, 0, &[5u8; 16]).unwrap();
        let fd = || exporter.export(&block).unwrap().fd;
        drop(owner);

        let ack = import_shared(&node, session, frame(&id, 4096, "host"), vec![]);
        assert!(refusal(&ack).contains("no fd"), "{ack:?}");
        let ack = import_shared(&node, session, frame(&id, 4096, "host"), vec![fd(), fd()]);
        assert!(refusal(&ack).contains("more than one fd"), "{ack:?}");
        let ack = import_shared(&node, session, frame(&id, 4096, "mars"), vec![fd()]);
        assert!(refusal(&ack).contains("\"mars\""), "{ack:?}");
        let ack = import_shared(&node, session, frame(&id, 4096, "cuda:0"), vec![fd()]);
        assert!(
            refusal(&ack).contains("maps host memory, not memory of GPU 0"),
            "{ack:?}"
        );
        let ack = import_shared(&node, session, frame(&id, 1 << 20, "host"), vec![fd()]);
        assert!(refusal(&ack).contains("fewer than"), "{ack:?}");
        let bad = pb::FdShared {
            identity: vec![1, 2, 3],
            ..frame(&id, 4096, "host")
        };
        let ack = import_shared(&node, session, bad, vec![fd()]);
        assert!(refusal(&ack).contains("identity"), "{ack:?}");

        let ack = import_shared(&node, session, frame(&id, 4096, "host"), vec![fd()]);
        assert!(ack.results[0].ok, "{ack:?}");
        let ack = import_shared(&node, session, frame(&id, 4096, "host"), vec![fd()]);
        assert!(refusal(&ack).contains("already"), "{ack:?}");
    }
}
