//! What a worker is told at startup.

use std::path::PathBuf;

use strata_proto::DEFAULT_MAX_MESSAGE_BYTES;

/// Where a worker listens: the client's own [`strata_client::Endpoint`],
/// so that the address a worker prints is the one a client parses.
pub use strata_client::Endpoint;

pub use strata_boundary::DRIVER_MARKER;

/// Server-side TLS with client certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain of the worker.
    pub cert: PathBuf,
    /// PEM private key of the worker.
    pub key: PathBuf,
    /// PEM CA that client certificates must chain to.
    pub client_ca: PathBuf,
}

/// How TCP clients are authenticated. Unix-socket clients are
/// authenticated by their uid instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// A bearer token every call must carry (`authorization: Bearer …`).
    pub token: Option<String>,
    /// TLS with client certificates.
    pub tls: Option<TlsFiles>,
    /// Explicitly allow a TCP listener with neither.
    pub insecure: bool,
}

/// Everything a worker needs to start.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Which chip this worker owns (reported in the handshake).
    pub chip_id: u32,
    /// Device spec, such as `sim:mem=2GiB,lanes=2`.
    pub device_spec: String,
    /// Where to serve gRPC.
    pub listen: Endpoint,
    /// The fd side channel's socket (Unix listeners only); default: the
    /// listen path with `.fd` appended.
    pub fd_socket: Option<PathBuf>,
    /// Authentication of TCP clients.
    pub auth: Auth,
    /// Largest gRPC message accepted or sent.
    pub max_message_bytes: usize,
    /// Most tasks one session may have in flight; further tasks wait (the
    /// stream is not read) until some complete.
    pub max_in_flight: usize,
    /// A session that has not opened its task stream this long after its
    /// handshake is ended (a client that handshakes and goes away must not
    /// hold a session for ever).
    pub session_grace: std::time::Duration,
    /// A connection whose peer has not answered an HTTP/2 ping for this
    /// long is closed, ending its sessions (a driver cut off by the
    /// network, not just killed). Pings go every half of it.
    pub peer_timeout: std::time::Duration,
    /// Offer local clients a shared-memory ring for their tasks (Unix
    /// listeners only); when false, tasks always travel on the gRPC stream.
    pub ring: bool,
    /// The port of the data connections offered to TCP clients (a second
    /// listener on the gRPC listener's address, announced in the
    /// handshake) for large view bytes: `Some(0)` lets the system pick
    /// one, `None` offers none. Never offered under TLS: its frames are
    /// not encrypted, so a TLS worker keeps those bytes on the gRPC calls.
    pub data_port: Option<u16>,
}

impl WorkerConfig {
    /// A configuration with defaults for everything but the listen address.
    pub fn new(listen: Endpoint) -> Self {
        WorkerConfig {
            chip_id: 0,
            device_spec: "sim".into(),
            listen,
            fd_socket: None,
            auth: Auth::default(),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_in_flight: strata_worker_node::DEFAULT_MAX_IN_FLIGHT,
            session_grace: std::time::Duration::from_secs(30),
            peer_timeout: std::time::Duration::from_secs(10),
            ring: true,
            data_port: Some(0),
        }
    }

    /// The fd socket path, for Unix listeners.
    pub fn fd_socket_path(&self) -> Option<PathBuf> {
        match (&self.listen, &self.fd_socket) {
            (_, Some(p)) => Some(p.clone()),
            (Endpoint::Unix(p), None) => {
                let mut s = p.clone().into_os_string();
                s.push(".fd");
                Some(PathBuf::from(s))
            }
            (Endpoint::Tcp(_), None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fd_socket_defaults_to_the_listen_path_plus_fd() {
        let c = WorkerConfig::new("unix:/run/w".parse().unwrap());
        assert_eq!(c.fd_socket_path(), Some(PathBuf::from("/run/w.fd")));
        assert_eq!(
            WorkerConfig::new("tcp:127.0.0.1:1".parse().unwrap()).fd_socket_path(),
            None
        );
        let mut named = c.clone();
        named.fd_socket = Some("/run/other.fd".into());
        assert_eq!(named.fd_socket_path(), Some(PathBuf::from("/run/other.fd")));
    }
}

/// What this worker process offers its sessions beyond the node's calls,
/// fixed once it is bound: the service reports it in every handshake, the
/// fd channel consults it when a ring arrives.
#[derive(Debug, Clone)]
pub(crate) struct Offers {
    /// The fd side channel's socket (Unix listeners only).
    pub(crate) fd_socket: Option<PathBuf>,
    /// Whether sessions may move their tasks onto a shared-memory ring.
    pub(crate) ring: bool,
    /// The data connections' TCP port, when this worker offers them.
    pub(crate) data_port: Option<u16>,
    /// How long a session may go without opening its task stream.
    pub(crate) session_grace: std::time::Duration,
}
