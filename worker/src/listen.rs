//! Listeners: a Unix socket (mode 0600, other uids refused by their peer
//! credentials) or a TCP socket.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use nix::unistd::geteuid;
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

/// Whether the peer of a Unix connection runs as our effective uid; logs
/// and returns `false` otherwise.
pub(crate) fn peer_is_us(stream: &UnixStream) -> bool {
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == geteuid().as_raw() => true,
        Ok(cred) => {
            warn!(peer_uid = cred.uid(), peer_pid = ?cred.pid(), "refused a Unix connection from another user");
            false
        }
        Err(e) => {
            warn!(error = %e, "refused a Unix connection whose credentials cannot be read");
            false
        }
    }
}

/// Binds a Unix socket at `path` with mode 0600. A stale socket file (one
/// nobody listens on) is replaced; anything else at the path is an error.
pub(crate) async fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if UnixStream::connect(path).await.is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is already served by another process", path.display()),
            ));
        }
        fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    // Peer credentials are checked on every connection as well, so the
    // moment between bind and chmod admits no one.
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}
