//! `strata-client`: the client of a strata worker, without the worker.
//!
//! A [`WorkerClient`] connects to a worker by [`Endpoint`] (`unix:PATH` or
//! `tcp:HOST:PORT`, with a bearer token and [`ClientTls`] for TCP), opens a
//! session ([`WorkerClient::handshake`]), and then drives it: the task
//! stream ([`TaskStream`], splittable into a [`TaskSender`] and
//! [`Completions`]), health beats ([`HealthWatch`]), device memory and
//! staging calls, and, for a worker on this host, the fd side channel
//! ([`FdChannel`]) that passes sealed memfds by SCM_RIGHTS so that the
//! worker maps host buffers instead of receiving their bytes.
//!
//! ```
//! use strata_client::{ClientError, Endpoint, WorkerClient};
//!
//! let ep: Endpoint = "unix:/nonexistent/strata-chip0.sock".parse().unwrap();
//! assert_eq!(ep.to_string(), "unix:/nonexistent/strata-chip0.sock");
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! let err = rt.block_on(WorkerClient::connect(&ep, None)).unwrap_err();
//! assert!(matches!(err, ClientError::Connect { .. }), "{err}");
//! ```
//!
//! A whole session, against a running `strata worker`:
//!
//! ```no_run
//! # async fn session() -> Result<(), strata_client::ClientError> {
//! use strata_client::{Endpoint, WorkerClient};
//!
//! let ep: Endpoint = "unix:/run/strata/chip0.sock".parse().unwrap();
//! let mut client = WorkerClient::connect(&ep, None).await?;
//! let hs = client.handshake().await?;
//! let _copy = hs.callable("copy", 1);
//! let _fds = client.fd_channel().await?; // Unix workers only
//! let (sender, mut completions) = client.open_tasks().await?.split();
//! // sender.send(&tasks).await?; then read completions.next().await? ...
//! drop(sender); // the worker finishes what it has and ends the session
//! while let Some(_batch) = completions.next().await? {}
//! # Ok(()) }
//! ```
//!
//! # Who uses it, and why it is its own crate
//!
//! The orchestrator's gRPC link (one per remote or local worker process),
//! the cross-process tests and benchmarks, and future drivers in other
//! hosts (a Python package, say) all need to talk to a worker; none of
//! them needs to *be* one. Inside `strata-worker` the client dragged the
//! server in with it: tonic's server side, the listeners, the token check,
//! the `strata worker` command line (clap, tracing-subscriber). Here it
//! depends on the protocol (`strata-proto`), the wire format
//! (`strata-wire`), and the transport it actually uses (tonic's client,
//! hyper-util's IO adapter for Unix sockets, `nix` for `sendmsg`).
//! `strata-worker` depends on this crate (its server reads the same
//! [`Endpoint`] and shares [`strata_proto::fdframe`] with [`FdChannel`]),
//! never the other way round, and re-exports these types under their old
//! paths.
//!
//! The session id is `strata-worker-core`'s [`SessionId`], re-exported
//! here. That crate is the worker's IO-free core (no tokio, only
//! `strata-wire` and `thiserror`), so depending on it costs the client
//! nothing it does not already build; moving the id down into
//! `strata-wire` would have moved a worker concept into the wire format
//! for no dependency gained.
//!
//! # Cancel safety
//!
//! Every async function documents what dropping its future does. In
//! short: stream reads ([`TaskStream::next`], [`Completions::next`],
//! [`HealthWatch::next`]) are cancel safe; sends queue a whole batch or
//! nothing; unary calls may or may not take effect on the worker, with the
//! reply lost; opening a session's task stream or fd channel, and an fd
//! import, are not cancel safe for the session (the worker ends it when
//! those channels close, and a cancelled import breaks its channel).
//!
//! `unsafe` lives in one place only, allowed where it is: taking
//! ownership of fds the kernel installed (`fdchan.rs`), as the worker's
//! end does with imports and this end with exported device memory.

#![deny(unsafe_code)]

mod bulk;
mod client;
mod endpoint;
mod error;
mod fdchan;
mod handshake;
pub mod offload;
mod stream;

pub use bulk::{Body, DataConnection};
pub use client::{ClientMeta, ClientTls, WorkerClient};
pub use endpoint::Endpoint;
pub use error::ClientError;
pub use fdchan::{Exported, FdChannel, Frame, read_fd_frame, write_fd_frame};
pub use handshake::Handshake;
pub use strata_boundary::SessionId;
pub use strata_proto::convert::{DataOffer, InstanceId, SessionState};
pub use stream::{Completions, HealthWatch, TaskSender, TaskStream};
