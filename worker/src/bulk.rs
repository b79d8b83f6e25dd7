//! The server end of the data connections ([`strata_proto::bulk`]): a
//! second TCP port beside the gRPC one, for `Stage` and `Fetch` bodies
//! without HTTP/2 and protobuf in between. A stage's bytes are read from
//! the socket straight into the buffer that becomes the staged `Bytes`; a
//! fetch's held bytes are written from where the task left them straight
//! to the socket. Both go through the session's table
//! ([`strata_worker_node::staging::Held`]) exactly as the gRPC calls do: same ids, same
//! budget (counted from the moment a stage announces its length), same end
//! with the session.
//!
//! Everything that arrives is hostile until checked:
//! - a connection must present a valid hello within [`HELLO_TIMEOUT`],
//!   and at most [`MAX_UNAUTHENTICATED`] may be waiting to, over all
//!   clients (past that, new ones are closed at once);
//! - the hello names a live session and its secret (compared in constant
//!   time); an unknown session and a wrong secret get the same refusal, so
//!   the port tells nobody which sessions exist;
//! - a session has at most [`MAX_PER_SESSION`] data connections;
//! - every header is checked ([`Request::decode`]: lengths within
//!   [`strata_proto::MAX_INLINE_EXTENT`], ids nonzero) and admitted by the
//!   table before a byte is allocated; a malformed one ends that
//!   connection, and a stage cut short gives its bytes back (the table's
//!   `Staging` guard). Nothing here can end the session or the worker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use strata_proto::bulk::{HEADER_BYTES, HELLO_BYTES, Hello, RefusalCode, Reply, Request, refusal};
use strata_proto::recycle::Recycler;
use strata_worker_node::staging::HeldError;
use strata_worker_node::{Node, Session, SessionId};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, info, warn};

/// How long a new connection has to present its hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections accepted and not yet authenticated, over all clients.
pub(crate) const MAX_UNAUTHENTICATED: usize = 64;

/// Data connections one session may hold at once.
pub(crate) const MAX_PER_SESSION: usize = 4;

/// Accepts data connections until `shutdown` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    mut shutdown: watch::Receiver<bool>,
) {
    let waiting = Arc::new(Semaphore::new(MAX_UNAUTHENTICATED));
    let spares = Recycler::default();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "data connection: accept failed");
                    // A full fd table: wait instead of spinning on it.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let Ok(permit) = Arc::clone(&waiting).try_acquire_owned() else {
            warn!(%peer, "data connection closed: {MAX_UNAUTHENTICATED} others are waiting to authenticate");
            continue;
        };
        let node = Arc::clone(&node);
        let shutdown = shutdown.clone();
        let spares = spares.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            connection(stream, peer, node, permit, shutdown, spares).await;
        });
    }
}

/// Counts a session's data connections; the count drops with it.
struct Slot(Arc<Session>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.data_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Writes a refusal; the caller then closes the connection or goes on.
async fn refuse(stream: &mut TcpStream, code: RefusalCode, id: u64, why: &str) -> bool {
    stream.write_all(&refusal(code, id, why)).await.is_ok()
}

async fn connection(
    mut stream: TcpStream,
    peer: std::net::SocketAddr,
    node: Arc<Node>,
    permit: tokio::sync::OwnedSemaphorePermit,
    mut shutdown: watch::Receiver<bool>,
    spares: Recycler,
) {
    let mut raw = [0u8; HELLO_BYTES];
    match tokio::time::timeout(HELLO_TIMEOUT, stream.read_exact(&mut raw)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "data connection closed before its hello");
            return;
        }
        Err(_) => {
            warn!(%peer, "data connection closed: no hello within {HELLO_TIMEOUT:?}");
            let why = format!("no hello within {HELLO_TIMEOUT:?}");
            refuse(&mut stream, RefusalCode::Invalid, 0, &why).await;
            return;
        }
    }
    let hello = match Hello::decode(&raw) {
        Ok(h) => h,
        Err(e) => {
            warn!(%peer, error = %e, "data connection refused: malformed hello");
            refuse(&mut stream, RefusalCode::Invalid, 0, &e.to_string()).await;
            return;
        }
    };
    let id = SessionId(hello.session);
    let session = node
        .session(id)
        .filter(|s| bool::from(s.data_secret.ct_eq(&hello.secret)));
    let Some(session) = session else {
        warn!(%peer, session = %id, "data connection refused: unknown session or wrong secret");
        let why = format!("session {id} is unknown or has ended, or the secret is wrong");
        refuse(
            &mut stream,
            RefusalCode::Unauthenticated,
            hello.session,
            &why,
        )
        .await;
        return;
    };
    if session.data_connections.fetch_add(1, Ordering::SeqCst) >= MAX_PER_SESSION {
        session.data_connections.fetch_sub(1, Ordering::SeqCst);
        let why = format!("session {id} has {MAX_PER_SESSION} data connections already");
        refuse(&mut stream, RefusalCode::Exhausted, hello.session, &why).await;
        return;
    }
    let slot = Slot(Arc::clone(&session));
    drop(permit);
    if hello.hold_from > 0 {
        session.held.set_hold_from(hello.hold_from);
    }
    if stream
        .write_all(&Reply::Ok { id: hello.session }.encode())
        .await
        .is_err()
    {
        return;
    }
    debug!(%peer, session = %id, hold_from = hello.hold_from, "data connection open");
    let mut ended = session.ended();
    let why = tokio::select! {
        why = requests(&mut stream, &slot.0, &spares) => why,
        // The session's end (its task stream closed) or the worker's ends
        // the connection too, whatever it was doing: a stage cut short
        // gives its bytes back.
        _ = ended.wait_for(|e| *e) => "the session ended".to_owned(),
        _ = shutdown.changed() => "the worker is shutting down".to_owned(),
    };
    info!(%peer, session = %id, %why, "data connection closed");
}

