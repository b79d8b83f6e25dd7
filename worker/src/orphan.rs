//! A spawned worker whose driver is gone exits at once.
//!
//! A driver that spawns workers (`Cluster::builder().local(n)`, Python's
//! `Cluster(local=n)`) holds each one's stdin and starts it with
//! `--exit-with-stdin`. The pipe closes when the driver goes, however it
//! goes (even by SIGKILL), and nobody is left to receive what the worker's
//! kernels compute. So on end of file the worker:
//! 1. removes the files it made: its socket, its fd socket and its ready
//!    file; with `--driver-dir`, also its log `chip<N>.log` there and,
//!    when it is the last one out (nothing but the driver's marker
//!    [`DRIVER_MARKER`] is left), the marker and the folder;
//! 2. ends the process with `_exit(0)`: no orderly shutdown, no waiting
//!    for running kernels (a sleeping or spinning kernel included), no
//!    exit handlers (a Python worker's kernel may hold the GIL, and an
//!    exit handler could wait for it for ever).
//!
//! Stdin is read on a thread of its own, not on the async runtime, so a
//! runtime whose threads are all busy cannot delay the exit. The files
//! are registered once the sockets are bound ([`DriverWatch::serving`]):
//! a driver gone before that is noticed then, and the worker leaves at
//! the same point. A worker that fails to bind removes nothing (the path
//! may be another worker's).
//!
//! Removing the folder as the last one out is safe against a concurrent
//! last one: each worker removes its own files before it lists the
//! folder, so at least one of them sees the others' files gone.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tracing::info;

use crate::config::DRIVER_MARKER;

/// What the worker removes when its driver is gone.
#[derive(Debug)]
struct Owned {
    files: Vec<PathBuf>,
    driver_dir: Option<PathBuf>,
}

#[derive(Debug, Default)]
struct State {
    /// Registered once the sockets are bound.
    owned: Option<Owned>,
    /// Stdin closed before the files were registered.
    gone: bool,
}

/// Watches stdin for the driver's exit (`--exit-with-stdin`).
#[derive(Debug, Clone)]
pub(crate) struct DriverWatch {
    state: Arc<Mutex<State>>,
}

impl DriverWatch {
    /// Starts reading stdin on a thread of its own.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub(crate) fn start() -> std::io::Result<Self> {
        let watch = DriverWatch {
            state: Arc::default(),
        };
        let on_eof = watch.clone();
        std::thread::Builder::new()
            .name("strata-stdin".into())
            .spawn(move || {
                let mut stdin = std::io::stdin().lock();
                let mut buf = [0u8; 64];
                loop {
                    match stdin.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                on_eof.driver_gone();
            })?;
        Ok(watch)
    }

    /// Registers what to remove when the driver goes: `files` (sockets,
    /// ready file) and, with `driver_dir`, the worker's log `chip<chip>.log`
    /// there and the folder if it is the last one out. Leaves at once when
    /// the driver is already gone.
    pub(crate) fn serving(&self, mut files: Vec<PathBuf>, driver_dir: Option<&Path>, chip: u32) {
        if let Some(dir) = driver_dir {
            files.push(dir.join(format!("chip{chip}.log")));
        }
        let owned = Owned {
            files,
            driver_dir: driver_dir.map(Path::to_path_buf),
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.gone {
            leave(&owned);
        }
        state.owned = Some(owned);
    }

    fn driver_gone(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &state.owned {
            Some(owned) => leave(owned),
            // Not serving yet: `serving` leaves as soon as it is.
            None => state.gone = true,
        }
    }
}

/// Removes the worker's files (and the driver's folder when it is the
/// last one out), then ends the process.
fn leave(owned: &Owned) -> ! {
    info!("stdin closed: the driver is gone; exiting now");
    for f in &owned.files {
        let _ = std::fs::remove_file(f);
    }
    if let Some(dir) = &owned.driver_dir {
        remove_if_last(dir);
    }
    exit_now()
}

/// Removes the marker and `dir` when nothing else is left in it.
fn remove_if_last(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut others = 0usize;
    for e in entries {
        match e {
            Ok(e) if e.file_name() == DRIVER_MARKER => {}
            _ => others += 1,
        }
    }
    if others == 0 {
        let _ = std::fs::remove_file(dir.join(DRIVER_MARKER));
        let _ = std::fs::remove_dir(dir);
    }
}

/// Ends the process now, from any thread, whatever the others do.
#[allow(unsafe_code)]
fn exit_now() -> ! {
    // SAFETY: `_exit` takes a plain integer and never returns. It runs no
    // exit handlers, destructors or stdio flushes, so it touches no state
    // another thread may hold (a lock, the GIL, a half-written buffer):
    // the kernel ends every thread of the process at once. Nothing this
    // process writes needs flushing: the log is unbuffered stderr, and
    // the ready line was flushed when it was printed.
    unsafe { nix::libc::_exit(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_one_out_removes_the_marker_and_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(DRIVER_MARKER), "pid=1 start=1").unwrap();
        std::fs::write(d.join("chip1.log"), "").unwrap();
        remove_if_last(d);
        assert!(
            d.join(DRIVER_MARKER).exists(),
            "another worker's log is left"
        );
        std::fs::remove_file(d.join("chip1.log")).unwrap();
        remove_if_last(d);
        assert!(!d.exists(), "the last one out removes the folder");
    }
}
