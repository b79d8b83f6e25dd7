//! Where a worker listens, and so where a client connects.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a worker listens (or a client connects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl FromStr for Endpoint {
    type Err = String;

    /// `unix:PATH` or `tcp:HOST:PORT`.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(format!("{s:?}: unix: needs a socket path"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if let Some(addr) = s.strip_prefix("tcp:") {
            if let Ok(a) = addr.parse() {
                return Ok(Endpoint::Tcp(a));
            }
            // A host name: resolved now, first address.
            use std::net::ToSocketAddrs;
            return match addr.to_socket_addrs() {
                Ok(mut found) => found
                    .next()
                    .map(Endpoint::Tcp)
                    .ok_or_else(|| format!("{s:?}: tcp: {addr} resolves to no address")),
                Err(e) => Err(format!("{s:?}: tcp: needs HOST:PORT ({e})")),
            };
        }
        Err(format!("{s:?} is neither unix:PATH nor tcp:HOST:PORT"))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_print() {
        assert_eq!(
            "unix:/tmp/w.sock".parse(),
            Ok(Endpoint::Unix("/tmp/w.sock".into()))
        );
        assert_eq!(
            "tcp:127.0.0.1:0".parse::<Endpoint>().unwrap().to_string(),
            "tcp:127.0.0.1:0"
        );
        assert_eq!(
            "unix:/run/w".parse::<Endpoint>().unwrap().to_string(),
            "unix:/run/w"
        );
        assert!(
            "unix:"
                .parse::<Endpoint>()
                .unwrap_err()
                .contains("needs a socket path")
        );
        assert!(
            "tcp:localhost"
                .parse::<Endpoint>()
                .unwrap_err()
                .contains("HOST:PORT")
        );
        assert!("udp:1".parse::<Endpoint>().unwrap_err().contains("neither"));
    }
}
