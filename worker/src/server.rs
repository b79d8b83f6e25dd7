//! Starting, serving and stopping a worker.
//!
//! Shutdown protocol (SIGTERM or the caller's shutdown future):
//! 1. stop accepting connections and stop reading task streams (new tasks
//!    are not started);
//! 2. let every task already started complete and stream its completion;
//! 3. end the task and health streams, then every session (imports and
//!    device buffers released);
//! 4. remove the socket files and return.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use strata_chip_runtime::{Device, Kernel, Registry};
use strata_proto::pb::worker_server::WorkerServer;
use strata_proto::{CONNECTION_WINDOW, STREAM_WINDOW};
use strata_worker_node::{Limits, Node};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tracing::{error, info, warn};

use crate::auth::TokenCheck;
use crate::config::{Endpoint, Offers, WorkerConfig};
use crate::listen::{bind_unix, peer_is_us};
use crate::service::WorkerService;
use crate::{WorkerError, fdchan};

/// A worker being configured: its settings and its kernels.
pub struct Worker {
    config: WorkerConfig,
    kernels: Registry,
    /// A chip the caller opened itself, instead of the spec's.
    chip: Option<Arc<dyn Device>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .field("kernels", &self.kernels)
            .field("chip", &self.chip)
            .finish()
    }
}

enum Listener {
    Unix(tokio::net::UnixListener, PathBuf),
    Tcp(TcpListener),
}

/// How often a serving worker asks its chip whether it is lost.
const CHIP_WATCH: std::time::Duration = std::time::Duration::from_millis(100);

/// A worker whose sockets are bound and whose device is up: ready to serve.
pub struct BoundWorker {
    node: Arc<Node>,
    offers: Arc<Offers>,
    listener: Listener,
    fd_listener: Option<(tokio::net::UnixListener, PathBuf)>,
    /// The data connections' listener (TCP without TLS).
    data_listener: Option<TcpListener>,
    config: WorkerConfig,
    endpoint: Endpoint,
}

