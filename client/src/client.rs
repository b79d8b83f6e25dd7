//! A connection to one worker: the unary calls, and the doors to the
//! session's streams and fd channel.
//!
//! Cancel safety of the unary calls, in common: dropping one before it
//! completes resets its HTTP/2 stream. The request may or may not have
//! reached the worker and taken effect there, and its reply is lost; the
//! [`WorkerClient`] itself stays usable (its channel is shared and
//! unaffected). Each call's `# Cancel safety` says what "taken effect"
//! means for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper_util::rt::TokioIo;
use strata_boundary::SessionId;
use strata_proto::convert::{self, RunEnd, SessionState, WorkerStats};
use strata_proto::{
    CONNECTION_WINDOW, DEFAULT_MAX_MESSAGE_BYTES, PROTOCOL_VERSION, SESSION_HEADER, STREAM_WINDOW,
    pb,
};
use strata_wire::{CanonicalIdentity, Region};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Uri};
use tonic::{Request, Status};
use tracing::debug;

use crate::error::error_chain;
use crate::{ClientError, Endpoint, FdChannel, Handshake, HealthWatch, TaskStream};

/// Adds the bearer token and the session id to every call.
#[derive(Clone, Debug)]
pub struct ClientMeta {
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
    session: Arc<AtomicU64>,
}

impl tonic::service::Interceptor for ClientMeta {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(t) = &self.token {
            req.metadata_mut().insert("authorization", t.clone());
        }
        let s = self.session.load(Ordering::Relaxed);
        if s != 0 {
            let v = MetadataValue::try_from(s.to_string())
                .map_err(|_| Status::internal("session id"))?;
            req.metadata_mut().insert(SESSION_HEADER, v);
        }
        Ok(req)
    }
}

type Stub = pb::worker_client::WorkerClient<InterceptedService<Channel, ClientMeta>>;

/// TLS settings of a client: the CA that signed the worker's certificate,
/// the client's own certificate and key (PEM), and the name the worker's
/// certificate is for.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// CA certificate (PEM) the worker's certificate chains to.
    pub ca_pem: Vec<u8>,
    /// The client's certificate chain (PEM).
    pub cert_pem: Vec<u8>,
    /// The client's private key (PEM).
    pub key_pem: Vec<u8>,
    /// The DNS name in the worker's certificate.
    pub domain: String,
}

/// A connection to one worker.
#[derive(Debug, Clone)]
pub struct WorkerClient {
    stub: Stub,
    session: Arc<AtomicU64>,
    handshake: Option<Handshake>,
    endpoint: Endpoint,
}

impl WorkerClient {
    /// Connects to `endpoint`, sending `token` on every call if given.
    ///
    /// # Errors
    /// [`ClientError::Connect`].
    ///
    /// # Cancel safety
    /// As [`WorkerClient::connect_with`].
    pub async fn connect(endpoint: &Endpoint, token: Option<&str>) -> Result<Self, ClientError> {
        Self::connect_with(endpoint, token, None).await
    }