/// Serves requests until the connection ends; returns why it did.
async fn requests(stream: &mut TcpStream, session: &Session, spares: &Recycler) -> String {
    let mut raw = [0u8; HEADER_BYTES];
    loop {
        if let Err(e) = stream.read_exact(&mut raw).await {
            return match e.kind() {
                std::io::ErrorKind::UnexpectedEof => "the client closed it".to_owned(),
                _ => format!("read: {e}"),
            };
        }
        let request = match Request::decode(&raw) {
            Ok(r) => r,
            Err(e) => {
                // Nothing after a bad header can be trusted to be in step.
                warn!(error = %e, "data connection: malformed request");
                refuse(stream, RefusalCode::Invalid, 0, &e.to_string()).await;
                return format!("malformed request: {e}");
            }
        };
        let r = match request {
            Request::Stage { id, len } => stage(stream, session, spares, id, len).await,
            Request::Fetch { id, max } => fetch(stream, session, id, max).await,
        };
        if let Err(why) = r {
            return why;
        }
    }
}

fn held_code(e: &HeldError) -> RefusalCode {
    match e {
        HeldError::Full { .. } => RefusalCode::Exhausted,
        HeldError::Closed => RefusalCode::NotFound,
        HeldError::BadId(_) => RefusalCode::Invalid,
    }
}

/// One stage: `len` (checked) bytes follow the header.
async fn stage(
    stream: &mut TcpStream,
    session: &Session,
    spares: &Recycler,
    id: u64,
    len: u64,
) -> Result<(), String> {
    let staging = match session.held.begin_stage(id, len) {
        Ok(s) => s,
        Err(e) => {
            // Refused before a byte was kept: the body is read and dropped
            // so that the connection stays in step for the next request.
            let mut body = (&mut *stream).take(len);
            let skipped = tokio::io::copy(&mut body, &mut tokio::io::sink())
                .await
                .map_err(|e| format!("read: {e}"))?;
            if skipped != len {
                return Err(format!("stage {id}: {skipped} of {len} bytes arrived"));
            }
            let why = format!("stage {id}: {e}");
            return if refuse(stream, held_code(&e), id, &why).await {
                Ok(())
            } else {
                Err("write: the client went away".into())
            };
        }
    };
    // `len` ≤ MAX_INLINE_EXTENT (checked by the header) and admitted by
    // the session's budget: only now is memory taken for it — a string
    // kept from an earlier stage when one is large enough, else a new one
    // — never zeroed (read_buf fills it straight from the socket, and only
    // what it filled is ever seen).
    let total = usize::try_from(len).map_err(|_| format!("stage {id}: {len} bytes"))?;
    let mut buf = spares.take(total);
    let mut body = (&mut *stream).take(len);
    while buf.len() < total {
        match body.read_buf(&mut buf).await {
            Ok(0) => {
                return Err(format!(
                    "stage {id}: {} of the announced {total} bytes arrived",
                    buf.len()
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(format!("stage {id}: read: {e}")),
        }
    }
    staging.finish(spares.wrap(buf));
    stream
        .write_all(&Reply::Ok { id }.encode())
        .await
        .map_err(|e| format!("write: {e}"))
}

/// One fetch: the held bytes go out once, straight from where the task
/// left them.
async fn fetch(stream: &mut TcpStream, session: &Session, id: u64, max: u64) -> Result<(), String> {
    let Some(bytes) = session.held.take_held(id) else {
        let why = format!("no held bytes {id} in this session (never held, or fetched already)");
        return if refuse(stream, RefusalCode::NotFound, id, &why).await {
            Ok(())
        } else {
            Err("write: the client went away".into())
        };
    };
    let len = bytes.len() as u64;
    if len > max {
        let why = format!("held bytes {id} are {len} bytes, more than the {max} asked for");
        return if refuse(stream, RefusalCode::Invalid, id, &why).await {
            Ok(())
        } else {
            Err("write: the client went away".into())
        };
    }
    stream
        .write_all(&Reply::Data { id, len }.encode())
        .await
        .map_err(|e| format!("write: {e}"))?;
    stream
        .write_all(&bytes)
        .await
        .map_err(|e| format!("fetch {id}: write: {e}"))
}