impl std::fmt::Debug for BoundWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundWorker")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Worker {
    /// A worker with the built-in kernels.
    pub fn new(config: WorkerConfig) -> Self {
        Worker {
            config,
            kernels: Registry::with_builtins(),
            chip: None,
        }
    }

    /// Adds a user kernel.
    ///
    /// # Errors
    /// When a different kernel with the same name and version is registered.
    pub fn kernel(mut self, kernel: Arc<dyn Kernel>) -> Result<Self, WorkerError> {
        self.kernels
            .register(kernel)
            .map_err(|e| WorkerError::Config(e.to_string()))?;
        Ok(self)
    }

    /// Replaces the kernel registry.
    pub fn kernels(mut self, kernels: Registry) -> Self {
        self.kernels = kernels;
        self
    }

    /// Serves on `chip`, a chip the caller opened (a [`Device`] of its
    /// own, or one wrapped), instead of opening the one
    /// [`WorkerConfig::device_spec`] names. It offers the kernels the
    /// chip [`runs`](Device::runs) and names the others in its handshake.
    pub fn chip(mut self, chip: Arc<dyn Device>) -> Self {
        self.chip = Some(chip);
        self
    }

    /// Checks the configuration, brings up the device and binds the sockets.
    ///
    /// # Errors
    /// [`WorkerError::Device`]: a bad device spec or a chip that cannot
    /// be opened (a CUDA chip without a driver names the missing
    /// library); an unauthenticated TCP listener without
    /// `insecure`, or a socket that cannot be bound.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes drops the worker; a socket
    /// it had bound is closed with it (a Unix socket file may be left
    /// behind, and the next bind on that path removes it).
    pub async fn bind(self) -> Result<BoundWorker, WorkerError> {
        let config = self.config;
        if let Endpoint::Tcp(addr) = &config.listen {
            let a = &config.auth;
            if a.token.is_none() && a.tls.is_none() {
                if !a.insecure {
                    return Err(WorkerError::Config(format!(
                        "refusing to listen on tcp:{addr} without authentication: give a token file or TLS files, or --insecure"
                    )));
                }
                warn!(%addr, "serving TCP without authentication (--insecure): anyone who can reach this port can run tasks");
            }
        }
        let device: Arc<dyn Device> = match self.chip {
            Some(chip) => chip,
            None => strata_chip_runtime::open(&config.device_spec).map_err(|source| {
                WorkerError::Device {
                    chip: config.chip_id,
                    source,
                }
            })?,
        };
        let (listener, endpoint) = match &config.listen {
            Endpoint::Unix(path) => {
                let l = bind_unix(path)
                    .await
                    .map_err(|e| WorkerError::Bind(format!("unix:{}: {e}", path.display())))?;
                (Listener::Unix(l, path.clone()), config.listen.clone())
            }
            Endpoint::Tcp(addr) => {
                let l = TcpListener::bind(addr)
                    .await
                    .map_err(|e| WorkerError::Bind(format!("tcp:{addr}: {e}")))?;
                let local = l
                    .local_addr()
                    .map_err(|e| WorkerError::Bind(e.to_string()))?;
                (Listener::Tcp(l), Endpoint::Tcp(local))
            }
        };
        // The data port: on the gRPC listener's address, for TCP workers
        // without TLS (its frames are not encrypted, so a TLS worker keeps
        // every byte on its TLS connection).
        let data_listener = match &endpoint {
            Endpoint::Tcp(addr) if config.auth.tls.is_none() && config.data_port.is_some() => {
                let port = config.data_port.unwrap_or(0);
                let l = TcpListener::bind((addr.ip(), port))
                    .await
                    .map_err(|e| WorkerError::Bind(format!("data port on {}: {e}", addr.ip())))?;
                Some(l)
            }
            _ => None,
        };
        let fd_listener = match config.fd_socket_path() {
            Some(path) => {
                let l = bind_unix(&path)
                    .await
                    .map_err(|e| WorkerError::Bind(format!("fd socket {}: {e}", path.display())))?;
                Some((l, path))
            }
            None => None,
        };
        let limits = Limits {
            max_message_bytes: config.max_message_bytes,
            max_in_flight: config.max_in_flight,
        };
        let node = Arc::new(Node::new(config.chip_id, device, self.kernels, limits));
        let offers = Arc::new(Offers {
            fd_socket: fd_listener.as_ref().map(|(_, p)| p.clone()),
            ring: config.ring,
            data_port: match &data_listener {
                Some(l) => Some(
                    l.local_addr()
                        .map_err(|e| WorkerError::Bind(e.to_string()))?
                        .port(),
                ),
                None => None,
            },
            session_grace: config.session_grace,
        });
        Ok(BoundWorker {
            node,
            offers,
            listener,
            fd_listener,
            data_listener,
            config,
            endpoint,
        })
    }
}

impl BoundWorker {
    /// Where clients connect (a TCP port 0 resolved to the real port).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The fd side channel's socket, for Unix listeners.
    pub fn fd_socket(&self) -> Option<&std::path::Path> {
        self.fd_listener.as_ref().map(|(_, p)| p.as_path())
    }

    /// The data connections' port, when this worker offers them.
    pub fn data_port(&self) -> Option<u16> {
        self.offers.data_port
    }

    /// The device's canonical spec.
    pub fn device_spec(&self) -> String {
        self.node.device.info().spec
    }