    /// Connects to `endpoint` with a token and, for TCP, TLS with a client
    /// certificate.
    ///
    /// # Errors
    /// [`ClientError::Connect`], including a TLS handshake the worker
    /// refuses.
    ///
    /// # Cancel safety
    /// Cancel safe: no call has been made yet, so dropping it closes the
    /// half-made connection and leaves nothing behind on the worker.
    pub async fn connect_with(
        endpoint: &Endpoint,
        token: Option<&str>,
        tls: Option<&ClientTls>,
    ) -> Result<Self, ClientError> {
        let fail = |reason: String| ClientError::Connect {
            endpoint: endpoint.to_string(),
            reason,
        };
        let channel = match endpoint {
            Endpoint::Unix(path) => {
                let path = path.clone();
                tonic::transport::Endpoint::try_from("http://strata-worker.invalid")
                    .map_err(|e| fail(e.to_string()))?
                    .initial_stream_window_size(STREAM_WINDOW)
                    .initial_connection_window_size(CONNECTION_WINDOW)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                        }
                    }))
                    .await
                    .map_err(|e| fail(error_chain(&e)))?
            }
            Endpoint::Tcp(addr) => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                let mut ep = tonic::transport::Endpoint::try_from(format!("{scheme}://{addr}"))
                    .map_err(|e| fail(e.to_string()))?
                    .tcp_nodelay(true)
                    .initial_stream_window_size(STREAM_WINDOW)
                    .initial_connection_window_size(CONNECTION_WINDOW);
                if let Some(t) = tls {
                    let cfg = tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(&t.ca_pem))
                        .identity(tonic::transport::Identity::from_pem(
                            &t.cert_pem,
                            &t.key_pem,
                        ))
                        .domain_name(t.domain.clone());
                    ep = ep.tls_config(cfg).map_err(|e| fail(error_chain(&e)))?;
                }
                ep.connect().await.map_err(|e| fail(error_chain(&e)))?
            }
        };
        let token = match token {
            Some(t) => Some(
                MetadataValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| fail("the token is not printable ASCII".into()))?,
            ),
            None => None,
        };
        let session = Arc::new(AtomicU64::new(0));
        let stub = pb::worker_client::WorkerClient::with_interceptor(
            channel,
            ClientMeta {
                token,
                session: Arc::clone(&session),
            },
        )
        .max_decoding_message_size(DEFAULT_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(DEFAULT_MAX_MESSAGE_BYTES);
        debug!(%endpoint, tls = tls.is_some(), "connected to worker");
        Ok(WorkerClient {
            stub,
            session,
            handshake: None,
            endpoint: endpoint.clone(),
        })
    }

    /// Opens a session, speaking this build's protocol version.
    ///
    /// # Errors
    /// The worker's refusal, or a malformed reply.
    ///
    /// # Cancel safety
    /// Dropped before it completes, the worker may have opened a session
    /// this client never learns of: the client keeps its previous session
    /// (or none) and may handshake again; the orphan, which opens no task
    /// stream, is ended by the worker after its grace period.
    pub async fn handshake(&mut self) -> Result<Handshake, ClientError> {
        self.handshake_with_version(PROTOCOL_VERSION).await
    }

    /// Opens a session claiming protocol `version` (tests use it to check
    /// that a mismatch is refused).
    ///
    /// # Errors
    /// As [`WorkerClient::handshake`].
    ///
    /// # Cancel safety
    /// As [`WorkerClient::handshake`].
    pub async fn handshake_with_version(&mut self, version: u32) -> Result<Handshake, ClientError> {
        self.open_session(version, None).await
    }

    /// Opens a session after losing `previous` (a session this client held
    /// on this worker address): the worker ends `previous` if it is still
    /// live, so none of its tasks that have not started will start, and
    /// reports it in [`Handshake::previous`]. `None` is a plain handshake.
    ///
    /// Only a report that is known, ended and has nothing running
    /// ([`SessionState::is_fenced`]) proves that the old session can no
    /// longer write; while tasks still run, poll
    /// [`WorkerClient::session_state`]. Compare the handshake's
    /// `worker.instance` with the old one to learn whether the same
    /// process answered.
    ///
    /// # Errors
    /// As [`WorkerClient::handshake`]; a worker that does not report the
    /// previous session is a malformed reply.
    ///
    /// # Cancel safety
    /// As [`WorkerClient::handshake`]; in addition the worker may already
    /// have ended `previous`. Calling again with the same `previous` is
    /// safe: ending a session twice is a no-op, and the report is the same.
    pub async fn handshake_after(
        &mut self,
        previous: Option<SessionId>,
    ) -> Result<Handshake, ClientError> {
        self.open_session(PROTOCOL_VERSION, previous).await
    }

    async fn open_session(
        &mut self,
        version: u32,
        previous: Option<SessionId>,
    ) -> Result<Handshake, ClientError> {
        let mut reply = self
            .stub
            .handshake(pb::HandshakeRequest {
                protocol_version: version,
                client_name: "strata".into(),
                previous_session: previous.map_or(0, |s| s.0),
            })
            .await?
            .into_inner();
        let hs = Handshake {
            session: SessionId(reply.session_id),
            worker: convert::worker_facts(&mut reply)?,
            fd_socket: (!reply.fd_socket.is_empty())
                .then(|| std::path::PathBuf::from(reply.fd_socket)),
            max_message_bytes: reply.max_message_bytes,
            data: convert::data_offer(reply.data_port, &reply.data_secret)?,
            previous: convert::previous_session(previous.is_some(), reply.previous)?,
        };
        self.session.store(hs.session.0, Ordering::Relaxed);
        debug!(
            endpoint = %self.endpoint,
            session = %hs.session,
            instance = %hs.worker.instance,
            callables = hs.worker.callables.len(),
            fd_channel = hs.fd_socket.is_some(),
            "session open"
        );
        self.handshake = Some(hs.clone());
        Ok(hs)
    }

    /// The handshake's result, once made.
    pub fn handshake_info(&self) -> Option<&Handshake> {
        self.handshake.as_ref()
    }

    /// Connects the fd side channel of this session.
    ///
    /// # Errors
    /// Before a handshake, for a TCP worker, or when the socket fails.
    ///
    /// # Cancel safety
    /// Not cancel safe for the session: dropped after the channel's hello
    /// reached the worker, the worker sees its side channel close and ends
    /// the session. Handshake again before retrying.
    pub async fn fd_channel(&self) -> Result<FdChannel, ClientError> {
        let hs = self
            .handshake
            .as_ref()
            .ok_or_else(|| ClientError::Protocol("handshake first".into()))?;
        let path = hs.fd_socket.as_ref().ok_or_else(|| {
            ClientError::Protocol(format!("{} has no fd channel (TCP worker)", self.endpoint))
        })?;
        Ok(FdChannel::connect(path, hs.session).await?)
    }

    /// Opens the session's task stream.
    ///
    /// # Errors
    /// The worker's refusal (no session, a stream already open).
    ///
    /// # Cancel safety
    /// Not cancel safe for the session: dropped before it completes, the
    /// worker may have opened the stream and then seen its sending half
    /// close, which ends the session; a second call may also be refused as
    /// a stream already open. Handshake again before retrying.
    pub async fn open_tasks(&mut self) -> Result<TaskStream, ClientError> {
        let (tx, rx) = mpsc::channel::<pb::TaskBatch>(64);
        let completions = self
            .stub
            .tasks(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(TaskStream {
            tx: Some(tx),
            completions,
        })
    }

    /// Allocates a device buffer for `identity`; returns its device address.
    ///
    /// # Errors
    /// The worker's refusal (out of memory names the region).
    ///
    /// # Cancel safety
    /// As the unary calls (module docs): the buffer may have been
    /// allocated with its address lost; a second allocation of the same
    /// identity is then refused as already allocated, and
    /// [`WorkerClient::device_free`] (or the end of the session) frees it.
    pub async fn device_alloc(
        &mut self,
        identity: &CanonicalIdentity,
        nbytes: u64,
        region: Region,
    ) -> Result<u64, ClientError> {
        let req = pb::DeviceAllocRequest {
            identity: identity.encode().to_vec(),
            nbytes,
            region: convert::region_code(region),
        };
        Ok(self.stub.device_alloc(req).await?.into_inner().addr)
    }

    /// Frees a device buffer.
    ///
    /// # Errors
    /// The worker's refusal.
    ///
    /// # Cancel safety
    /// As the unary calls (module docs): the buffer may or may not be
    /// free; calling again either frees it or is refused as not allocated.
    pub async fn device_free(&mut self, identity: &CanonicalIdentity) -> Result<(), ClientError> {
        self.stub
            .device_free(pb::DeviceFreeRequest {
                identity: identity.encode().to_vec(),
            })
            .await?;
        Ok(())
    }

    /// Ends the session's run: its run-region buffers are retired (later
    /// use is refused, naming the run), and the worker resets its run
    /// region once no session or running task holds run buffers.
    ///
    /// # Errors
    /// The worker's refusal, or a reply that breaks the protocol.
    ///
    /// # Cancel safety
    /// As the unary calls (module docs): the run may have ended with its
    /// [`RunEnd`] report lost.
    pub async fn end_run(&mut self) -> Result<RunEnd, ClientError> {
        Ok(RunEnd::try_from(
            self.stub.end_run(pb::EndRunRequest {}).await?.into_inner(),
        )?)
    }

    /// Has the worker write this session's dirty cached copies of
    /// `identities` and of the byte sets of `views` (everything when both
    /// are empty) back to host memory; returns the bytes written.
    ///
    /// # Errors
    /// The worker's refusal; views that do not make a valid argument
    /// list.
    ///
    /// # Cancel safety
    /// As the unary calls (module docs): the copies may or may not have
    /// been written back; flushing again is harmless.
    pub async fn flush(
        &mut self,
        identities: &[CanonicalIdentity],
        views: &[strata_wire::Tensor],
    ) -> Result<u64, ClientError> {
        let views = if views.is_empty() {
            Vec::new()
        } else {
            strata_wire::TaskArgs::new(views.to_vec(), Vec::new())
                .map_err(|e| ClientError::Protocol(format!("views to flush: {e}")))?
                .encode()
        };
        let req = pb::FlushRequest {
            identities: identities.iter().map(|i| i.encode().to_vec()).collect(),
            views,
        };
        self.flush_request(req).await
    }

    /// One `Flush` call with `req` exactly as given: what
    /// [`WorkerClient::flush`] sends (for tests of the worker's checks).
    ///
    /// # Errors
    /// The worker's refusal.
    pub async fn flush_request(&mut self, req: pb::FlushRequest) -> Result<u64, ClientError> {
        Ok(self.stub.flush(req).await?.into_inner().bytes)
    }

    /// Writes `data` at `offset` of a device buffer.
    ///
    /// # Errors
    /// The worker's refusal.
    ///
    /// # Cancel safety
    /// As the unary calls (module docs): the bytes may or may not have
    /// been written; writing them again is harmless.
    pub async fn copy_to_device(
        &mut self,
        identity: &CanonicalIdentity,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<(), ClientError> {
        let req = pb::CopyToDeviceRequest {
            identity: identity.encode().to_vec(),
            offset,
            data: data.into(),
        };
        self.stub.copy_to_device(req).await?;
        Ok(())
    }

    /// Reads `len` bytes at `offset` of a device buffer.
    ///
    /// # Errors
    /// The worker's refusal.
    ///
    /// # Cancel safety
    /// Cancel safe: reading changes nothing on the worker; a dropped call
    /// only loses the bytes, which may be read again.
    pub async fn copy_from_device(
        &mut self,
        identity: &CanonicalIdentity,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ClientError> {
        let req = pb::CopyFromDeviceRequest {
            identity: identity.encode().to_vec(),
            offset,
            len,
        };
        Ok(self
            .stub
            .copy_from_device(req)
            .await?
            .into_inner()
            .data
            .into())
    }

    /// Stages `data` on the worker under `id` (nonzero, unused in the
    /// session), in chunks of at most `chunk` bytes (at most
    /// [`strata_proto::STAGE_CHUNK_BYTES`]; keep them under the session's
    /// message limit), for a task that then names it: the bytes of a view
    /// too large for the task's message. Returns once the worker holds all
    /// of them.
    ///
    /// # Errors
    /// The worker's refusal (a bad id or length, its limit on staged bytes).
    ///
    /// # Cancel safety
    /// Dropped before it returns, the bytes are not staged (the worker gives
    /// back what arrived).
    pub async fn stage(
        &mut self,
        id: u64,
        data: bytes::Bytes,
        chunk: usize,
    ) -> Result<(), ClientError> {
        let total = data.len() as u64;
        let step = chunk.clamp(1, strata_proto::STAGE_CHUNK_BYTES);
        // Slices of the packed bytes, not copies.
        let chunks: Vec<pb::StageChunk> = (0..data.len().max(1))
            .step_by(step)
            .map(|at| pb::StageChunk {
                stage: if at == 0 { id } else { 0 },
                total: if at == 0 { total } else { 0 },
                data: data.slice(at..(at + step).min(data.len())),
            })
            .collect();
        self.stage_chunks(chunks).await
    }

    /// One `Stage` call with `chunks` exactly as given: what
    /// [`WorkerClient::stage`] sends, for a caller that cuts its own (and
    /// for tests of the worker's checks).
    ///
    /// # Errors
    /// The worker's refusal.
    pub async fn stage_chunks(&mut self, chunks: Vec<pb::StageChunk>) -> Result<(), ClientError> {
        self.stub.stage(tokio_stream::iter(chunks)).await?;
        Ok(())
    }

    /// Fetches the bytes the worker holds under `id` (a written view too
    /// large for its completion's message), once.
    ///
    /// # Errors
    /// The worker's refusal (no such bytes), a broken stream, or more than
    /// `expect` bytes.
    ///
    /// # Cancel safety
    /// Not cancel safe: the worker gives the bytes out once, and a dropped
    /// call loses them.
    pub async fn fetch(&mut self, id: u64, expect: u64) -> Result<bytes::Bytes, ClientError> {
        let mut stream = self
            .stub
            .fetch(pb::FetchRequest { stage: id })
            .await?
            .into_inner();
        let cap = usize::try_from(expect).unwrap_or(usize::MAX);
        let mut out =
            bytes::BytesMut::with_capacity(cap.min(strata_proto::MAX_INLINE_EXTENT as usize));
        while let Some(chunk) = stream.message().await? {
            if chunk.data.len() > cap - out.len() {
                return Err(ClientError::Protocol(format!(
                    "fetch {id}: the worker sent more than the {expect} bytes expected"
                )));
            }
            out.extend_from_slice(&chunk.data);
        }
        Ok(out.freeze())
    }

    /// Releases imported buffers; returns how many were imported.
    ///
    /// # Errors
    /// The worker's refusal.
    ///
    /// # Cancel safety
    /// As the unary calls (module docs): some, all or none may have been
    /// released, and the count is lost; releasing again is harmless.
    pub async fn release_imports(
        &mut self,
        identities: &[CanonicalIdentity],
    ) -> Result<u32, ClientError> {
        let req = pb::ReleaseImportRequest {
            identities: identities.iter().map(|i| i.encode().to_vec()).collect(),
        };
        Ok(self.stub.release_import(req).await?.into_inner().released)
    }

    /// The worker's counters.
    ///
    /// # Errors
    /// The worker's refusal.
    ///
    /// # Cancel safety
    /// Cancel safe: asking changes nothing; a dropped call loses only its
    /// answer.
    pub async fn stats(&mut self) -> Result<WorkerStats, ClientError> {
        Ok(WorkerStats::try_from(
            self.stub.stats(pb::StatsRequest {}).await?.into_inner(),
        )?)
    }

    /// What the worker knows of `session` (typically the one this client
    /// lost; see [`WorkerClient::handshake_after`]), asked within the
    /// current session.
    ///
    /// # Errors
    /// Before a handshake (no session to ask in), the worker's refusal, or
    /// a malformed reply.
    ///
    /// # Cancel safety
    /// Cancel safe: asking changes nothing; a dropped call loses only its
    /// answer.
    pub async fn session_state(&mut self, session: SessionId) -> Result<SessionState, ClientError> {
        let reply = self
            .stub
            .session_state(pb::SessionStateRequest { session: session.0 })
            .await?
            .into_inner();
        Ok(SessionState::try_from(reply)?)
    }

    /// Echoes `payload`: a bare round trip.
    ///
    /// # Errors
    /// The worker's refusal.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call loses only the echo.
    pub async fn ping(&mut self, payload: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        Ok(self
            .stub
            .ping(pb::PingRequest { payload })
            .await?
            .into_inner()
            .payload)
    }

    /// A stream of health beats every `interval_ms`.
    ///
    /// # Errors
    /// The worker's refusal.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call resets the stream it was opening and
    /// leaves the session as it was; call again.
    pub async fn health(&mut self, interval_ms: u32) -> Result<HealthWatch, ClientError> {
        let beats = self
            .stub
            .health(pb::HealthRequest { interval_ms })
            .await?
            .into_inner();
        Ok(HealthWatch { beats })
    }
}