    /// Serves until `shutdown` resolves, then shuts down as the module docs
    /// describe.
    ///
    /// # Errors
    /// When the TLS files cannot be read or the server fails.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future stops serving at once, without
    /// the orderly shutdown (sessions see their streams break, tasks
    /// running on the chip finish with nobody to report to). Resolve
    /// `shutdown` instead and await the future to its end.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), WorkerError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let max = self.config.max_message_bytes;
        let svc = WorkerServer::new(WorkerService::new(
            Arc::clone(&self.node),
            Arc::clone(&self.offers),
            stop_rx.clone(),
        ))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
        let token = self
            .config
            .auth
            .token
            .as_deref()
            .filter(|_| matches!(self.endpoint, Endpoint::Tcp(_)));
        let svc = InterceptedService::new(svc, TokenCheck::new(token));
        // Large HTTP/2 windows: staged view bytes are megabytes, and the
        // 64 KiB default window stalls them on every round trip.
        let mut builder = Server::builder()
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            // Measured with strata-bench --scenario remote: 1 MiB frames
            // beat 256 KiB and 16 MiB ones (a 16 MiB frame is copied into
            // tonic's buffer only once all of it has arrived, so receiving
            // and copying no longer overlap: 48 MiB views went 1.3 -> 0.8
            // GB/s).
            .max_frame_size(Some(1 << 20))
            .http2_keepalive_interval(Some(self.config.peer_timeout / 2))
            .http2_keepalive_timeout(Some(self.config.peer_timeout / 2))
            .tcp_nodelay(true);
        if let (Endpoint::Tcp(_), Some(tls)) = (&self.endpoint, &self.config.auth.tls) {
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|e| WorkerError::Config(format!("{}: {e}", p.display())))
            };
            let identity = Identity::from_pem(read(&tls.cert)?, read(&tls.key)?);
            let cfg = ServerTlsConfig::new()
                .identity(identity)
                .client_ca_root(Certificate::from_pem(read(&tls.client_ca)?));
            builder = builder
                .tls_config(cfg)
                .map_err(|e| WorkerError::Config(format!("TLS: {e}")))?;
        }
        let router = builder.add_service(svc);

        let fd_task = self.fd_listener.map(|(l, path)| {
            let node = Arc::clone(&self.node);
            (
                tokio::spawn(fdchan::serve(l, node, self.offers.ring, stop_rx.clone())),
                path,
            )
        });
        let data_task = self.data_listener.map(|l| {
            info!(port = ?self.offers.data_port, "data connections offered");
            tokio::spawn(crate::bulk::serve(
                l,
                Arc::clone(&self.node),
                stop_rx.clone(),
            ))
        });
        // A chip that can run nothing more (a GPU context lost to a
        // fault) stops the worker as a shutdown would: the tasks in flight
        // have failed with the cause, and a new worker can take its place.
        let lost: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let watch = {
            let (device, lost) = (Arc::clone(&self.node.device), Arc::clone(&lost));
            async move {
                loop {
                    tokio::time::sleep(CHIP_WATCH).await;
                    if let Some(why) = device.lost() {
                        error!(cause = %why, "the chip is lost; stopping");
                        *lost
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
                        return;
                    }
                }
            }
        };
        let stop = async move {
            tokio::select! {
                () = shutdown => {}
                () = watch => {}
            }
            info!("shutting down: no new tasks; finishing those in flight");
            let _ = stop_tx.send(true);
        };
        let result = match self.listener {
            Listener::Unix(l, path) => {
                let incoming = UnixListenerStream::new(l).filter_map(|r| match r {
                    Ok(s) if peer_is_us(&s) => Some(Ok::<_, std::io::Error>(s)),
                    Ok(_) => None,
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        None
                    }
                });
                let r = router.serve_with_incoming_shutdown(incoming, stop).await;
                let _ = std::fs::remove_file(&path);
                r
            }
            Listener::Tcp(l) => {
                let incoming = TcpListenerStream::new(l).filter_map(|r| match r {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        Some(Ok::<_, std::io::Error>(s))
                    }
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        None
                    }
                });
                router.serve_with_incoming_shutdown(incoming, stop).await
            }
        };
        self.node.device.synchronize();
        self.node.end_all_sessions();
        if let Some(task) = data_task {
            task.abort();
        }
        if let Some((task, path)) = fd_task {
            task.abort();
            let _ = std::fs::remove_file(path);
        }
        let lost = lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(why) = lost {
            return Err(WorkerError::ChipLost(why));
        }
        result.map_err(|e| WorkerError::Serve(e.to_string()))
    }
}
